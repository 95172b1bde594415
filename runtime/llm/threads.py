"""The host kernels' threads: one pool shared by every many-row kernel of the
LLM plans (runtime/llm/fused_rows.py, prefill_attention.py), as wide as the
machine's cores up to the RK3588's four big ones. A kernel is a compiled
(numba, nogil) function over a range of items (tiles of rows, rows, head
blocks), called on disjoint ranges from the pool's threads at once. Plain
compiled loops over a range keep their vectorisation, which numba's
parallel=True lowering lost here (a 128 x 8960 FFN stretch: 14.7 ms in one
serial call, 21.5 ms through prange on one thread)."""

from __future__ import annotations

import itertools
import os
import threading
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


class _Blocks:
    """The blocks of one over_blocks call: taken in order by whichever thread
    asks first (next() on a count is one step under the GIL); done counted
    under a lock, the caller woken when the last one is."""

    def __init__(self, blocks: int) -> None:
        self.blocks, self.next = blocks, itertools.count()
        self.done, self.lock, self.finished = 0, threading.Lock(), threading.Event()
        self.error: BaseException | None = None

    def work(self, run: Callable[[int], None]) -> None:
        while (b := next(self.next)) < self.blocks:
            try:
                if self.error is None:
                    run(b)
            except BaseException as e:  # raised in the caller's thread
                self.error = e
            with self.lock:
                self.done += 1
                if self.done == self.blocks:
                    self.finished.set()


def over_blocks(run: Callable[[int], None], blocks: int, threads: int = THREADS) -> None:
    """run(b) for b in range(blocks), each block run by whichever thread takes
    it first: the caller's thread starts at once, up to threads - 1 of the
    pool's join when they wake. Returns when every block is done, waiting only
    for blocks a helper has started: a helper that wakes late (a busy
    machine's other core, a wake-up slower than the work) finds none left and
    costs the caller nothing but the hand-off, where over_parts' fixed ranges
    wait for it (decode attention: a few blocks of keys a layer, ~100 us)."""
    if blocks <= 1 or threads <= 1:
        for b in range(blocks):
            run(b)
        return
    state = _Blocks(blocks)
    for _ in range(min(threads, blocks) - 1):
        pool().submit(state.work, run)
    state.work(run)
    state.finished.wait()
    if state.error is not None:
        raise state.error
