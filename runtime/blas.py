"""How many BLAS threads the process's numpy products run on.

The host's work around the NPU (attention over the KV cache, the rotation's
block mixing, CPU-placed products) is made of small products: waking
OpenBLAS's other threads for them costs more than they share, and on a busy
machine a waiting thread spins for milliseconds (Gemma 3 270M decode at
position 512 on the 2-core development machine, null device: attention
4.5 ms per layer on the default pool, 0.48 ms on one thread). A float
product's bits also depend on the thread count (sgemm's summation order),
so host kernels run on one thread everywhere (`one_thread`), and the
simulator names its own count for every product (`threads`) rather than
inheriting whatever the caller set.
"""

from __future__ import annotations

from functools import lru_cache

import numpy  # noqa: F401  (loads OpenBLAS before threadpoolctl looks for it)
from threadpoolctl import ThreadpoolController


@lru_cache(maxsize=1)
def controller() -> ThreadpoolController:
    return ThreadpoolController()


@lru_cache(maxsize=1)
def _libraries() -> tuple:
    return tuple(lib for lib in controller().lib_controllers if lib.user_api == "blas")


@lru_cache(maxsize=1)
def pool_size() -> int:
    """The BLAS pool's size when rkc first looked (the process's default)."""
    return max([lib.num_threads for lib in _libraries()] or [1])


class _Threads:
    """Context setting the BLAS libraries to `n` threads and restoring them
    (straight through threadpoolctl's per-library controllers: ~1 us, where
    its general `limit` context takes several)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.saved: list[int] = []

    def __enter__(self) -> "_Threads":
        pool_size()  # recorded before the first change
        libs = _libraries()
        self.saved = [lib.num_threads for lib in libs]
        for lib in libs:
            lib.set_num_threads(self.n)
        return self

    def __exit__(self, *exc) -> None:
        for lib, n in zip(_libraries(), self.saved):
            lib.set_num_threads(n)


def one_thread() -> _Threads:
    """Host kernels' context: BLAS on one thread."""
    return _Threads(1)


def threads(n: int | None = None) -> _Threads:
    """BLAS on `n` threads (default: the process's default pool)."""
    return _Threads(pool_size() if n is None else n)
