"""Compiled (numba) per-tensor int8 quantization between a float32 map and an
NPU feature map [C1, H, W, C2] (ir/npu/layout.py): an int8 model's input and
outputs at its first and last segment, and every int8 <-> fp16 edge a
mixed-precision program crosses through the host, with runtime/kernels/quant.py's
arithmetic (float64, rounding half to even, saturating), rows shared by the
host threads (runtime/llm/threads.py).
Each row is computed contiguously (the arithmetic vectorises) and then moved
between the channel rows and the atoms' lanes. runtime/feature_edges.py calls
them; `cache=True`: a machine compiles them once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.llm.threads import over_ranges


def quantize_into_feature(x: np.ndarray, scale: float, zero_point: int, fm: np.ndarray) -> None:
    """fm[c // C2, y, i, c % C2] = saturate(rint(x[c, y, i] / scale) + zero_point)
    for x [C, H, W] float32; channels past C are zero."""
    over_ranges(lambda lo, hi: _quantize_lines(x, scale, zero_point, fm, lo, hi), fm.shape[0] * fm.shape[1])


def dequantize_feature(fm: np.ndarray, scale: float, zero_point: int, out: np.ndarray) -> None:
    """out[c, y, i] = float32((fm[c // C2, y, i, c % C2] - zero_point) * scale)
    for out [C, H, W]."""
    over_ranges(lambda lo, hi: _dequantize_lines(fm, scale, zero_point, out, lo, hi), fm.shape[0] * fm.shape[1])


@njit(cache=True, nogil=True)
def _quantize_lines(x, scale, zero_point, fm, lo, hi):
    c, h, w = x.shape
    c2 = fm.shape[3]
    zp = np.float64(zero_point)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        rows = np.zeros((c2, w), np.int8)
        for b in range(n):
            src, dst = x[a * c2 + b, y], rows[b]
            for i in range(w):
                q = np.rint(np.float64(src[i]) / scale) + zp
                dst[i] = np.int8(min(max(q, -128.0), 127.0))
        atoms = fm[a, y]
        for i in range(w):
            for b in range(c2):
                atoms[i, b] = rows[b, i]


@njit(cache=True, nogil=True)
def _dequantize_lines(fm, scale, zero_point, out, lo, hi):
    c, h, w = out.shape
    c2 = fm.shape[3]
    zp = np.float64(zero_point)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        rows = np.empty((c2, w), np.int8)
        atoms = fm[a, y]
        for i in range(w):
            for b in range(c2):
                rows[b, i] = atoms[i, b]
        for b in range(n):
            src, dst = rows[b], out[a * c2 + b, y]
            for i in range(w):
                dst[i] = np.float32((np.float64(src[i]) - zp) * scale)
