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


def test_a_run_sets_one_thread_for_its_products_only(monkeypatch):
    """runtime/execute.py: a host MatMul runs on one BLAS thread; a run whose host kernels
    are kernels.NO_PRODUCTS alone leaves the count alone; the caller's count is back after."""
    from types import SimpleNamespace

    import numpy as np

    from rkc.ir.program import Program, Step, TensorInfo
    from rkc.runtime import kernels
    from rkc.runtime.execute import run_program

    seen = []
    real = dict(kernels.KERNELS)
    for op in ("MatMul", "Softmax"):
        monkeypatch.setitem(kernels.KERNELS, op, lambda *a, _op=op, **k: (seen.append((_op, _threads())),
                                                                         real[_op](*a, **k))[1])
    tensors = {n: TensorInfo(n, [2, 2], "fp32") for n in ("a", "p", "s")}
    model = SimpleNamespace(tensors=tensors, bos={}, device=None, host_regions={}, schedules={},
                            prepared_submits={})
    soft = Program("s", ["a"], ["s"], [Step("cpu", "s", op="Softmax", inputs=["a"], outputs=["s"])])
    both = Program("m", ["a"], ["s"], [Step("cpu", "p", op="MatMul", inputs=["a", "a"], outputs=["p"]),
                                       Step("cpu", "s", op="Softmax", inputs=["p"], outputs=["s"])])
    before = _threads()
    a = np.eye(2, dtype=np.float32)
    with blas.threads(2):
        run_program(model, soft, {"a": a})
        run_program(model, both, {"a": a})
        assert set(_threads()) == {2}
    assert _threads() == before
    assert [(op, set(t)) for op, t in seen] == [("Softmax", {2}), ("MatMul", {1}), ("Softmax", {1})]
    assert "Softmax" in kernels.NO_PRODUCTS and "MatMul" not in kernels.NO_PRODUCTS
