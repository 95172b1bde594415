"""Compiled (numba) kernels of int4 products' host edges (runtime/llm/int4_rows.py:
W4A8 by two nibble rows per row): an activation row's codes written as the two
nibble rows the NPU reads, rotated first where the product's input is, and
the int16 partials of the two nibble products combined into float32 rows.
Numpy's arithmetic in numpy's order, as runtime/llm/jit.py's kernels
(tests/llm/test_int4_edges.py holds them to runtime/llm/int4_rows.py)."""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.llm.jit import _JIT
from rkc.runtime.llm.prefill_kernels import LANES, _butterflies, _signed_tile, scaled_amax

# A code a in [-119, 119] is 16 hi + lo with lo = ((a + 8) & 15) - 8 (so lo = a mod 16 as a nibble) and
# hi = (a - lo) / 16 = (a + 8) >> 4 (arithmetic shift): the nibbles are a & 15 and ((a + 8) >> 4) & 15.

@njit(**_JIT)
def _nibbles(even, odd):
    """One byte of two signed nibbles (their low four bits), the even channel's in the low nibble."""
    return np.uint8((even & 15) | ((odd & 15) << 4))


@njit(**_JIT)
def _abs_max_bits(k, bits):
    """The largest magnitude of k float32 values given as their bits (int32),
    as bits: the sign bit cleared, a float's bits order as its magnitude, a
    NaN's above infinity's. An integer max, which vectorises where a float
    max with numpy's NaN rule cannot."""
    best = np.int32(0)
    for i in range(k):
        best = max(best, bits[i] & np.int32(0x7FFFFFFF))
    return best


@njit(**_JIT)
def quantize_nibbles_into_atoms(x, q, scale, limit, lo, hi, pair_group):
    """int4_rows.npu_rows + packed_rows of rows lo..hi-1 of x [M, K] (rotated
    already), written into the int4 operand's bytes as int8 GEMM
    atoms q [C1, R, C2] (uint8 view; K / 2 byte columns, the even channel in
    the low nibble): per row the int8 codes of weights.symmetric_rows with
    `limit` (scale = max|x| / limit, 1 for a zero row or one holding a NaN;
    rint(x / scale) clipped: the same float32 operations), each code a = 16
    hi + lo written as two int4 rows, hi at 2m, lo at 2m + 1 (lo = ((a + 8) &
    15) - 8). The pad rows past 2M are zeroed by the range that ends at M
    (the atoms hold exactly K / 2 byte columns). Each pass a simple loop over
    a row buffer (the maximum as integer bits, the codes, the two nibble
    rows' bytes), which the compiler vectorises: 8960 wide 27 -> 8 us.
    pair_group > 0 (int4_rows.pair_rows): four rows per row, the K groups of
    pair_group channels alternating between rows 4m, 4m + 1 and 4m + 2,
    4m + 3, zeros in the other two."""
    rows, k = x.shape
    c1, stored, c2 = q.shape
    used = 4 * rows if pair_group else 2 * rows
    if 2 * c1 * c2 != k or stored < used or (pair_group and pair_group % (2 * c2)):
        raise ValueError("the int4 operand's atoms do not hold these rows")
    lim = np.float32(limit)
    half = k // 2
    codes = np.empty(k, np.int32)
    hi_bytes = np.empty(half, np.uint8)
    lo_bytes = np.empty(half, np.uint8)
    row = np.empty(k, np.float32)  # x[m] contiguous (x may be any strided view), and its bits as int32
    bits = row.view(np.int32)
    box = np.empty(1, np.int32)
    for m in range(lo, hi):
        for i in range(k):
            row[i] = x[m, i]
        box[0] = _abs_max_bits(k, bits)
        amax = box.view(np.float32)[0]
        if box[0] > np.int32(0x7F800000) or not amax > 0:  # a NaN stays the maximum, as in numpy's max
            s = np.float32(1.0)
        else:
            s = amax / lim
        scale[m] = s
        for i in range(k):
            codes[i] = np.int32(min(max(np.rint(row[i] / s), -lim), lim))
        for i in range(half):
            c_even, c_odd = codes[2 * i], codes[2 * i + 1]
            hi_bytes[i] = _nibbles(c_even + 8 >> 4, c_odd + 8 >> 4)
            lo_bytes[i] = _nibbles(c_even, c_odd)
        for a in range(c1):
            r = 2 * m
            if pair_group:  # this atom's group's rows, zeros in the other pair
                second = 2 * (a * 2 * c2 // pair_group % 2)
                r = 4 * m + second
                for b in range(c2):
                    q[a, 4 * m + 2 - second, b] = 0
                    q[a, 4 * m + 3 - second, b] = 0
            for b in range(c2):
                q[a, r, b] = hi_bytes[a * c2 + b]
                q[a, r + 1, b] = lo_bytes[a * c2 + b]
    if hi == rows:
        for a in range(c1):
            for r in range(used, stored):
                for b in range(c2):
                    q[a, r, b] = 0


@njit(**_JIT)
def rotate_nibbles_into_atoms(x, signs, block, norm, q, scale, limit, tile_lo, tile_hi):
    """quantize_nibbles_into_atoms of x [M, K] rotated first (signs, blockwise
    butterflies, times `norm`: a rotation without a block-mixing factor, as
    prefill_kernels.rotate_quantize_rows applies it, the same bits), tiles of
    LANES rows tile_lo..tile_hi-1, the rotated rows never stored."""
    rows, k = x.shape
    c1, stored, c2 = q.shape
    if 2 * c1 * c2 != k or stored < 2 * rows:
        raise ValueError("the int4 operand's atoms do not hold these rows")
    lim = np.float32(limit)
    buf = np.empty((k, LANES), np.float32)
    amax = np.empty(LANES, np.float32)
    tiles = (rows + LANES - 1) // LANES
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        _signed_tile(x, signs, m0, r, buf)
        _butterflies(buf, block)
        scaled_amax(buf, norm, amax)
        for lane in range(r):
            m = m0 + lane
            s = amax[lane] / lim if amax[lane] > 0 else np.float32(1.0)
            scale[m] = s
            for a in range(c1):
                for b in range(c2):
                    j = 2 * (a * c2 + b)
                    c_even = np.int32(min(max(np.rint(buf[j, lane] / s), -lim), lim))
                    c_odd = np.int32(min(max(np.rint(buf[j + 1, lane] / s), -lim), lim))
                    q[a, 2 * m, b] = _nibbles(c_even + 8 >> 4, c_odd + 8 >> 4)
                    q[a, 2 * m + 1, b] = _nibbles(c_even, c_odd)
    if tile_hi == tiles:
        for a in range(c1):
            for r2 in range(2 * rows, stored):
                for b in range(c2):
                    q[a, r2, b] = 0


INT16_LANES = 8  # int16 values per 16-byte atom


@njit(**_JIT)
def _combine_int4_row(p, n, n_pad, scales, row_scale, bias, has_bias, out, m, paired):
    """combine_int4_atoms of row m alone, group after group over the whole row
    (the first group's terms stored, each next one's added: the same float32
    operations in the same order as by atoms), each atom's 8 lanes a loop of
    known length, which the compiler vectorises (E2B's 262144-wide head of 2
    groups 653 -> 359 us, a 1536-wide row of 9 groups 18 -> 9 us, hot), then
    scaled. `paired` (m = 0): group g's sums in rows 2 (g % 2), +1 of block g // 2."""
    if p.shape[2] != INT16_LANES:
        raise ValueError("int16 partials come in atoms of 8")
    groups = scales.shape[0]
    full = n // INT16_LANES
    per_group = n_pad // INT16_LANES
    row = out[m]
    for g in range(groups):
        w, a0, h = scales[g], g * per_group, 2 * m
        if paired:
            a0, h = g // 2 * per_group, 2 * (g % 2)
        for a in range(full):
            base = a * INT16_LANES
            for b in range(INT16_LANES):
                v = np.float32(np.int32(p[a0 + a, h, b]) * 16 + np.int32(p[a0 + a, h + 1, b])) * w[base + b]
                if g == 0:
                    row[base + b] = np.float32(0.0) + v
                else:
                    row[base + b] += v
        for j in range(full * INT16_LANES, n):  # the last atom's channels past a whole atom
            v = np.float32(np.int32(p[a0 + full, h, j - full * INT16_LANES]) * 16
                           + np.int32(p[a0 + full, h + 1, j - full * INT16_LANES])) * w[j]
            row[j] = np.float32(0.0) + v if g == 0 else row[j] + v
    _scale_row(row, n, row_scale[m], bias, has_bias)


@njit(**_JIT)
def _scale_row(row, n, rs, bias, has_bias):
    """row[:n] *= the row scale (+ bias), in float32 as the combine does."""
    if has_bias:
        for j in range(n):
            row[j] = row[j] * rs + bias[j]
    else:
        for j in range(n):
            row[j] = row[j] * rs


@njit(**_JIT)
def combine_int4_atoms(p, n, n_pad, scales, row_scale, bias, has_bias, out, lo, hi, paired):
    """int4_rows.combine of rows lo..hi-1 read from the NPU's int16 partials
    in their atoms p [C1, R, C2] (row 2m: the hi nibble row's sums, 2m + 1 the
    lo row's; group g's channel j at column g * n_pad + j, n_pad a multiple of
    C2): out[m, j] = (sum over g, in order, of float32(16 P_hi + P_lo) *
    scales[g, j]) * row scale[m] (+ bias[j]), each operation in float32 as
    the kernel does it (16 P_hi + P_lo is formed in int32: |16 P_hi + P_lo|
    < 2^20, so its float32 is float32(P_hi) * 16 + float32(P_lo) exactly).
    By tiles of LANES rows (each atom's rows of a tile are contiguous in the
    BO): per group the tile's merged sums gathered into contiguous rows
    first, then each output row updated by one simple loop, which the
    compiler vectorises (the atoms' short runs defeat it: a 2 x 8960 combine
    41 -> 25 us). `paired`: one row whose two K groups share a block's four
    rows (int4_rows.pair_rows), _combine_int4_row's."""
    if hi - lo == 1:  # one row (decode): no merged rows
        _combine_int4_row(p, n, n_pad, scales, row_scale, bias, has_bias, out, lo, paired)
        return
    if paired:
        raise ValueError("paired int4 partials hold one row")
    c2 = p.shape[2]
    groups = scales.shape[0]
    atoms = -(-n // c2)
    merged = np.empty((LANES, atoms * c2), np.float32)
    for m0 in range(lo, hi, LANES):
        m1 = min(m0 + LANES, hi)
        for g in range(groups):
            a0 = g * n_pad // c2
            for a in range(atoms):
                base = a * c2
                for m in range(m0, m1):
                    r = m - m0
                    for b in range(c2):
                        merged[r, base + b] = np.float32(np.int32(p[a0 + a, 2 * m, b]) * 16
                                                         + np.int32(p[a0 + a, 2 * m + 1, b]))
            w = scales[g]
            for m in range(m0, m1):
                row, src = out[m], merged[m - m0]
                if g == 0:
                    for j in range(n):
                        row[j] = np.float32(0.0) + src[j] * w[j]
                else:
                    for j in range(n):
                        row[j] += src[j] * w[j]
        for m in range(m0, m1):
            _scale_row(out[m], n, row_scale[m], bias, has_bias)
