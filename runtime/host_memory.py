"""How the process's allocator keeps the host tensors' memory between runs.

An ONNX program's CPU steps make fresh arrays of megabytes every inference
(a 24x240x240 float32 map is 5.5 MB). glibc serves such sizes with mmap or
from the top of its heap and hands them back to the kernel when freed
(munmap, or trimming the heap's top), so the next inference faults every
page in again, zero-filled: on the null device that was 27% of PP-OCR det's
host time (51 -> 38 ms CPU in one run, docs/notes/2026-12-06-vision-host-time-3.md).
`keep_freed_memory` raises glibc's mmap threshold and trim threshold
(mallopt, as MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ would at start-up)
so that blocks below KEPT_BLOCK_BYTES come from the heap and freed memory
stays mapped for the next run: the process keeps its peak working set
resident (what an inference server does anyway) and larger blocks (an LLM's
weights) are still mapped and unmapped on their own. Other C libraries: no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
KEPT_BLOCK_BYTES = 32 << 20  # glibc's own ceiling for its dynamic mmap threshold on 64-bit
KEPT_FREE_BYTES = 256 << 20


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Set the thresholds once per process; True if the C library took them."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEPT_BLOCK_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES))
