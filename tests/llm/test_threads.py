"""runtime/llm/threads.py: every item of a range run exactly once, in
contiguous ranges shared among the threads (numbered, for per-part buffers); a failure in any range raised to
the caller; jobs all run."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rkc.runtime.llm.threads import each, over_parts, over_ranges


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
