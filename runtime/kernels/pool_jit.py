"""Compiled (numba) 2-D max pooling: the CPU op a CNN most often keeps (a
detector's SPPF, ResNet's stem pool, which stock rocket cannot finish on the
PPU). numpy's window reduction over a strided view cost ~50 ms for ResNet-50's
3x3/2 pool of a 64x112x112 map; this walks each window directly, output rows
shared by the host threads (runtime/llm/threads.py), and reads int8 and fp16 as well as float (a max commutes with
int8's monotone dequantization, so an int8 program pools its integers). On an
NPU feature map (runtime/feature_edges.py) the channels of an atom are the
innermost loop: 16 int8 or 8 fp16 lanes at a time.

A maximum is exact, so the result is numpy's element for element (NaN
propagates as numpy's max does). runtime/kernels/conv.py's `max_pool` is the
one entry point; it calls this for 2-D inputs of the dtypes numba compiles.
`cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.llm.threads import over_ranges

DTYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32,
                                         np.int64))


@njit(cache=True, nogil=True)
def _taps(o, stride, pad, k, dil, size):
    """The window taps [lo, hi) of output position o that fall inside the map."""
    start = o * stride - pad
    lo = 0 if start >= 0 else (-start + dil - 1) // dil
    hi = min(k, (size - 1 - start) // dil + 1) if size - 1 - start >= 0 else 0
    return start, lo, max(hi, lo)


@njit(cache=True, nogil=True)
def _max_pool_2d(x, low, kh, kw, sy, sx, dy, dx, pt, pl, out, lo, hi):
    """x [P, H, W, L] -> out [P, OH, OW, L] for output rows [lo, hi) of P * OH:
    windows over (H, W), lanes L element-wise (the innermost loop, contiguous in
    a feature map: vectorised)."""
    h, w, lanes = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    for job in range(lo, hi):
        p, oy = job // oh, job % oh
        y0, ky0, ky1 = _taps(oy, sy, pt, kh, dy, h)
        for ox in range(ow):
            x0, kx0, kx1 = _taps(ox, sx, pl, kw, dx, w)
            dst = out[p, oy, ox]
            for lane in range(lanes):
                dst[lane] = low
            for ky in range(ky0, ky1):
                row = x[p, y0 + ky * dy]
                for kx in range(kx0, kx1):
                    src = row[x0 + kx * dx]
                    for lane in range(lanes):
                        v, cur = src[lane], dst[lane]
                        # a NaN wins and stays, as in numpy's max (always false for integers)
                        dst[lane] = v if (v > cur or v != v) and cur == cur else cur


def max_pool_2d(x: np.ndarray, low, kernel, strides, dilations, begin, out_hw) -> np.ndarray:
    """[N, C, H, W] -> [N, C, *out_hw]: each window's maximum, positions outside
    the map (padding, ceil-mode overhang) read as `low`. Any strides; the
    channels are the kernel's lanes and the result's innermost axis (a feature
    map's planes [C1, C2, H, W] are read in place and come out alike).
    fp16 is pooled as int16 keys that order as the values do (numba has no fp16)."""
    if x.dtype == np.float16:
        keys = max_pool_2d(half_keys(x), half_keys(np.asarray(low, np.float16)), kernel, strides, dilations,
                           begin, out_hw)
        return (keys ^ ((keys >> 15) & np.int16(0x7FFF))).view(np.float16)  # a key's own inverse
    n = x.shape[0]
    # channels innermost (a copy unless they already are): the lanes of the kernel
    lanes = x.transpose(0, 2, 3, 1)
    out = np.empty((n, *out_hw, x.shape[1]), x.dtype)
    args = (lanes, x.dtype.type(low), *kernel, *strides, *dilations, *begin, out)
    over_ranges(lambda lo, hi: _max_pool_2d(*args, lo, hi), out.shape[0] * out.shape[1])
    return out.transpose(0, 3, 1, 2)


def half_keys(x: np.ndarray) -> np.ndarray:
    """fp16 values -> int16 keys in the values' order: a negative value's
    magnitude bits flipped (the same flip maps a key back). Every NaN becomes
    the positive quiet NaN, above +inf, so a window with a NaN pools to NaN as
    numpy's max does."""
    bits = np.asarray(x).view(np.int16)
    keys = bits ^ ((bits >> 15) & np.int16(0x7FFF))
    return np.where((bits & np.int16(0x7FFF)) > np.int16(0x7C00), np.int16(0x7E00), keys)
