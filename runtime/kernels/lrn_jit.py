"""Compiled (numba) part of LRN (runtime/kernels/conv.py's `lrn`): each
channel's window sum of squares, scaled and offset, in one pass over the map
(numpy took nine: a squared copy, a slice-by-slice sum, the scale and the
offset), channels shared by the host threads (runtime/llm/threads.py).
float32 (or float64) as its input; the power and the product stay numpy's
(vectorised). `cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.kernels.threads import over_rows


@njit(cache=True, nogil=True, fastmath=False)
def _window_sums(x, below, above, scale, bias, out, lo, hi):
    """out[n, c] = bias + scale * sum of x[n, j]^2 over j in [c - below, c + above]
    (clipped to the channels), for the (n, c) planes [lo, hi) of N * C; x and out [N, C, P]."""
    c_count, p_count = x.shape[1], x.shape[2]
    for job in range(lo, hi):
        n, c = job // c_count, job % c_count
        dst = out[n, c]
        for p in range(p_count):
            dst[p] = 0
        for j in range(max(0, c - below), min(c_count - 1, c + above) + 1):
            src = x[n, j]
            for p in range(p_count):
                dst[p] += src[p] * src[p]
        for p in range(p_count):
            dst[p] = bias + scale * dst[p]


def window_sums(x: np.ndarray, below: int, above: int, scale, bias) -> np.ndarray:
    """x [N, C, ...] contiguous -> bias + scale * (each channel's window sum of squares), x's dtype."""
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    out = np.empty_like(flat)
    work = x.dtype.type
    over_rows(lambda lo, hi: _window_sums(flat, below, above, work(scale), work(bias), out, lo, hi),
              flat.shape[0] * flat.shape[1], flat.size)
    return out.reshape(x.shape)
