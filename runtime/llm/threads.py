"""The host kernels' threads: one pool shared by every many-row kernel of the
LLM plans (runtime/llm/fused_rows.py, prefill_attention.py), as wide as the
machine's cores up to the RK3588's four big ones. A kernel is a compiled
(numba, nogil) function over a range of items (tiles of rows, rows, head
blocks), called on disjoint ranges from the pool's threads at once. Plain
compiled loops over a range keep their vectorisation, which numba's
parallel=True lowering lost here (a 128 x 8960 FFN stretch: 14.7 ms in one
serial call, 21.5 ms through prange on one thread)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

THREADS = max(1, min(4, os.cpu_count() or 1))  # the board's 4 A76 cores (2 on this build machine)
_pool: list[ThreadPoolExecutor] = []
# values: a smaller lone kernel call runs on the caller's thread alone. Measured on pp128 (CPU of the process
# and of the caller's thread): 128 x 1024 (Gemma 3 270M's q) gained nothing from a second thread, 128 x 1536
# (Qwen2.5-1.5B's q and attention output, ~0.9 ms each) took ~11 ms a chunk off the caller's thread
SHARED_WORK = 3 << 16


def threads_for(values: int) -> int:
    """Threads for a lone call over `values` values: below SHARED_WORK the
    pool's hand-off costs about what the second core saves (Gemma 3 270M's
    k and v edges, 128 x 256 values: tens of microseconds either way)."""
    return THREADS if values >= SHARED_WORK else 1


def pool() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(THREADS, thread_name_prefix="rkc-host"))
    return _pool[0]


def over_ranges(run: Callable[[int, int], None], items: int, threads: int = THREADS) -> None:
    """run(lo, hi) over [0, items) in up to `threads` contiguous ranges at once;
    returns when all are done (an exception in one is raised here)."""
    over_parts(lambda part, lo, hi: run(lo, hi), items, threads)


def over_parts(run: Callable[[int, int, int], None], items: int, parts: int) -> int:
    """run(part, lo, hi) for part = 0.. over [0, items) cut into up to `parts`
    contiguous ranges (at most THREADS at once: a part's buffers are its own);
    returns the number of parts run."""
    parts = max(1, min(parts, items))
    if parts == 1:
        run(0, 0, items)
        return 1
    bounds = [items * i // parts for i in range(parts + 1)]
    futures = [pool().submit(run, i + 1, lo, hi) for i, (lo, hi) in enumerate(zip(bounds[1:-1], bounds[2:]))]
    run(0, bounds[0], bounds[1])  # the caller's thread takes the first range
    for f in futures:
        f.result()
    return parts


def each(run: Callable[[object], None], jobs: list, threads: int = THREADS) -> None:
    """run(job) for every job, shared among up to `threads` threads: the
    jobs dealt round-robin into one list per thread (neighbouring jobs, often
    of similar cost, on different threads), the caller's thread running the
    first list. One hand-off per thread, not per job (the pool's per-job
    queue and wake-up cost ~20 us of CPU each, most of a small job's)."""
    parts = min(threads, len(jobs))
    if parts <= 1:
        for job in jobs:
            run(job)
        return

    def run_part(part: int, lo: int, hi: int) -> None:
        for job in jobs[part::parts]:
            run(job)
    over_parts(run_part, parts, parts)
