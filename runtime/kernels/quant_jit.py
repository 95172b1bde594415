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
from functools import lru_cache

from numba import njit

from rkc.runtime.half import lanes_to_rows, one_pixel_lanes, rows_to_lanes
from rkc.runtime.kernels.threads import over_rows


def quantize_into_feature(x: np.ndarray, scale: float, zero_point: int, fm: np.ndarray) -> None:
    """fm[c // C2, y, i, c % C2] = saturate(rint(x[c, y, i] / scale) + zero_point)
    for x [C, H, W] float32; channels past C are zero."""
    over_rows(lambda lo, hi: _quantize_lines(x, scale, zero_point, fm, lo, hi), fm.shape[0] * fm.shape[1],
              fm.size)


def quantize_tiles_into_feature(tiles: np.ndarray, scale: float, zero_point: int, fm: np.ndarray) -> None:
    """quantize_into_feature of the map x[c, y * kh + ty, i * kw + tx] = tiles[c, ty, tx, y, i]
    (a stride = kernel ConvTranspose's output before its interleave: runtime/kernels/conv.py's
    conv_transpose_tiles), read in place."""
    over_rows(lambda lo, hi: _quantize_tile_lines(tiles, scale, zero_point, fm, lo, hi), fm.shape[0] * fm.shape[1],
              fm.size)


def dequantize_feature(fm: np.ndarray, scale: float, zero_point: int, out: np.ndarray) -> None:
    """out[c, y, i] = float32((fm[c // C2, y, i, c % C2] - zero_point) * scale)
    for out [C, H, W]; a map of one pixel (a classifier's logits) in one loop over its lanes
    (half.one_pixel_lanes: 1000 logits 5.3 -> ~1-2 us, load 3)."""
    lanes = one_pixel_lanes(fm, out)
    if lanes is not None:
        _dequantize_pixel(lanes, scale, zero_point, out.reshape(-1))
        return
    over_rows(lambda lo, hi: _dequantize_lines(fm, scale, zero_point, out, lo, hi), fm.shape[0] * fm.shape[1],
              fm.size)


TIE_MARGIN = 2.0 ** -30  # a product this close to a half-integer is re-rounded from the division


@njit(cache=True, nogil=True, fastmath=False)
def quantize_row(src, scale, inverse, zp, dst):
    """dst[i] = saturate(rint(float64(src[i]) / scale) + zp) as int8 codes (any
    integer dtype of dst), with quant.py's arithmetic: the quotient taken as a
    product with the float64 reciprocal (the division did not vectorise: 2.7x
    slower), exact because the two can round apart only next to a half-integer,
    where the float64 product is within ~2^-44 of the quotient of two float32
    values; a row holding such a value is redone with the division."""
    near_tie = False
    for i in range(src.shape[0]):
        p = np.float64(src[i]) * inverse
        r = np.rint(p)
        near_tie |= abs(abs(p - r) - 0.5) < TIE_MARGIN
        dst[i] = np.int8(min(max(r + zp, -128.0), 127.0))
    if near_tie:
        for i in range(src.shape[0]):
            q = np.rint(np.float64(src[i]) / scale) + zp
            dst[i] = np.int8(min(max(q, -128.0), 127.0))


@njit(cache=True, nogil=True, fastmath=False)
def _quantize_lines(x, scale, zero_point, fm, lo, hi):
    c, h, w = x.shape
    c2 = fm.shape[3]
    zp, inverse = np.float64(zero_point), 1.0 / scale
    rows = np.zeros((c2, w), np.int8)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        for b in range(n):
            quantize_row(x[a * c2 + b, y], scale, inverse, zp, rows[b])
        for b in range(n, c2):
            rows[b] = 0
        rows_to_lanes(rows, fm[a, y])


@njit(cache=True, nogil=True, fastmath=False)
def _quantize_tile_lines(tiles, scale, zero_point, fm, lo, hi):
    c, kh, kw, ih, iw = tiles.shape
    h, w = ih * kh, iw * kw
    c2 = fm.shape[3]
    zp = np.float64(zero_point)
    values = np.empty(w, np.float32)  # one output row, its taps interleaved: the quantization vectorises
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        rows = np.zeros((c2, w), np.int8)
        for b in range(n):
            for tx in range(kw):
                src = tiles[a * c2 + b, y % kh, tx, y // kh]
                for i in range(iw):
                    values[i * kw + tx] = src[i]
            dst = rows[b]
            for i in range(w):
                q = np.rint(np.float64(values[i]) / scale) + zp
                dst[i] = np.int8(min(max(q, -128.0), 127.0))
        rows_to_lanes(rows, fm[a, y])


@njit(cache=True, nogil=True, fastmath=False)
def _dequantize_pixel(lanes, scale, zero_point, out):
    # by atoms and lanes: a channel's j // C2, j % C2 (a division by a runtime C2) cost ~1 ns each
    # (ZFNet's 4096 features: 10 -> 5.5 us, load ~2)
    zp, (c1, c2), c = np.float64(zero_point), lanes.shape, out.shape[0]
    for a in range(c1):
        for b in range(min(c2, c - a * c2)):
            out[a * c2 + b] = np.float32((np.float64(lanes[a, b]) - zp) * scale)


@njit(cache=True, nogil=True, fastmath=False)
def _dequantize_lines(fm, scale, zero_point, out, lo, hi):
    c, h, w = out.shape
    c2 = fm.shape[3]
    zp = np.float64(zero_point)
    rows = np.empty((c2, w), np.int8)  # (made once: one a line cost ~100 ns, most of a 1x1 map's line)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        lanes_to_rows(fm[a, y], rows)
        for b in range(n):
            src, dst = rows[b], out[a * c2 + b, y]
            for i in range(w):
                dst[i] = np.float32((np.float64(src[i]) - zp) * scale)


@lru_cache(maxsize=1024)
def int8_to_fp16_table(scale: float, zero_point: int) -> np.ndarray:
    """fp16 bits of Cast(DequantizeLinear(q)) for every int8 code q, indexed by
    the code's byte (runtime/kernels/quant.py's arithmetic, numpy's rounding)."""
    from rkc.runtime.kernels import quant

    codes = np.arange(256, dtype=np.uint8).view(np.int8)
    values = quant.dequantize_linear(codes, np.float32(scale), np.int8(zero_point))
    return values.astype(np.float16).view(np.uint16)


@lru_cache(maxsize=1024)
def fp16_to_int8_table(scale: float, zero_point: int) -> np.ndarray:
    """int8 bytes of QuantizeLinear(Cast(h, float32)) for every fp16 pattern h."""
    from rkc.runtime.kernels import quant

    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        codes = quant.quantize_linear(halves.astype(np.float32), np.float32(scale), np.int8(zero_point))
    return codes.view(np.uint8)


def recode_feature(src: np.ndarray, table: np.ndarray, dst: np.ndarray, channels: int) -> None:
    """dst's channel c = table[src's channel c] between feature maps of any atom
    widths (codes as unsigned bytes or 16-bit words); dst's padding lanes zero."""
    if src.shape[3] == 2 * dst.shape[3] == 16 and src.flags.c_contiguous and dst.flags.c_contiguous:
        over_rows(lambda lo, hi: _recode_halves(src, table, dst, channels, lo, hi), dst.shape[0] * dst.shape[1],
                  dst.size)
        return
    over_rows(lambda lo, hi: _recode_lines(src, table, dst, channels, lo, hi), dst.shape[0] * dst.shape[1],
              dst.size)


@njit(cache=True, nogil=True, fastmath=False)
def _recode_halves(src, table, dst, c, lo, hi):
    """`_recode_lines` from 16-lane atoms (int8) into 8-lane ones (fp16): dst group a is
    lanes 8 * (a % 2) .. + 8 of src group a // 2, each pixel's eight lookups written out
    over flat rows (the lane-by-lane strided gather cost 0.5-0.7 ns a code: 64x55x55
    106 -> 72 us, load 5)."""
    h, w = dst.shape[1], dst.shape[2]
    for line in range(lo, hi):
        a, y = line // h, line % h
        out = dst[a, y].reshape(-1)
        lanes = src[a // 2, y].reshape(-1)
        off = (a % 2) * 8
        if (a + 1) * 8 > c:  # the last group, part padding: lane by lane
            for i in range(w):
                for b in range(8):
                    out[i * 8 + b] = table[lanes[i * 16 + off + b]] if a * 8 + b < c else 0
            continue
        for i in range(w):
            o, k = i * 8, i * 16 + off
            out[o] = table[lanes[k]]
            out[o + 1] = table[lanes[k + 1]]
            out[o + 2] = table[lanes[k + 2]]
            out[o + 3] = table[lanes[k + 3]]
            out[o + 4] = table[lanes[k + 4]]
            out[o + 5] = table[lanes[k + 5]]
            out[o + 6] = table[lanes[k + 6]]
            out[o + 7] = table[lanes[k + 7]]


@njit(cache=True, nogil=True, fastmath=False)
def _recode_lines(src, table, dst, c, lo, hi):
    h, w, c2 = dst.shape[1], dst.shape[2], dst.shape[3]
    s2 = src.shape[3]
    for line in range(lo, hi):
        a, y = line // h, line % h
        atoms = dst[a, y]
        for b in range(c2):  # lane by lane (a strided gather): 4x faster here than atom by atom
            j = a * c2 + b
            if j < c:
                lanes = src[j // s2, y]
                for i in range(w):
                    atoms[i, b] = table[lanes[i, j % s2]]
            else:
                for i in range(w):
                    atoms[i, b] = 0
