"""How many host threads a compiled kernel over a map uses: one more thread of
the pool (runtime/llm/threads.py) per ELEMENTS_PER_THREAD elements of the map,
the caller's thread alone below twice that. A second thread is not free: the
hand-off (submit, wake the worker, wait for its result) costs ~12 us of CPU per
call, and a memory-bound pass split over two cores pays another 10-20 % of its
CPU time (each half's lines are cold in the other core's caches, the halves share
DRAM). Measured per call, process CPU, 1 vs 2 threads in one process, x86 here
(docs/notes/2026-12-06-yolo-resnet-host.md, 2026-12-06 h38v): fp16 atoms into rows,
409,600 elements 0.30 -> 0.33 ms, a uint8 image into 640x640 fp16 atoms
(3.3 M elements) 0.27 -> 0.32 ms; Inception v1 (maps of 6x6 to 112x112) 14.4 ms
with every kernel on 2 threads and 12.2 on one, YOLOv8n 4.2 and 3.7
(2026-12-06-vision-host-time-3.md). So a thread is worth its cost only for a
share of a few hundred microseconds of work: 2 M elements, ~0.2-0.7 ms of a pass."""

from __future__ import annotations

from typing import Callable

from rkc.runtime.llm.threads import THREADS, over_ranges

ELEMENTS_PER_THREAD = 1 << 21  # ~4-8 MB moved: a few hundred microseconds of a memory-bound pass


def threads_for(elements: int) -> int:
    return max(1, min(THREADS, elements // ELEMENTS_PER_THREAD))


def over_rows(run: Callable[[int, int], None], rows: int, elements: int) -> None:
    """run(lo, hi) over [0, rows) as over_ranges does, on threads_for(elements) threads
    (one: called here, straight: the small maps' kernels are a few microseconds)."""
    threads = threads_for(elements)
    if threads == 1:
        run(0, rows)
        return
    over_ranges(run, rows, threads)
