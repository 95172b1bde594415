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
from numba import njit, types
from numba.extending import overload

from rkc.runtime.half import narrow_bits, narrow_into_atoms, widen_bits
from rkc.runtime.llm.prefill_fused import quantize_into_atoms
from rkc.runtime.llm.prefill_kernels import _hadamard_stages, activation, int8_code, int8_scale

# error_model "numpy": a float division by zero gives numpy's inf / NaN instead of raising, so no
# check per element stops a loop from vectorising (a 8960-wide SiLU's divisions 9 -> 4.8 us); the
# quotients of nonzero divisors are the same bits
_JIT = {"cache": True, "nogil": True, "error_model": "numpy", "fastmath": False}
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
        s = int8_scale(amax)
        scale[m] = s
        for i in range(k):
            q[m, i] = int8_code(x[m, i] / s)


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


def row_value(x):  # pragma: no cover - compiled through the overload below
    """x's value: a scalar as is, a one-element array's element (a decode
    step hands the kernels its row scale slot, [1] float32, not x[0]: a numpy
    scalar argument costs more to dispatch, and the indexing more again)."""


@overload(row_value, jit_options=_JIT, inline="always")
def _row_value_impl(x):
    if isinstance(x, types.Array):
        return lambda x: x[0]
    return lambda x: x


@njit(**_JIT)
def dequantize_atoms(src, n, row_scale, ch_scale, bias, has_bias, out):
    """dequantize_rows of one row of int32 NPU accumulators read in their
    [C1, C2] atoms: the same float64 products, rounded once, into out[:n].
    Whole atoms of 4 (int32's C2) run a fixed inner loop, which the compiler
    vectorises (a 262144-wide head: 470 -> 150 us). row_scale: a scalar or
    its [1] array (row_value)."""
    c1, c2 = src.shape
    rs = np.float64(row_value(row_scale))
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


# -- one compiled call per int8 stretch of a decode token (issue 37): a token's ~70 stretches each paid
# ~5 dispatches, a numpy product and their glue (docs/notes/2026-12-07-decode-int8-steps.md)

@njit(**_JIT)
def rotate_row(x, signs, block, norm, factor, work):
    """One row x [1, K] rotated as an int8 edge's QuantizeRows rotates it
    (hadamard_rows' signs, butterflies and norm, then the block-mixing
    `factor` [K / block]^2 when it has rows): the rotated row, a row of
    `work` [4, K] (x itself when `block` is 0: no rotation). The factor's
    sums in float32, in j order (not BLAS's: within a float32 ulp or two of
    float64, tests/llm/test_decode_stretches.py)."""
    if block == 0:
        return x[:1]
    rot = work[2:3]
    _hadamard_stages(x, signs, block, norm, rot, work[:2])
    if factor.shape[0] == 0:
        return rot
    _mix_blocks(rot, factor, block, work[3:4])
    return work[3:4]


@njit(**_JIT)
def _mix_blocks(x, factor, block, out):
    """out [1, K] = the row x's blocks mixed by factor [K / block]^2 (block i
    of out = sum over j of factor[i, j] times block j; float32, in j order)."""
    nb = factor.shape[0]
    for i in range(nb):
        dst = out[0, i * block:(i + 1) * block]
        dst[:] = 0
        for j in range(nb):
            f = factor[i, j]
            src = x[0, j * block:(j + 1) * block]
            for t in range(block):
                dst[t] += f * src[t]


@njit(**_JIT)
def rotate_quantize_row(x, signs, block, norm, factor, work, codes, scale):
    """QuantizeRows of one row x [1, K] into int8 atoms codes [C1, R, C2]
    (pad rows zeroed), its scale into scale[0]: rotate_row, then
    quantize_into_atoms, one call."""
    quantize_into_atoms(rotate_row(x, signs, block, norm, factor, work), codes, scale)


@njit(**_JIT)
def _stretch_value(last_norm, has_scale, n2, scaled, total):
    """The value a residual stretch hands on (norm_add_norm's buffers): the
    last norm's output, else the scaled sum, else the sum."""
    if last_norm:
        return n2
    if has_scale:
        return scaled
    return total


@njit(**_JIT)
def residual_row(src, n, row_scale, ch_scale, bias, has_bias, flat, x, w1, eps1, first_norm, res, scale, has_scale,
                 w2, eps2, last_norm, n1, total, scaled, n2, signs, block, norm, factor, work, codes, qscale):
    """An int8 residual stretch of one row in one call: dequantize_atoms of
    the segment's int32 row into x (`flat`: x's values), norm_add_norm,
    then rotate_quantize_row of its last value into the next segment's
    codes: the per-step kernels' arithmetic, but for the factor's sums.
    eps1, eps2 and norm may come as floats (a decode step's: cheaper
    to dispatch than numpy float32 scalars), narrowed to float32 here: the
    F32 values the steps hold, the same bits."""
    dequantize_atoms(src, n, row_scale, ch_scale, bias, has_bias, flat)
    norm_add_norm(x, w1, np.float32(eps1), first_norm, res, scale, has_scale, w2, np.float32(eps2), last_norm, n1,
                  total, scaled, n2)
    y = _stretch_value(last_norm, has_scale, n2, scaled, total)
    rotate_quantize_row(y, signs, block, np.float32(norm), factor, work, codes, qscale)


@njit(**_JIT)
def residual_half_row(src, n, flat, x, w1, eps1, first_norm, res, scale, has_scale, w2, eps2, last_norm, n1, total,
                      scaled, n2, half):
    """A fp16 residual stretch of one row in one call (residual_row's form
    for fp16 products): half_atoms_to_float of the segment's fp16 row into x
    (`flat`: x's bits), norm_add_norm, then its last value rounded to fp16
    into the next segment's atoms `half` (half.narrow_into_atoms): the
    three calls' values, one dispatch."""
    half_atoms_to_float(src, n, flat)
    norm_add_norm(x, w1, eps1, first_norm, res, scale, has_scale, w2, eps2, last_norm, n1, total, scaled, n2)
    y = _stretch_value(last_norm, has_scale, n2, scaled, total)
    narrow_into_atoms(y.view(np.uint32), half)


@njit(**_JIT)
def gated_row(gate, g_rs, g_ch, g_bias, g_has_bias, up, u_rs, u_ch, u_bias, u_has_bias, n, act, g_flat, u_flat,
              g, u, a, hidden, signs, block, norm, factor, work, codes, qscale):
    """An int8 gated FFN stretch of one row in one call: dequantize_atoms of
    the gate's and up's int32 rows into g and u (g_flat, u_flat: their
    values), a = act(g) (ACT_GELU_TANH: 0.5 g (1 + tanh(C (g + K g^3))) as
    g / (1 + exp(-2 C (g + K g^3))); ACT_SILU: g / (1 + exp(-g));
    prefill_kernels.activation, as the prefill FFN tiles compute them), hidden = a * u, then
    rotate_quantize_row of hidden into the down product's codes. Float32
    within a few ulps of float64 (tests/llm/test_decode_stretches.py), not
    numpy's tanh / exp bits. g_rs, u_rs: scalars or [1] arrays (row_value);
    norm a float32 or a float (narrowed here)."""
    dequantize_atoms(gate, n, g_rs, g_ch, g_bias, g_has_bias, g_flat)
    dequantize_atoms(up, n, u_rs, u_ch, u_bias, u_has_bias, u_flat)
    for i in range(n):
        v = activation(g[0, i], act)
        a[0, i] = v
        hidden[0, i] = v * u[0, i]
    rotate_quantize_row(hidden, signs, block, np.float32(norm), factor, work, codes, qscale)


@njit(**_JIT)
def dequantize_three(src0, n0, rs0, ch0, bias0, has_bias0, out0, src1, n1, rs1, ch1, bias1, has_bias1, out1,
                     src2, n2, rs2, ch2, bias2, has_bias2, out2):
    """dequantize_atoms of three int32 rows (an attention stretch's q, k and
    v in edges) in one call; a row of width 0 is skipped. rs0-rs2: scalars
    or [1] arrays (row_value)."""
    dequantize_atoms(src0, n0, rs0, ch0, bias0, has_bias0, out0)
    dequantize_atoms(src1, n1, rs1, ch1, bias1, has_bias1, out1)
    if n2:
        dequantize_atoms(src2, n2, rs2, ch2, bias2, has_bias2, out2)


@njit(**_JIT)
def half_three(src0, n0, out0, src1, n1, out1, src2, n2, out2):
    """half_atoms_to_float of three fp16 rows (an attention stretch's q, k
    and v in edges) in one call; a row of width 0 is skipped."""
    half_atoms_to_float(src0, n0, out0)
    half_atoms_to_float(src1, n1, out1)
    if n2:
        half_atoms_to_float(src2, n2, out2)


@njit(**_JIT)
def embedding_row(view, token, kg, cols, row_scale, signs, block, norm, factor_t, ones, factor, w, eps, work,
                  embd, scaled, normed, o_signs, o_block, o_norm, o_factor, o_work, codes, qscale):
    """A decode token's embedding stretch in one call: its row of the packed
    int8 head (view [groups, C / 32, kg, 32], kernels.packed_view) times its
    row scale, rotated back (x R^T: factor_t's block mixing when it has rows,
    the butterflies, the signs; block 0: not rotated) into embd, times
    `factor` (Scale) into scaled, RMSNorm by w into normed, then
    rotate_quantize_row into the first segment's codes. Float32."""
    g, r = token // kg, token % kg
    tile = view.shape[3]
    rs = row_scale[token]
    for t in range(view.shape[1]):
        for c in range(tile):
            j = t * tile + c
            if j < cols:
                embd[0, j] = np.float32(view[g, t, r, c]) * rs
    if block:
        src = embd
        if factor_t.shape[0]:
            _mix_blocks(embd, factor_t, block, work[3:4])
            src = work[3:4]
        _hadamard_stages(src, ones, block, norm, work[2:3], work[:2])
        for i in range(cols):
            embd[0, i] = work[2, i] * signs[i]
    for i in range(cols):
        scaled[0, i] = embd[0, i] * factor
    rms_norm(scaled, w, eps, normed)
    rotate_quantize_row(normed, o_signs, o_block, o_norm, o_factor, o_work, codes, qscale)
