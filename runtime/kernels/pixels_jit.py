"""Compiled (numba) conversions of a model's input image (a float32 map of a
few channels: RGB) into the first segment's feature map [C1, H, W, C2]
(ir/npu/layout.py), whose atom is 16 bytes in both precisions (16 int8 lanes,
8 fp16 lanes): a 3-channel image fills 3 lanes of each pixel's atom and the
rest are zero.

The general edges (runtime/kernels/quant_jit.py, runtime/half.py) compute all
C2 lane rows of a line and transpose them into the atoms byte by byte: for
3 channels of 16 that is 13 zero rows transposed, ~2-4x the pass's memory
time. Here a row's codes are computed channel by channel (the conversion
vectorises) and each pixel's atom is then built as two 64-bit words (the
channels' codes shifted into their lanes, the rest zero) and stored whole:
the pass reads the image once and writes the map once (3x640x640 fp16 on one
thread 0.46 ms, where a plain copy of the same bytes takes 0.41 here). The codes are the general
edges' own arithmetic (QuantizeLinear's float64 division, rounding half to
even, saturation; fp16 by numpy's bits, runtime/half.py `narrow_bits`).
tests/runtime/test_pixels_jit.py checks them against the general edges and
a float64 reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import narrow_bits
from rkc.runtime.kernels.quant_jit import quantize_row
from rkc.runtime.kernels.threads import over_rows

ATOM_BYTES = 16  # one feature atom, both precisions (C2 = 16 int8 / 8 fp16 lanes)
FEW_CHANNELS = 4  # a map of at most this many channels is an image: this module's case


def is_image(channels: int, fm: np.ndarray) -> bool:
    """A map this module converts: few channels into one group of 16-byte atoms."""
    return channels <= FEW_CHANNELS and fm.shape[0] == 1 and fm.shape[3] * fm.itemsize == ATOM_BYTES \
        and fm.flags.c_contiguous


def quantize_image(x: np.ndarray, scale: float, zero_point: int, fm: np.ndarray) -> None:
    """fm[0, y, i, c] = saturate(rint(x[c, y, i] / scale) + zero_point) for x [C, H, W]
    float32 (C <= 4), int8 lanes past C zero."""
    words = fm.view(np.uint64).reshape(fm.shape[1], fm.shape[2], 2)
    over_rows(lambda lo, hi: _quantize_rows(x, scale, zero_point, words, lo, hi), fm.shape[1], fm.size)


def pixels_into_feature(pixels: np.ndarray, tables: np.ndarray, fm: np.ndarray) -> None:
    """fm[0, y, i, c] = tables[c, pixels[y, i, c]] for a uint8 image [H, W, C] (C <= 4):
    each channel's 256 codes (int8 bytes or fp16 bits, the normalisation and the
    conversion into the map done once per code by the reference kernels,
    runtime/feature_edges.py), lanes past C zero. The host reads the image's
    own bytes (a quarter of a float32 image's) and writes the map once."""
    words = fm.view(np.uint64).reshape(fm.shape[1], fm.shape[2], 2)
    width = 8 * fm.itemsize
    over_rows(lambda lo, hi: _pixel_rows(pixels, tables, width, words, lo, hi), fm.shape[1], fm.size)


def narrow_image(x: np.ndarray, fm: np.ndarray) -> None:
    """fm[0, y, i, c] = the fp16 bits of x[c, y, i] for x [C, H, W] float32 bits
    (uint32, C <= 4), fp16 lanes past C zero."""
    words = fm.view(np.uint64).reshape(fm.shape[1], fm.shape[2], 2)
    over_rows(lambda lo, hi: _narrow_rows(x, words, lo, hi), fm.shape[1], fm.size)


@njit(cache=True, nogil=True)
def _quantize_rows(x, scale, zero_point, words, lo, hi):
    c, _, w = x.shape
    zp, inverse = np.float64(zero_point), 1.0 / scale
    codes = np.zeros((4, w), np.int8)  # a row's codes per channel (vectorised), then packed into atoms
    bytes_ = codes.view(np.uint8)
    for y in range(lo, hi):
        for b in range(c):
            quantize_row(x[b, y], scale, inverse, zp, codes[b])
        _pack_row(bytes_, 8, words[y])


@njit(cache=True, nogil=True)
def _narrow_rows(x, words, lo, hi):
    c, _, w = x.shape
    bits = np.zeros((4, w), np.uint16)
    for y in range(lo, hi):
        for b in range(c):
            src, dst = x[b, y], bits[b]
            for i in range(w):
                dst[i] = narrow_bits(src[i])
        _pack_row(bits, 16, words[y])


@njit(cache=True, nogil=True, inline="always")
def _pack_row(lanes, width, out):
    """out[i] = the atom of pixel i: lanes[0..3][i] in its first four lanes of
    `width` bits (lanes past the image's channels hold zeros), the rest zero."""
    a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
    s1, s2, s3 = np.uint64(width), np.uint64(2 * width), np.uint64(3 * width)
    for i in range(out.shape[0]):
        out[i, 0] = np.uint64(a[i]) | (np.uint64(b[i]) << s1) | (np.uint64(c[i]) << s2) | (np.uint64(d[i]) << s3)
        out[i, 1] = 0


@njit(cache=True, nogil=True)
def _pixel_rows(pixels, tables, width, words, lo, hi):
    _, w, c = pixels.shape
    s1, s2, s3 = np.uint64(width), np.uint64(2 * width), np.uint64(3 * width)
    t0, t1, t2, t3 = tables[0], tables[min(1, c - 1)], tables[min(2, c - 1)], tables[min(3, c - 1)]
    for y in range(lo, hi):  # pixel by pixel, one loop per channel count (a loop over the channels
        row, out = pixels[y], words[y]  # inside the pixel loop ran 3.5x slower): each atom written whole
        if c == 3:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]]) | (np.uint64(t1[row[i, 1]]) << s1) \
                    | (np.uint64(t2[row[i, 2]]) << s2)
                out[i, 1] = 0
        elif c == 4:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]]) | (np.uint64(t1[row[i, 1]]) << s1) \
                    | (np.uint64(t2[row[i, 2]]) << s2) | (np.uint64(t3[row[i, 3]]) << s3)
                out[i, 1] = 0
        elif c == 2:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]]) | (np.uint64(t1[row[i, 1]]) << s1)
                out[i, 1] = 0
        else:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]])
                out[i, 1] = 0
