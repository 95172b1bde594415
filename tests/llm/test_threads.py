"""runtime/llm/threads.py: every item of a range run exactly once, in
contiguous ranges shared among the threads (numbered, for per-part buffers); a failure in any range raised to
the caller; jobs all run; blocks taken by whichever thread is free, the caller never waiting for a helper
that has not started one."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rkc.runtime.llm.threads import THREADS, each, over_blocks, over_parts, over_ranges, pool


@pytest.mark.parametrize("items", [0, 1, 2, 3, 7, 100])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_over_ranges_covers_each_item_once(items, threads):
    seen = np.zeros(items, np.int64)
    names = set()

    def run(lo, hi):
        assert 0 <= lo <= hi <= items
        seen[lo:hi] += 1
        names.add(threading.current_thread().name)
    over_ranges(run, items, threads)
    assert (seen == 1).all()
    assert len(names) <= max(1, min(threads, items))


@pytest.mark.parametrize("items,parts", [(0, 2), (1, 2), (5, 1), (9, 2), (9, 4), (3, 8)])
def test_over_parts_numbers_its_ranges(items, parts):
    """Each part's index is its own (0.. in order of the ranges: per-part
    buffers are not shared), the ranges cover each item once, and the count
    of parts run is returned."""
    seen = np.zeros(items, np.int64)
    ranges = {}

    def run(part, lo, hi):
        seen[lo:hi] += 1
        ranges[part] = (lo, hi)
    n = over_parts(run, items, parts)
    assert n == max(1, min(parts, items)) and sorted(ranges) == list(range(n))
    assert (seen == 1).all()
    assert [ranges[i][0] for i in range(n)] == sorted(ranges[i][0] for i in range(n))


def test_a_failing_range_is_raised():
    def run(lo, hi):
        if hi == 10:
            raise ValueError("last range")
    with pytest.raises(ValueError, match="last range"):
        over_ranges(run, 10, 2)


def test_each_runs_every_job():
    done = []
    each(done.append, list(range(9)), 2)
    assert sorted(done) == list(range(9))


@pytest.mark.parametrize("blocks", [0, 1, 2, 5, 17])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_over_blocks_runs_each_block_once_before_returning(blocks, threads):
    done = np.zeros(blocks, np.int64)

    def run(b):
        time.sleep(0.001 * (b % 3))  # blocks of unequal length
        done[b] += 1
    over_blocks(run, blocks, threads)
    assert (done == 1).all()


def test_over_blocks_does_not_wait_for_a_late_helper():
    """With every pool thread busy (a helper that cannot wake), the caller
    runs every block itself and returns; the helper's job, when it runs
    later, finds no block left."""
    release = threading.Event()
    held = [pool().submit(release.wait) for _ in range(THREADS)]
    try:
        ran = []
        over_blocks(lambda b: ran.append((b, threading.current_thread().name)), 6, 2)
        assert sorted(b for b, _ in ran) == list(range(6))
        assert {name for _, name in ran} == {threading.current_thread().name}
    finally:
        release.set()
        for f in held:
            f.result()
    # every pool thread at a barrier at once: the jobs queued before (the stale helper's) have finished
    barrier = threading.Barrier(THREADS)
    for f in [pool().submit(barrier.wait, 10) for _ in range(THREADS)]:
        f.result()
    assert len(ran) == 6


def test_a_failing_block_is_raised():
    def run(b):
        if b == 3:
            raise ValueError("block 3")
    with pytest.raises(ValueError, match="block 3"):
        over_blocks(run, 5, 2)
