"""Compiled (numba) kernels of prefill's int4 stretches (runtime/llm/fused_rows.py's
int4 residual and FFN stretches): the int8 build's stretches (prefill_fused.py)
with int4 edges, one tile of LANES rows at a time from the first step to the last.

    in edge: an int4 product's int16 K-group partials read straight from the
        NPU's atoms and combined, y = s_a sum_g s_w[g] (16 P_hi + P_lo) (+ bias),
        in float32 (int4_rows.combine's arithmetic, int4_jit.combine_int4_atoms' order
        of operations: the same bits), an atom's 8 channels as one vector
        (LLVM vector code through numba intrinsics: `_merge_atom_rows`,
        `_store_atom_tile`);
    body: prefill_fused's (RMSNorm, the residual Add, RMSNorm; or act(gate) * up);
    out edge: rotated (signs, butterflies, the orthonormal factor) and quantized
        to int8 codes in [-limit, limit] per row, each written as two nibble rows
        (hi at 2m, lo at 2m + 1) into the next int4 operand's atoms
        (int4_jit.rotate_nibbles_into_atoms' arithmetic); a rotation with a
        block-mixing factor leaves its rotated rows by blocks for the caller's
        numpy product and `quantize_nibble_blocks_into_atoms`.

Before these, a stretch of int4 edges ran each step on its own (fused_int4_rows.int4_edges):
five passes over the rows and four arrays where this makes one pass and none.
Tested against float64 references (tests/llm/test_int4_prefill.py).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from rkc.runtime.llm.int4_jit import INT16_LANES as ATOM
from rkc.runtime.llm.int4_jit import _abs_max_bits, _nibbles
from rkc.runtime.llm.prefill_fused import _act_mul, _rotate_tile, _scaled_body, _tile_scales, zero_rows
from rkc.runtime.llm.prefill_kernels import LANES

_JIT = {"cache": True, "nogil": True, "fastmath": False}
GATHERED = 8  # rows quantize_nibble_blocks_into_atoms takes from their blocks at once


if LANES != 2 * ATOM:  # _store_atom_tile transposes a tile's lanes as two 8 x 8 blocks
    raise ImportError("int4_prefill's vector combine assumes tiles of 16 rows")
_I16X8, _I32X8 = ir.VectorType(ir.IntType(16), ATOM), ir.VectorType(ir.IntType(32), ATOM)
_F32X8, _F32X16 = ir.VectorType(ir.FloatType(), ATOM), ir.VectorType(ir.FloatType(), LANES)


def _c_array(a, dtype) -> bool:
    return isinstance(a, types.Array) and a.dtype == dtype and a.layout == "C"


def _at(context, builder, arr_type, arr, index, vector):
    """A pointer to `vector` values of the C-contiguous `arr` from flat element `index` on."""
    data = context.make_array(arr_type)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [index], inbounds=True), vector.as_pointer())


@intrinsic
def _merge_atom_rows(typingctx, p, off, w, w_off, acc, acc_off, first):
    """acc[acc_off:+8] = (or, unless `first`, +=) float32(16 h + l) * w[w_off:+8],
    h the 8 int16 values of p from flat index `off` on (a hi nibble row's sums
    in one atom), l the 8 after them (the lo row's, the next row of the atom),
    as 8-lane vectors (16 h + l formed in int32: exact, |16 h + l| < 2^20).
    Numba leaves LLVM's SLP vectoriser off and an atom's 8 channels are too
    short a loop for its loop vectoriser: as scalar code this combine was most
    of int4 prefill's extra host time (docs/notes/2026-12-06-int4-prefill.md)."""
    if not (_c_array(p, types.int16) and _c_array(w, types.float32) and _c_array(acc, types.float32)
            and w.ndim == 1 and acc.ndim == 1):
        return None
    sig = types.void(p, types.intp, w, types.intp, acc, types.intp, types.boolean)

    def codegen(context, builder, signature, args):
        p_v, off_v, w_v, w_off_v, acc_v, acc_off_v, first_v = args
        hi_at = _at(context, builder, signature.args[0], p_v, off_v, _I16X8)
        lo_at = _at(context, builder, signature.args[0], p_v, builder.add(off_v, ir.Constant(off_v.type, ATOM)),
                    _I16X8)
        hi = builder.sext(builder.load(hi_at, align=2), _I32X8)
        lo = builder.sext(builder.load(lo_at, align=2), _I32X8)
        merged = builder.sitofp(builder.add(builder.shl(hi, ir.Constant(_I32X8, [4] * ATOM)), lo), _F32X8)
        term = builder.fmul(merged, builder.load(_at(context, builder, signature.args[2], w_v, w_off_v, _F32X8),
                                                 align=4))
        acc_at = _at(context, builder, signature.args[4], acc_v, acc_off_v, _F32X8)
        with builder.if_else(first_v) as (then, otherwise):
            with then:
                builder.store(term, acc_at, align=4)
            with otherwise:
                builder.store(builder.fadd(builder.load(acc_at, align=4), term), acc_at, align=4)
        return context.get_dummy_value()
    return sig, codegen


def _transpose8(builder, rows: list) -> list:
    """Eight <8 x float> rows -> the eight columns (butterflies of spans 1, 2, 4)."""
    rows = list(rows)
    for span in (1, 2, 4):
        out = list(rows)
        for i in range(ATOM):
            if i & span:
                continue
            low = [j if j & span == 0 else ATOM + j - span for j in range(ATOM)]
            high = [j + span if j & span == 0 else ATOM + j for j in range(ATOM)]
            out[i] = builder.shuffle_vector(rows[i], rows[i + span], ir.Constant(_I32X8, low))
            out[i + span] = builder.shuffle_vector(rows[i], rows[i + span], ir.Constant(_I32X8, high))
        rows = out
    return rows


@intrinsic
def _store_atom_tile(typingctx, acc, rs, bias, has_bias, buf, base):
    """buf[base + b, lane] = acc[8 lane + b] * rs[lane] + (bias[base + b] if
    has_bias else 0), b < 8, lane < LANES (rs: LANES values, buf [K, LANES],
    base + 8 <= K): a tile's 8 channels of one atom,
    [lane][channel] as _merge_atom_rows leaves them, transposed in registers
    (the lanes' rows contiguous in buf), scaled, the bias added."""
    if not (all(_c_array(a, types.float32) for a in (acc, rs, bias, buf)) and buf.ndim == 2):
        return None
    sig = types.void(acc, rs, bias, types.boolean, buf, types.intp)

    def codegen(context, builder, signature, args):
        acc_v, rs_v, bias_v, has_bias_v, buf_v, base_v = args
        intp = base_v.type
        rows = [builder.load(_at(context, builder, signature.args[0], acc_v, ir.Constant(intp, ATOM * lane), _F32X8),
                             align=4) for lane in range(LANES)]
        columns = [_transpose8(builder, rows[h:h + ATOM]) for h in range(0, LANES, ATOM)]
        scale = builder.load(_at(context, builder, signature.args[1], rs_v, ir.Constant(intp, 0), _F32X16), align=4)
        bias_at = context.make_array(signature.args[2])(context, builder, bias_v).data
        whole = ir.Constant(ir.VectorType(ir.IntType(32), LANES), list(range(LANES)))
        splat = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        for b in range(ATOM):
            j = builder.add(base_v, ir.Constant(intp, b))
            with builder.if_else(has_bias_v) as (then, otherwise):
                with then:
                    with_bias, from_bias = builder.load(builder.gep(bias_at, [j], inbounds=True)), builder.block
                with otherwise:
                    from_zero = builder.block
            bj = builder.phi(ir.FloatType())
            bj.add_incoming(with_bias, from_bias)
            bj.add_incoming(ir.Constant(ir.FloatType(), 0.0), from_zero)
            bj = builder.shuffle_vector(builder.insert_element(ir.Constant(_F32X16, ir.Undefined), bj,
                                                               ir.Constant(ir.IntType(32), 0)),
                                        ir.Constant(_F32X16, ir.Undefined), splat)
            column = builder.shuffle_vector(columns[0][b], columns[1][b], whole)
            row_at = _at(context, builder, signature.args[4], buf_v, builder.mul(j, ir.Constant(intp, LANES)), _F32X16)
            builder.store(builder.fadd(builder.fmul(column, scale), bj), row_at, align=4)
        return context.get_dummy_value()
    return sig, codegen


@njit(inline="always")
def _combine_tile(p, m0, n_pad, scales, rs, bias, has_bias, k, buf):
    """buf[j, lane] for the LANES rows m0.. of p (all held by p), row scales
    rs [LANES]: each whole atom's channels summed over the groups lane by
    lane as 8-lane vectors (_merge_atom_rows) in a local [LANES, 8], then
    transposed into buf, scaled (_store_atom_tile); the channels of a last
    atom past K's whole atoms one by one, in the same operations."""
    if p.shape[2] != ATOM:
        raise ValueError("int16 partials come in atoms of 8")
    stored = p.shape[1]
    groups = scales.shape[0]
    per_group = n_pad // ATOM
    acc = np.empty(LANES * ATOM, np.float32)
    whole = k // ATOM
    for a in range(whole):
        base = a * ATOM
        for g in range(groups):
            w = scales[g]
            off = ((g * per_group + a) * stored + 2 * m0) * ATOM
            for lane in range(LANES):
                _merge_atom_rows(p, off + 2 * ATOM * lane, w, base, acc, ATOM * lane, g == 0)
        _store_atom_tile(acc, rs, bias, has_bias, buf, base)
    base = whole * ATOM
    width = k - base
    if width == 0:
        return
    for g in range(groups):
        w = scales[g]
        blk = p[g * per_group + whole, 2 * m0:2 * m0 + 2 * LANES]
        for lane in range(LANES):  # |16 P_hi + P_lo| < 2^20: exact in int32 and in float32
            hi, lo = blk[2 * lane], blk[2 * lane + 1]
            for b in range(width):
                v = np.float32(np.int32(hi[b]) * 16 + np.int32(lo[b])) * w[base + b]
                acc[ATOM * lane + b] = v if g == 0 else acc[ATOM * lane + b] + v
    for b in range(width):
        row = buf[base + b]
        bj = bias[base + b] if has_bias else np.float32(0.0)
        for lane in range(LANES):
            row[lane] = acc[ATOM * lane + b] * rs[lane] + bj


@njit(inline="always")
def _load_int4(p, n_pad, scales, row_scale, bias, has_bias, m0, r, k, buf):
    """buf[j, lane] = the combined value of row m0 + lane, channel j < k, from
    the int16 partials' atoms p [C1, R, C2] (row 2m: the hi nibble row's sums,
    2m + 1 the lo row's; group g's channel j at column g * n_pad + j):
    (sum over g of float32(16 P_hi + P_lo) * scales[g, j]) * row scale (+
    bias[j]), each operation in float32 in int4_jit.combine_int4_atoms' order (its
    bits: a value's last bit moved flips a code of the next nibble rows, which
    the next layers carry). Lanes r.. come out 0. A tile whose rows run past
    the atoms' is copied out first (_combine_tile reads LANES rows)."""
    rs = np.zeros(LANES, np.float32)
    for lane in range(r):
        rs[lane] = row_scale[m0 + lane]
    if 2 * (m0 + LANES) <= p.shape[1]:
        _combine_tile(p, m0, n_pad, scales, rs, bias, has_bias, k, buf)
    else:
        part = np.zeros((p.shape[0], 2 * LANES, p.shape[2]), p.dtype)
        part[:, :2 * r] = p[:, 2 * m0:2 * (m0 + r)]
        _combine_tile(part, 0, n_pad, scales, rs, bias, has_bias, k, buf)
    if r < LANES:
        for i in range(k):
            for lane in range(r, LANES):
                buf[i, lane] = np.float32(0.0)


@njit(**_JIT)
def _nibble_out(buf, m0, r, k, signs, signed, block, hnorm, q, scale, lim, rotated, to_blocks, amax):
    """A tile's rows buf [K, LANES] rotated (the signs unless `signed`: in buf
    already; the butterflies of `block`; times hnorm), then either by blocks
    into `rotated` [K / block, M x block] (`to_blocks`: a factor's product
    follows) or quantized with one scale per row (max|x| / lim, 1 for a zero
    row or one holding a NaN) into the nibble rows of q [C1, R, C2] (uint8)."""
    if _rotate_tile(buf, m0, r, k, signs, signed, block, hnorm, to_blocks, rotated):
        return
    s = _tile_scales(buf, hnorm, amax, lim, scale, m0, r)
    half = k // 2
    hi_bytes = np.empty((half, LANES), np.uint8)  # the tile's nibble bytes (a vector loop), then into the atoms
    lo_bytes = np.empty((half, LANES), np.uint8)
    for i in range(half):
        for lane in range(LANES):
            c_even = np.int32(min(max(np.rint(buf[2 * i, lane] / s[lane]), -lim), lim))
            c_odd = np.int32(min(max(np.rint(buf[2 * i + 1, lane] / s[lane]), -lim), lim))
            hi_bytes[i, lane] = _nibbles(c_even + 8 >> 4, c_odd + 8 >> 4)
            lo_bytes[i, lane] = _nibbles(c_even, c_odd)
    c1, _, c2 = q.shape
    for lane in range(r):
        h = 2 * (m0 + lane)
        for a in range(c1):
            for b in range(c2):
                q[a, h, b] = hi_bytes[a * c2 + b, lane]
                q[a, h + 1, b] = lo_bytes[a * c2 + b, lane]


@njit(**_JIT)
def residual_tiles(p, n_pad, scales, row_scale, bias, has_bias,
                   first_norm, w1, e1, res, body_scale, has_scale, last_norm, w2, e2,
                   keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out,
                   signs, block, hnorm, q, scale, limit, rotated, to_blocks, tile_lo, tile_hi):
    """prefill_fused.residual_tiles with int4 edges: rows [M, K] (M = res's
    rows) combined from an int4 product's partials p (`_load_int4`); n1 =
    RMSNorm(x, w1) (`first_norm`, else n1 is x); total = n1 + res (times
    `body_scale` with `has_scale`: Gemma 4's layer output scale); n2 =
    RMSNorm(total, w2) (`last_norm`, else n2 is total: Gemma 4's FFN sum
    before the per-layer gate); each kept one stored [M, K]; n2 into the next int4
    operand's nibble rows q (`_nibble_out`), or rotated by blocks into
    `rotated` (`to_blocks`). Tiles tile_lo..tile_hi-1 (disjoint ranges may
    run at once on other threads); the pad rows zeroed by the range ending
    at the last tile (unless `to_blocks`: quantize_nibble_blocks_into_atoms')."""
    rows, k = res.shape
    tiles = (rows + LANES - 1) // LANES
    lim = np.float32(limit)
    buf = np.empty((k, LANES), np.float32)
    sums = np.empty(LANES, np.float64)
    amax = np.empty(LANES, np.float32)
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        _load_int4(p, n_pad, scales, row_scale, bias, has_bias, m0, r, k, buf)
        _scaled_body(buf, m0, r, k, first_norm, w1, e1, res, body_scale, has_scale, last_norm, w2, e2,
                     keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out, sums)
        _nibble_out(buf, m0, r, k, signs, False, block, hnorm, q, scale, lim, rotated, to_blocks, amax)
    if not to_blocks and tile_hi == tiles:
        zero_rows(q, 2 * rows)  # past the nibble rows


@njit(**_JIT)
def ffn_tiles(gate_p, gate_pad, gate_scales, gate_rs, gate_bias, gate_has_bias,
              up_p, up_pad, up_scales, up_rs, up_bias, up_has_bias, act, rows, k,
              signs, block, hnorm, q, scale, limit, rotated, to_blocks, tile_lo, tile_hi):
    """prefill_fused.ffn_tiles with int4 edges: gate and up combined from their
    int4 products' partials (`_load_int4`), act(gate) * up (times the
    rotation's signs: `_act_mul`), then into the next int4 operand's nibble
    rows (or by blocks into `rotated`), as residual_tiles' out edge."""
    tiles = (rows + LANES - 1) // LANES
    lim = np.float32(limit)
    g = np.empty((k, LANES), np.float32)
    u = np.empty((k, LANES), np.float32)
    amax = np.empty(LANES, np.float32)
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        _load_int4(gate_p, gate_pad, gate_scales, gate_rs, gate_bias, gate_has_bias, m0, r, k, g)
        _load_int4(up_p, up_pad, up_scales, up_rs, up_bias, up_has_bias, m0, r, k, u)
        _act_mul(g, u, act, signs, True)
        _nibble_out(g, m0, r, k, signs, True, block, hnorm, q, scale, lim, rotated, to_blocks, amax)
    if not to_blocks and tile_hi == tiles:
        zero_rows(q, 2 * rows)  # past the nibble rows


@njit(**_JIT)
def quantize_nibble_blocks_into_atoms(x, block, q, scale, limit, lo, hi):
    """Rows lo..hi-1 of [M, K] given by blocks, x [K / block, M x block] (row
    m's block b: x[b, m * block:(m + 1) * block], as the tiles leave them for
    the factor's product), quantized as _nibble_out quantizes a tile (scale
    max|x| / limit, 1 for a zero row or one holding a NaN; codes rint(x /
    scale) clipped) into the nibble rows of q [C1, R, C2] (uint8); the pad
    rows zeroed by the call whose range ends at M. GATHERED rows are taken
    from the blocks at once (their blocks lie side by side in x: one run of
    GATHERED x block values per block, where a row alone is a fresh page per
    block), and each nibble row goes into its atoms 8 bytes at a time
    (Qwen2.5-1.5B's K = 8960, 128 rows: 1.6 -> 1.3 ms)."""
    blocks = x.shape[0]
    rows = x.shape[1] // block
    c1, _, c2 = q.shape
    if c2 % 8:
        raise ValueError("int8 atoms come in 16 bytes")
    k = blocks * block
    lim = np.float32(limit)
    half = k // 2
    gathered = np.empty((GATHERED, k), np.float32)  # rows from their blocks, and their bits as int32
    box = np.empty(1, np.int32)
    hi_bytes = np.empty(half, np.uint8)
    lo_bytes = np.empty(half, np.uint8)
    hi_words, lo_words, q_words = hi_bytes.view(np.uint64), lo_bytes.view(np.uint64), q.view(np.uint64)
    per_atom = c2 // 8
    for m0 in range(lo, hi, GATHERED):
        n = min(GATHERED, hi - m0)
        for b in range(blocks):
            src = x[b]
            for r in range(n):
                base, dst = (m0 + r) * block, gathered[r]
                for j in range(block):
                    dst[b * block + j] = src[base + j]
        for r in range(n):
            m, row = m0 + r, gathered[r]
            box[0] = _abs_max_bits(k, row.view(np.int32))  # an integer max (vectorised); a NaN's bits above inf's
            amax = box.view(np.float32)[0]
            s = np.float32(1.0) if box[0] > np.int32(0x7F800000) or not amax > 0 else amax / lim
            scale[m] = s
            for i in range(half):
                c_even = np.int32(min(max(np.rint(row[2 * i] / s), -lim), lim))
                c_odd = np.int32(min(max(np.rint(row[2 * i + 1] / s), -lim), lim))
                hi_bytes[i] = _nibbles(c_even + 8 >> 4, c_odd + 8 >> 4)
                lo_bytes[i] = _nibbles(c_even, c_odd)
            h = 2 * m
            for a in range(c1):
                for w in range(per_atom):
                    q_words[a, h, w] = hi_words[a * per_atom + w]
                    q_words[a, h + 1, w] = lo_words[a * per_atom + w]
    if hi == rows:
        zero_rows(q, 2 * rows)  # past the nibble rows


@njit(**_JIT)
def combine_tiles(p, n_pad, scales, row_scale, bias, has_bias, out_t, tile_lo, tile_hi):
    """A many-row int4 in edge on its own (attention's q, k, v): `_load_int4`'s
    values written as column-major rows, given as out_t [K, M] (their
    transpose, C order: a tile's lanes contiguous, as prefill_fused.in_edge_tiles
    writes the int8 build's, for RoPE's and attention's tokens-inner loops),
    tiles tile_lo..tile_hi-1."""
    k, rows = out_t.shape
    buf = np.empty((k, LANES), np.float32)
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        _load_int4(p, n_pad, scales, row_scale, bias, has_bias, m0, r, k, buf)
        for i in range(k):
            dst = out_t[i]
            for lane in range(r):
                dst[m0 + lane] = buf[i, lane]
