"""How many host threads a compiled kernel over a map uses: the pool of
runtime/llm/threads.py for a map of at least PARALLEL_ELEMENTS, the caller's
thread alone below that. Handing a small map's rows to a second thread costs
more CPU than it saves: Inception v1 (maps of 6x6 to 112x112) took 14.4 ms CPU
per inference with every kernel on 2 threads and 12.2 ms on one, YOLOv8n 4.2
and 3.7 (2 cores shared by several processes, docs/notes/2026-12-06-vision-host-time-3.md)."""

from __future__ import annotations

from typing import Callable

from rkc.runtime.llm.threads import THREADS, over_ranges

PARALLEL_ELEMENTS = 1 << 18  # ~1 MB of float32: a few hundred microseconds of work


def threads_for(elements: int) -> int:
    return THREADS if elements >= PARALLEL_ELEMENTS else 1


def over_rows(run: Callable[[int, int], None], rows: int, elements: int) -> None:
    """run(lo, hi) over [0, rows) as over_ranges does, on threads_for(elements) threads."""
    over_ranges(run, rows, threads_for(elements))
