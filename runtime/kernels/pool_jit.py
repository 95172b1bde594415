"""Compiled (numba) 2-D max pooling: the CPU op a CNN most often keeps (a
detector's SPPF, ResNet's stem pool, which stock rocket cannot finish on the
PPU). numpy's window reduction over a strided view cost ~50 ms for ResNet-50's
3x3/2 pool of a 64x112x112 map; this walks each window directly, threads over
(image, channel) planes, and reads int8 as well as float (a max commutes with
int8's monotone dequantization, so an int8 program pools its integers).

A maximum is exact, so the result is numpy's element for element (NaN
propagates as numpy's max does). runtime/kernels/conv.py's `max_pool` is the
one entry point; it calls this for 2-D inputs of the dtypes numba compiles.
`cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64))


@njit(cache=True, nogil=True)
def _taps(o, stride, pad, k, dil, size):
    """The window taps [lo, hi) of output position o that fall inside the map."""
    start = o * stride - pad
    lo = 0 if start >= 0 else (-start + dil - 1) // dil
    hi = min(k, (size - 1 - start) // dil + 1) if size - 1 - start >= 0 else 0
    return start, lo, max(hi, lo)


@njit(cache=True, nogil=True)
def _has_nan(plane):
    for v in plane.flat:
        if v != v:
            return True
    return False


@njit(cache=True, nogil=True, parallel=True)
def _max_pool_2d(x, low, kh, kw, sy, sx, dy, dx, pt, pl, out):
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for plane in prange(n * c):
        i, ch = plane // c, plane % c
        src, dst = x[i, ch], out[i, ch]
        nan = _has_nan(src)  # compare-and-select is branch-free; a NaN (numpy's max keeps it) needs a test
        for oy in range(oh):
            y0, ky0, ky1 = _taps(oy, sy, pt, kh, dy, h)
            for ox in range(ow):
                x0, kx0, kx1 = _taps(ox, sx, pl, kw, dx, w)
                best = low
                for ky in range(ky0, ky1):
                    row = src[y0 + ky * dy]
                    for kx in range(kx0, kx1):
                        v = row[x0 + kx * dx]
                        best = v if v > best else best
                        if nan and v != v:
                            best = v
                            break
                    if nan and best != best:
                        break
                dst[oy, ox] = best


def max_pool_2d(x: np.ndarray, low, kernel, strides, dilations, begin, out_hw) -> np.ndarray:
    """[N, C, H, W] -> [N, C, *out_hw]: each window's maximum, positions outside
    the map (padding, ceil-mode overhang) read as `low`."""
    out = np.empty((*x.shape[:2], *out_hw), x.dtype)
    _max_pool_2d(np.ascontiguousarray(x), x.dtype.type(low), *kernel, *strides, *dilations, *begin, out)
    return out
