"""Compiled (numba) row kernels for the prepared LLM CPU steps
(runtime/llm/prepared.py): one call per step instead of a numpy call per
operation, whose fixed cost (5-20 us each) was most of a decode token's host
time at one row.

The arithmetic is numpy's, element for element: the same float32/float64
operations in the same order (no fastmath, so no reassociation or fused
multiply-adds), and a row sum reproduces numpy's pairwise summation
(`pairwise_sum`), so RMSNorm, QuantizeRows (with its rotation), DequantizeRows
and RoPE give the plain kernels' bits (tests/llm/test_plan.py).

These are not a second reference: runtime/llm/kernels.py and
runtime/kernels/hadamard.py (numpy) are the one reference, run by the
interpreter and the tests; the plans run these, and the numpy kernels only
for shapes a compiled kernel cannot bound.

`cache=True`: a machine compiles each kernel once (a few seconds, the first
time an LLM runs) and later processes load the compiled code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import narrow_bits, widen_bits
from rkc.runtime.llm.prefill_fused import quantize_into_atoms
from rkc.runtime.llm.prefill_kernels import LANES, _butterflies, _signed_tile, scaled_amax

# error_model "numpy": a float division by zero gives numpy's inf / NaN instead of raising, so no
# check per element stops a loop from vectorising (a 8960-wide SiLU's divisions 9 -> 4.8 us); the
# quotients of nonzero divisors are the same bits
_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}
_BLOCK = 128  # numpy's PW_BLOCKSIZE: the pairwise sum's leaf


@njit(**_JIT)
def _leaf_squares(x, m, lo, n):
    """Sum of x[m, lo:lo+n] ** 2 (n <= 128) as numpy's pairwise leaf adds it:
    sequentially below 8, else eight accumulators combined as a tree."""
    if n < 8:
        res = np.float32(0.0)
        for i in range(n):
            v = x[m, lo + i]
            res += v * v
        return res
    r = np.empty(8, np.float32)
    for j in range(8):
        v = x[m, lo + j]
        r[j] = v * v
    i = 8
    end = n - n % 8
    while i < end:
        for j in range(8):
            v = x[m, lo + i + j]
            r[j] += v * v
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        v = x[m, lo + i]
        res += v * v
        i += 1
    return res


@njit(**_JIT)
def _pairwise_squares(x, m, k):
    """Sum of x[m, :k] ** 2 in float32, in numpy's pairwise order
    (numpy/_core/src/umath/loops_utils.h: leaves of at most 128, a longer run
    split in halves at a multiple of eight, left + right). Iterative, with an
    explicit stack: numba's cache cannot reload a recursive function."""
    if k <= _BLOCK:  # one leaf: no stack
        return _leaf_squares(x, m, 0, k)
    depth = 64
    state = np.empty((3, depth), np.int64)  # one allocation: what a short row's sum spent most on
    lo, cnt, stage = state[0], state[1], state[2]  # stage 0: split next, 1: left pending, 2: right pending
    left = np.empty(depth, np.float32)
    lo[0], cnt[0], stage[0] = 0, k, 0
    sp = 1
    result = np.float32(0.0)
    while sp > 0:
        top = sp - 1
        n = cnt[top]
        if n <= _BLOCK or stage[top] == 3:
            v = _leaf_squares(x, m, lo[top], n) if n <= _BLOCK else left[top]
            sp -= 1
            if sp == 0:
                result = v
            else:
                p = sp - 1
                if stage[p] == 1:
                    left[p] = v
                else:
                    left[p] = left[p] + v  # the parent's left + this right half
                    stage[p] = 3
            continue
        half = n // 2
        half -= half % 8
        if stage[top] == 0:
            stage[top] = 1
            lo[sp], cnt[sp], stage[sp] = lo[top], half, 0
        else:
            stage[top] = 2
            lo[sp], cnt[sp], stage[sp] = lo[top] + half, n - half, 0
        sp += 1
    return result


@njit(**_JIT)
def rms_norm(x, w, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * w over rows of x [M, K] (float32).
    The squares are summed pairwise whatever x's layout, as kernels.rms_norm
    sums them (it squares into a C-order array)."""
    rows, k = x.shape
    kf = np.float64(k)
    for m in range(rows):
        s = _pairwise_squares(x, m, k)
        ms = np.float32(np.float64(s) / kf) + eps  # np.mean: the float32 sum over an intp count, in float64
        root = np.float32(np.sqrt(ms))
        for i in range(k):
            out[m, i] = (x[m, i] / root) * w[i]


@njit(**_JIT)
def dequantize_rows(acc, row_scale, ch_scale, bias, has_bias, out):
    """out = acc * row scale * channel scale (+ bias), in float64, rounded once to float32."""
    rows, n = acc.shape
    for m in range(rows):
        rs = np.float64(row_scale[m])
        for j in range(n):
            y = (np.float64(acc[m, j]) * rs) * np.float64(ch_scale[j])
            if has_bias:
                y += np.float64(bias[j])
            out[m, j] = np.float32(y)


@njit(**_JIT)
def hadamard_rows(x, signs, block, norm, out):
    """out = blockwise orthonormal Walsh-Hadamard transform of x * signs
    (rows [M, K], blocks of `block`, a power of two): the butterflies of
    runtime/kernels/hadamard.py, pairing i with i + 1, then 2, 4, ..., in
    its self-sorting (Stockham) order: each stage reads neighbours from one
    scratch row and writes sums to the first half of each block of the
    other, differences to the second; the same pairs of the same values at
    every stage, so the same bits. One simple loop per stage and block,
    which the compiler vectorises (a 2048-wide row: 11 -> 2.7 us, from
    butterflies over runs of 1, 2, 4 ...)."""
    _hadamard_stages(x, signs, block, norm, out, np.empty((2, x.shape[1]), np.float32))


@njit(**_JIT)
def _hadamard_stages(x, signs, block, norm, out, work):
    """hadamard_rows with its two scratch rows `work` [2, K]."""
    rows, k = x.shape
    half = block // 2
    for m in range(rows):
        src = work[0]
        dst = work[1]
        for i in range(k):
            src[i] = x[m, i] * signs[i]
        h = 1
        while h < block:
            for base in range(0, k, block):
                s = src[base:base + block]
                d = dst[base:base + block]
                for j in range(half):
                    u = s[2 * j]
                    v = s[2 * j + 1]
                    d[j] = u + v
                    d[j + half] = u - v
            src, dst = dst, src
            h *= 2
        for i in range(k):
            out[m, i] = src[i] * norm


@njit(**_JIT)
def unhadamard_rows(x, signs, block, norm, out):
    """out = the inverse of hadamard_rows: the transform of x (the same
    butterflies, scaled by `norm`), then times the signs, in
    hadamard.unrotate's order (fwht, then the signs)."""
    rows, k = x.shape
    ones = np.ones(k, np.float32)  # (x * 1 is x: the transform's copy of its input)
    _hadamard_stages(x, ones, block, norm, out, np.empty((2, k), np.float32))
    for m in range(rows):
        for i in range(k):
            out[m, i] = out[m, i] * signs[i]


@njit(**_JIT)
def quantize_rows(x, q, scale):
    """Symmetric int8 per row: scale = max|x| / 127 (1 for a zero row),
    q = clip(rint(x / scale), -127, 127)."""
    rows, k = x.shape
    for m in range(rows):
        amax = np.float32(0.0)
        for i in range(k):
            a = abs(x[m, i])
            if a > amax or a != a:  # a NaN stays the maximum, as in numpy's max (so the scale is 1)
                amax = a
        s = amax / np.float32(127.0) if amax > 0 else np.float32(1.0)
        scale[m] = s
        for i in range(k):
            t = np.rint(x[m, i] / s)
            q[m, i] = np.int8(min(max(t, np.float32(-127.0)), np.float32(127.0)))


@njit(**_JIT)
def rope(x, cos, sin, dims, neox, out):
    """Rotary embedding of x [T, H, D] (the first `dims` of D) by the angles
    whose cos/sin [T, dims/2] are given: NeoX pairs (i, i + dims/2), else (2i, 2i + 1)."""
    t_, heads, d = x.shape
    half = dims // 2
    for t in range(t_):
        for hh in range(heads):
            for i in range(dims, d):
                out[t, hh, i] = x[t, hh, i]
            for i in range(half):
                a_i, b_i = (i, i + half) if neox else (2 * i, 2 * i + 1)
                a = x[t, hh, a_i]
                b = x[t, hh, b_i]
                c = cos[t, i]
                s = sin[t, i]
                out[t, hh, a_i] = a * c - b * s
                out[t, hh, b_i] = a * s + b * c



@njit(**_JIT)
def scores_shift_columns(s, scale, kpos, qcol, window):
    """Attention's scores s [Hkv, P, C] in place (column c: a query at
    qcol[c]), as kernels.attend takes them to the exp: times `scale`
    (float32), -inf for a key the column's query cannot see (after it, or
    `window` or more behind), then minus each (head, column)'s maximum over P
    (a NaN stays the maximum, as in numpy's max)."""
    hkv, p_, c_ = s.shape
    neg = np.float32(-np.inf)
    m = np.empty(c_, np.float32)
    for k in range(hkv):
        for p in range(p_):
            kp = kpos[p]
            for c in range(c_):
                v = s[k, p, c] * scale
                if kp > qcol[c] or (window != 0 and qcol[c] - kp >= window):
                    v = neg
                s[k, p, c] = v
                if p == 0 or v > m[c] or v != v:
                    m[c] = v
        for p in range(p_):
            for c in range(c_):
                s[k, p, c] = s[k, p, c] - m[c]


@njit(**_JIT)
def scores_shift(s, scale, kpos, p0, window):
    """Decode attention's scores [Hkv, P, G]: scores_shift_columns with every
    column's query at p0."""
    scores_shift_columns(s, scale, kpos, np.full(s.shape[2], p0, np.int64), window)


@njit(**_JIT)
def normalize_columns(e, out):
    """out[k, :, g] = e[k, :, g] / its sum, the sum taken in sequence over P
    (float32), as numpy reduces an axis that is not the innermost in memory
    (the einsum's scores [Hkv, P, G] with G > 1)."""
    hkv, p_, g_ = e.shape
    t = np.empty(g_, np.float32)
    for k in range(hkv):
        for g in range(g_):
            t[g] = e[k, 0, g]
        for p in range(1, p_):
            for g in range(g_):
                t[g] += e[k, p, g]
        for p in range(p_):
            for g in range(g_):
                out[k, p, g] = e[k, p, g] / t[g]


@njit(**_JIT)
def norm_add_norm(x, w1, eps1, first_norm, res, scale, has_scale, w2, eps2, last_norm, n1, total, scaled, n2):
    """The residual stretch between two NPU segments, over rows [M, K]:
    n1 = RMSNorm(x, w1) (when `first_norm`; else n1 is x), total = n1 + res,
    scaled = total * scale[0] (when `has_scale`: ScaleBy), n2 =
    RMSNorm(scaled or total, w2) (when `last_norm`): each as the plain
    kernels compute it (float32, numpy's order)."""
    if first_norm:
        rms_norm(x, w1, eps1, n1)
    else:
        n1[...] = x
    rows, k = total.shape
    for m in range(rows):
        for i in range(k):
            total[m, i] = n1[m, i] + res[m, i]
    summed = total
    if has_scale:
        s = scale[0]
        for m in range(rows):
            for i in range(k):
                scaled[m, i] = total[m, i] * s
        summed = scaled
    if last_norm:
        rms_norm(summed, w2, eps2, n2)


_CHUNK = 1024  # elements of a row's atoms gathered into a contiguous buffer at a time


@njit(**_JIT)
def half_atoms_to_float(src, n, out):
    """One row of an fp16 NPU output, [C1, C2] atoms (bits, uint16), widened
    to float32 bits (uint32) into out[:n] with numpy's bits (`widen_bits`),
    at a fraction of numpy's per-element cost. Whole atoms of 8 (fp16's C2)
    are gathered by chunks into a contiguous buffer first: widened there the
    loop vectorises, which the strided atoms defeat (a 262144-wide head:
    550 -> 90 us)."""
    c1, c2 = src.shape
    full = n // 8 if c2 == 8 else 0
    buf = np.empty(_CHUNK, np.uint16)
    per = _CHUNK // 8
    for a0 in range(0, full, per):
        atoms = min(per, full - a0)
        for a in range(atoms):
            for b in range(8):
                buf[a * 8 + b] = src[a0 + a, b]
        dst = out[a0 * 8:(a0 + atoms) * 8]
        for i in range(atoms * 8):
            dst[i] = widen_bits(buf[i])
    for a in range(full, c1):
        base = a * c2
        for b in range(min(c2, n - base)):
            out[base + b] = widen_bits(src[a, b])


@njit(**_JIT)
def dequantize_atoms(src, n, row_scale, ch_scale, bias, has_bias, out):
    """dequantize_rows of one row of int32 NPU accumulators read in their
    [C1, C2] atoms: the same float64 products, rounded once, into out[:n].
    Whole atoms of 4 (int32's C2) run a fixed inner loop, which the compiler
    vectorises (a 262144-wide head: 470 -> 150 us)."""
    c1, c2 = src.shape
    rs = np.float64(row_scale)
    full = n // 4 if c2 == 4 else 0
    if has_bias:
        for a in range(full):
            for b in range(4):
                j = a * 4 + b
                out[j] = np.float32((np.float64(src[a, b]) * rs) * np.float64(ch_scale[j]) + np.float64(bias[j]))
    else:
        for a in range(full):
            for b in range(4):
                j = a * 4 + b
                out[j] = np.float32((np.float64(src[a, b]) * rs) * np.float64(ch_scale[j]))
    for a in range(full, c1):
        base = a * c2
        for b in range(min(c2, n - base)):
            j = base + b
            y = (np.float64(src[a, b]) * rs) * np.float64(ch_scale[j])
            if has_bias:
                y += np.float64(bias[j])
            out[j] = np.float32(y)


@njit(**_JIT)
def dequantize_atoms_partials(src0, src1, n, row_scale, ch_scale, bias, has_bias, out):
    """dequantize_atoms of one row whose sums come as two int32 partials over
    K ranges (DequantizeRows with partials = 2: a product wider than one
    task's K), each in its [C1, C2] atoms: the partials added exactly (int64),
    then the same float64 products, rounded once, into out[:n]."""
    c1, c2 = src0.shape
    rs = np.float64(row_scale)
    for a in range(c1):
        base = a * c2
        for b in range(min(c2, n - base)):
            j = base + b
            y = (np.float64(np.int64(src0[a, b]) + np.int64(src1[a, b])) * rs) * np.float64(ch_scale[j])
            if has_bias:
                y += np.float64(bias[j])
            out[j] = np.float32(y)


@njit(**_JIT)
def dequantize_atoms_terms(src0, src1, n, rs0, rs1, ch_scale, bias, has_bias, out):
    """dequantize_atoms of a row quantized as two int8 terms (its value and
    its residual: weights.dequantize with terms=2): each term's sums times
    its row scale times the channel scale, in float64, the second added to
    the first, then the bias; rounded once."""
    c1, c2 = src0.shape
    r0, r1 = np.float64(rs0), np.float64(rs1)
    for a in range(c1):
        base = a * c2
        for b in range(min(c2, n - base)):
            j = base + b
            ch = np.float64(ch_scale[j])
            y = (np.float64(src0[a, b]) * r0) * ch
            y += (np.float64(src1[a, b]) * r1) * ch
            if has_bias:
                y += np.float64(bias[j])
            out[j] = np.float32(y)


@njit(**_JIT)
def quantize_terms_into_atoms(x, q, scale, terms):
    """weights.quantize_rows of one row x [1, K] in two terms, the codes
    written into int8 atoms q [C1, R, C2] as quantize_into_atoms writes rows:
    term 1 (row 0) quantizes x, term 2 (row 1) the float32 residual
    x - q1 * s1 (`terms`: a [2, K] buffer for the two rows); scale [2]."""
    k, c2 = x.shape[1], q.shape[2]
    quantize_into_atoms(x, q, scale[:1])
    s = scale[0]
    for i in range(k):
        terms[0, i] = x[0, i]
        terms[1, i] = x[0, i] - np.float32(q[i // c2, 0, i % c2]) * s
    quantize_into_atoms(terms, q, scale)  # (row 0's codes again, the same)


@njit(**_JIT)
def gelu_tanh_argument(x, c, kk, t):
    """t = c * (x + kk * x * x * x) over rows x [M, K], float32, in
    GeluTanh's order (kernels.gelu_tanh: the tanh's argument)."""
    rows, k = x.shape
    for m in range(rows):
        for i in range(k):
            v = x[m, i]
            t[m, i] = c * (v + ((kk * v) * v) * v)


@njit(**_JIT)
def gelu_tanh_times(x, th, up, act, out):
    """act = 0.5 * x * (1 + th) (th: the tanh of gelu_tanh_argument's t), out =
    act * up, float32 in GeluTanh's and Mul's order: the gated FFN's product."""
    rows, k = x.shape
    for m in range(rows):
        for i in range(k):
            a = (np.float32(0.5) * x[m, i]) * (np.float32(1.0) + th[m, i])
            act[m, i] = a
            out[m, i] = a * up[m, i]


@njit(**_JIT)
def scale_row(x, factor):
    """x *= factor over rows x [M, K] (float32: kernels.scale's product), in place."""
    rows, k = x.shape
    for m in range(rows):
        for i in range(k):
            x[m, i] = x[m, i] * factor


@njit(**_JIT)
def silu_argument(x, exp_max, t):
    """t = min(-x, exp_max) over rows x [M, K] (a NaN stays NaN, as
    np.minimum keeps it): the exp's argument of kernels.silu_values."""
    rows, k = x.shape
    for m in range(rows):
        for i in range(k):
            v = -x[m, i]
            t[m, i] = v if v <= exp_max or v != v else exp_max


@njit(**_JIT)
def silu_times(x, e, exp_max, up, act, out):
    """act = x / (1 + e) (e: the exp of silu_argument's t; an infinite
    denominator where -x > exp_max), out = act * up: kernels.silu_values and
    Mul's float32 operations in their order, the gated FFN's product."""
    rows, k = x.shape
    inf = np.float32(np.inf)
    for m in range(rows):
        for i in range(k):
            v = x[m, i]
            den = np.float32(1.0) + e[m, i]
            if -v > exp_max:
                den = inf
            a = v / den
            act[m, i] = a
            out[m, i] = a * up[m, i]


@njit(**_JIT)
def query_front(q, qw, qeps, norms, qn, qx, cos, sin, dims, neox, qr):
    """A one-row attention stretch's query: with `norms`, rms_norm of
    q [H, hd] into qn (the rows of qx); RoPE of qx [1, H, hd] into qr."""
    if norms:
        rms_norm(q, qw, qeps, qn)
    rope(qx, cos, sin, dims, neox, qr)


@njit(**_JIT)
def attention_front(q, k, v, qw, qeps, kw, keps, vw, veps, norms, v_norm, qn, kn, vn, qx, kx, cos, sin, dims, neox,
                    qr, kr, kr_bits, v_bits, k16, v16, row):
    """A one-row attention stretch's work between its in edges and its
    attention, in one call (each part the kernel the step-by-step stretch
    calls, so the same bits): the query's (query_front); with `norms`, the k
    norm (rms_norm of k [Hkv, hd] into kn: the rows of kx); with `v_norm`,
    v's plain norm (rms_norm of v [Hkv, hdv] by vw, ones, into vn); RoPE of
    kx into kr; then the cache's new row, kr and v (their float32 bits,
    normed or not, [1, Hkv, hd(v)]) narrowed to fp16 into row `row` of k16 /
    v16 (fp16 bits [capacity, Hkv, hd(v)]) as numpy's astype rounds them
    (half.narrow_bits)."""
    query_front(q, qw, qeps, norms, qn, qx, cos, sin, dims, neox, qr)
    if norms:
        rms_norm(k, kw, keps, kn)
    if v_norm:
        rms_norm(v, vw, veps, vn)
    rope(kx, cos, sin, dims, neox, kr)
    _, hkv, hd = kr_bits.shape
    for h in range(hkv):
        for i in range(hd):
            k16[row, h, i] = narrow_bits(kr_bits[0, h, i])
        for i in range(v_bits.shape[2]):
            v16[row, h, i] = narrow_bits(v_bits[0, h, i])


# -- int4 products' edges (runtime/llm/int4_rows.py: W4A8 by two nibble rows per row) ----------------------
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
