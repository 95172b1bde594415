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

from rkc.runtime.half import narrow_bits, narrow_value
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
    runtime/image_edges.py), lanes past C zero. The host reads the image's
    own bytes (a quarter of a float32 image's) and writes the map once."""
    words = fm.view(np.uint64).reshape(fm.shape[1], fm.shape[2], 2)
    width = 8 * fm.itemsize
    over_rows(lambda lo, hi: _pixel_rows(pixels, tables, width, words, lo, hi), fm.shape[1], fm.size)


def is_rgb_blocks(fm: np.ndarray) -> bool:
    """A map of an RGB image's 2x2 blocks (compiler/passes/image_blocks.py: SpaceToDepth(2),
    12 channels) this module writes: two fp16 or one int8 group of 16-byte atoms."""
    return fm.shape[3] * fm.itemsize == ATOM_BYTES and fm.flags.c_contiguous and fm.shape[0] * fm.shape[3] == 16


_NO_AFFINE = (np.ones(1, np.float32), np.zeros(1, np.float32))  # (not read: the codes are looked up)


def affine_rows(scales: np.ndarray, offsets: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel scales and offsets [3] as pixels_into_blocks takes them: one per value
    of an image row of `width` RGB pixels (made once: np.tile costs ~30 us a call)."""
    return np.tile(scales.astype(np.float32), width), np.tile(offsets.astype(np.float32), width)


def pixels_into_blocks(pixels: np.ndarray, tables: np.ndarray, fm: np.ndarray,
                       affine: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """fm = the feature map of SpaceToDepth(2) of the per-channel codes of a uint8 RGB
    image [H, W, 3]: block pixel (y, x), channel (py * 2 + px) * 3 + c holds the code of
    pixels[2y + py, 2x + px, c] (SpaceToDepth's channel order, runtime/kernels/shape.py),
    channels 12-15 zero. The code is tables[c, pixel] or, with `affine` = (scales,
    offsets) (float32, one per value of an image row, [W * 3]: `affine_rows`; fp16 maps
    only), the fp16 bits of float32(pixel) * scale + offset, computed a row at a time
    (vectorised) where a lookup a value is not: image_plan uses it only where it gives
    the tables' codes for every pixel value. A block's six values of one image row are contiguous in
    the row's codes; each atom is built as two 64-bit words and stored whole: the pass
    reads the image once and writes half (fp16) or a quarter (int8) of the plain map's
    bytes."""
    words = fm.view(np.uint64).reshape(fm.shape[0], fm.shape[1], fm.shape[2], 2)
    scales, offsets = affine if affine is not None else _NO_AFFINE
    over_rows(lambda lo, hi: _block_rows(pixels, tables, scales, offsets, affine is not None, words, lo, hi),
              fm.shape[1], fm.size)


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


@njit(cache=True, nogil=True)
def _block_rows(pixels, tables, scales, offsets, affine, words, lo, hi):
    _, w, c = pixels.shape
    n = w * c
    codes = np.empty((2, n), np.uint16)  # affine: the block row's two image rows' codes
    for y in range(lo, hi):
        if not affine:
            _looked_up_blocks(pixels[2 * y], pixels[2 * y + 1], tables, words, y)
            continue
        for r in range(2):
            src, dst = pixels[2 * y + r].reshape(n), codes[r]
            for j in range(n):
                dst[j] = narrow_value(np.float32(src[j]) * scales[j] + offsets[j])
        # a block's six codes of a row are three 32-bit words: lanes 0-7 (row 0's six, row 1's
        # first two) the first atom, 8-11 the second's
        a, b = codes[0].view(np.uint32), codes[1].view(np.uint32)
        first, second = words[0, y], words[1, y]
        for x in range(first.shape[0]):
            k = 3 * x
            first[x, 0] = np.uint64(a[k]) | (np.uint64(a[k + 1]) << np.uint64(32))
            first[x, 1] = np.uint64(a[k + 2]) | (np.uint64(b[k]) << np.uint64(32))
            second[x, 0] = np.uint64(b[k + 1]) | (np.uint64(b[k + 2]) << np.uint64(32))
            second[x, 1] = 0


@njit(cache=True, nogil=True, inline="always")
def _looked_up_blocks(r0, r1, tables, words, y):
    """Block row y from image rows r0, r1 [W, 3] through the tables, each lane's lookup
    written out (as _pixel_rows: a loop over lanes ran several times slower), one
    loop per precision."""
    t0, t1, t2 = tables[0], tables[1], tables[2]
    if tables.itemsize == 2:  # fp16: lanes 0-7 the first atom, 8-11 the second's first word
        first, second = words[0, y], words[1, y]
        for x in range(first.shape[0]):
            i = 2 * x
            first[x, 0] = np.uint64(t0[r0[i, 0]]) | (np.uint64(t1[r0[i, 1]]) << 16) \
                | (np.uint64(t2[r0[i, 2]]) << 32) | (np.uint64(t0[r0[i + 1, 0]]) << 48)
            first[x, 1] = np.uint64(t1[r0[i + 1, 1]]) | (np.uint64(t2[r0[i + 1, 2]]) << 16) \
                | (np.uint64(t0[r1[i, 0]]) << 32) | (np.uint64(t1[r1[i, 1]]) << 48)
            second[x, 0] = np.uint64(t2[r1[i, 2]]) | (np.uint64(t0[r1[i + 1, 0]]) << 16) \
                | (np.uint64(t1[r1[i + 1, 1]]) << 32) | (np.uint64(t2[r1[i + 1, 2]]) << 48)
            second[x, 1] = 0
    else:  # int8: the 12 lanes in one atom
        out = words[0, y]
        for x in range(out.shape[0]):
            i = 2 * x
            out[x, 0] = np.uint64(t0[r0[i, 0]]) | (np.uint64(t1[r0[i, 1]]) << 8) \
                | (np.uint64(t2[r0[i, 2]]) << 16) | (np.uint64(t0[r0[i + 1, 0]]) << 24) \
                | (np.uint64(t1[r0[i + 1, 1]]) << 32) | (np.uint64(t2[r0[i + 1, 2]]) << 40) \
                | (np.uint64(t0[r1[i, 0]]) << 48) | (np.uint64(t1[r1[i, 1]]) << 56)
            out[x, 1] = np.uint64(t2[r1[i, 2]]) | (np.uint64(t0[r1[i + 1, 0]]) << 8) \
                | (np.uint64(t1[r1[i + 1, 1]]) << 16) | (np.uint64(t2[r1[i + 1, 2]]) << 24)
