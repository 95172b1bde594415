"""runtime/blas.py: host kernels' one-thread context and the simulator's named
pool set the BLAS libraries as they say and restore what was there."""

from __future__ import annotations

from rkc.runtime import blas


def _threads() -> list[int]:
    return [lib.num_threads for lib in blas.controller().lib_controllers if lib.user_api == "blas"]


def test_one_thread_inside_and_the_caller_s_count_after():
    before = _threads()
    assert before, "numpy's BLAS not found by threadpoolctl"
    with blas.one_thread():
        assert set(_threads()) == {1}
        with blas.threads():  # the simulator's products name the default pool
            assert set(_threads()) == {blas.pool_size()}
        assert set(_threads()) == {1}
    assert _threads() == before
