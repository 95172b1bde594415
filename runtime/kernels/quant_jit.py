"""Compiled (numba) per-tensor int8 quantization between a float32 map and an
NPU feature map [C1, H, W, C2] (ir/npu/layout.py): an int8 model's input and
outputs at its first and last segment, with runtime/kernels/quant.py's
arithmetic (float64, rounding half to even, saturating), threads over rows.
runtime/feature_edges.py calls them; `cache=True`: a machine compiles them once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True, parallel=True)
def quantize_into_feature(x, scale, zero_point, fm):
    """fm[c // C2, y, i, c % C2] = saturate(rint(x[c, y, i] / scale) + zero_point)
    for x [C, H, W] float32; channels past C are zero."""
    c, h, w = x.shape
    c1, _, _, c2 = fm.shape
    zp = np.float64(zero_point)
    for line in prange(c1 * h):
        a, y = line // h, line % h
        for b in range(c2):
            j = a * c2 + b
            if j < c:
                src = x[j, y]
                for i in range(w):
                    q = np.rint(np.float64(src[i]) / scale) + zp
                    fm[a, y, i, b] = np.int8(min(max(q, -128.0), 127.0))
            else:
                for i in range(w):
                    fm[a, y, i, b] = np.int8(0)


@njit(cache=True, nogil=True, parallel=True)
def dequantize_feature(fm, scale, zero_point, out):
    """out[c, y, i] = float32((fm[c // C2, y, i, c % C2] - zero_point) * scale)
    for out [C, H, W]."""
    c, h, w = out.shape
    c2 = fm.shape[3]
    zp = np.float64(zero_point)
    for line in prange(c * h):
        j, y = line // h, line % h
        a, b = j // c2, j % c2
        dst = out[j, y]
        for i in range(w):
            dst[i] = np.float32((np.float64(fm[a, y, i, b]) - zp) * scale)
