"""Compiled (numba) 2-D gather of map positions: a nearest Resize of [N, C, H,
W] maps (a detector's upsampling), out[n, c, i, j] = x[n, c, rows[i], cols[j]],
channels the innermost loop (a feature map's atom lanes, contiguous: runtime/
feature_edges.py reads and writes its planes in place), output rows shared
by the host threads (runtime/llm/threads.py). Exact: values are copied.
`cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.kernels.threads import over_rows


@njit(cache=True, nogil=True)
def _gather_2d(x, rows, cols, out, lo, hi):
    """x [N, H, W, C] -> out [N, len(rows), len(cols), C], output rows [lo, hi) of N * OH."""
    oh, ow, c = out.shape[1], out.shape[2], out.shape[3]
    for job in range(lo, hi):
        p, i = job // oh, job % oh
        src, dst = x[p, rows[i]], out[p, i]
        for j in range(ow):
            a, b = src[cols[j]], dst[j]
            for lane in range(c):
                b[lane] = a[lane]


def gather_2d(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """[N, C, H, W] (any strides) -> [N, C, len(rows), len(cols)], channels
    innermost in memory (the layout of a feature map's planes). fp16 is moved
    as its int16 bits (numba has no fp16)."""
    if x.dtype == np.float16:
        return gather_2d(x.view(np.int16), rows, cols).view(np.float16)
    out = np.empty((x.shape[0], len(rows), len(cols), x.shape[1]), x.dtype)
    args = (x.transpose(0, 2, 3, 1), rows.astype(np.int64), cols.astype(np.int64), out)
    over_rows(lambda lo, hi: _gather_2d(*args, lo, hi), out.shape[0] * out.shape[1], out.size)
    return out.transpose(0, 3, 1, 2)
