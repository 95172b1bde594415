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

_JIT = {"cache": True, "nogil": True}
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
    depth = 64
    lo = np.zeros(depth, np.int64)
    cnt = np.zeros(depth, np.int64)
    stage = np.zeros(depth, np.int64)  # 0: split next, 1: left pending, 2: right pending
    left = np.zeros(depth, np.float32)
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
    (rows [M, K], blocks of `block`, a power of two): butterflies pairing i
    with i + 1, then 2, 4, ... (runtime/kernels/hadamard.py's pairs and order;
    the pairs of one stage are independent, so the loops may visit them in
    any order). Each block is transformed in a contiguous scratch row, whose
    inner loops the compiler vectorises."""
    rows, k = x.shape
    buf = np.empty(block, np.float32)
    for m in range(rows):
        for b in range(0, k, block):
            for i in range(block):
                buf[i] = x[m, b + i] * signs[b + i]
            h = 1
            while h < block:
                if h == 1:
                    for i in range(0, block, 2):
                        u = buf[i]
                        v = buf[i + 1]
                        buf[i] = u + v
                        buf[i + 1] = u - v
                else:
                    for i in range(0, block, 2 * h):
                        lo = buf[i:i + h]
                        hi = buf[i + h:i + 2 * h]
                        for j in range(h):
                            u = lo[j]
                            v = hi[j]
                            lo[j] = u + v
                            hi[j] = u - v
                h *= 2
            for i in range(block):
                out[m, b + i] = buf[i] * norm


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
def scores_shift(s, scale, kpos, p0, window):
    """Decode attention's scores [Hkv, P, G] in place, as kernels.attend
    takes them before the exp: times `scale` (float32), -inf for a key the
    query at p0 cannot see (after it, or `window` or more behind), then minus
    each (head, group) column's maximum (a NaN stays the maximum, as in numpy's max)."""
    hkv, p_, g_ = s.shape
    neg = -np.inf
    m = np.empty(g_, np.float32)
    for k in range(hkv):
        for p in range(p_):
            seen = kpos[p] <= p0 and (window == 0 or p0 - kpos[p] < window)
            for g in range(g_):
                v = s[k, p, g] * scale if seen else neg
                s[k, p, g] = v
                if p == 0 or v > m[g] or v != v:
                    m[g] = v
        for p in range(p_):
            for g in range(g_):
                s[k, p, g] = s[k, p, g] - m[g]


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
def norm_add_norm(x, w1, eps1, first_norm, res, w2, eps2, n1, total, n2):
    """The residual stretch between two NPU segments, over rows [M, K]:
    n1 = RMSNorm(x, w1) (when `first_norm`; else n1 is x), total = n1 + res,
    n2 = RMSNorm(total, w2): each as rms_norm computes it (float32, numpy's order)."""
    if first_norm:
        rms_norm(x, w1, eps1, n1)
    else:
        n1[...] = x
    rows, k = total.shape
    for m in range(rows):
        for i in range(k):
            total[m, i] = n1[m, i] + res[m, i]
    rms_norm(total, w2, eps2, n2)


@njit(**_JIT)
def float_to_half_atoms(x, n, dst):
    """A float32 row (bits, uint32) x[:n] narrowed to fp16 bits into an NPU
    input's [C1, C2] atoms (`narrow_bits`: numpy's bits); channels past n zero."""
    c1, c2 = dst.shape
    for a in range(c1):
        base = a * c2
        for b in range(c2):
            j = base + b
            dst[a, b] = narrow_bits(x[j]) if j < n else np.uint16(0)


@njit(**_JIT)
def half_atoms_to_float(src, n, out):
    """One row of an fp16 NPU output, [C1, C2] atoms (bits, uint16), widened
    to float32 bits (uint32) into out[:n] with numpy's bits (`widen_bits`),
    at a fraction of numpy's per-element cost."""
    c1, c2 = src.shape
    for a in range(c1):
        base = a * c2
        for b in range(min(c2, n - base)):
            out[base + b] = widen_bits(src[a, b])


@njit(**_JIT)
def dequantize_atoms(src, n, row_scale, ch_scale, bias, has_bias, out):
    """dequantize_rows of one row of int32 NPU accumulators read in their
    [C1, C2] atoms: the same float64 products, rounded once, into out[:n]."""
    c1, c2 = src.shape
    rs = np.float64(row_scale)
    for a in range(c1):
        base = a * c2
        for b in range(min(c2, n - base)):
            j = base + b
            y = (np.float64(src[a, b]) * rs) * np.float64(ch_scale[j])
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
def widen_half(src, out):
    """out[i] = the float32 bits (uint32) of fp16 bits src[i] (1-D, uint16),
    as numpy's astype widens them (half.widen_bits): decode attention's
    cached rows."""
    for i in range(src.size):
        out[i] = widen_bits(src[i])
