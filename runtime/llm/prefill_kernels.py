"""Compiled (numba) kernels for the prepared LLM CPU steps over many rows
(prefill chunks): the row kernels of runtime/llm/jit.py reorganised so that
the loops run over `LANES` rows at once, contiguous in memory, which the
compiler turns into vector instructions; one row at a time, a Hadamard
butterfly of span 1, 2 or 4 or a pairwise leaf of eight accumulators cannot
be vectorised, and a column-major NPU output is read with a stride per element.

Every value is computed by the same float32/float64 operations in the same
order as the row kernels (and so as numpy's, tests/llm/test_plan.py): a tile
of rows is transposed into a [K, LANES] buffer, and each lane runs exactly
the row kernel's arithmetic; only which row is computed when changes.
tests/llm/test_prefill_kernels.py checks the bits against the row kernels.
Where a row kernel's loops vectorise on their own (jit.hadamard_rows'
self-sorting stages: rotate_quantize_rows, rotated_row_scale) the rows go
one at a time, in L1, with the same bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

LANES = 16  # rows per tile: two AVX2 vectors of float32


def live_rows(state, m: int) -> int:
    """The rows of an [m, K] chunk the host computes: its real tokens' tiles
    of LANES rows. The rows past `state.valid` pad a short chunk: they never
    enter the KV cache, their logits are dropped, and every step but
    attention (which reads the real rows only) is row by row on the host and
    on the NPU, so the host leaves them (a pad row costs the host nothing;
    runtime/llm/generate.chunk_plan counts on it). Without a state: all m."""
    rows = m if state is None else min(m, max(1, int(state.valid)))
    return min(m, -(-rows // LANES) * LANES)
# fastmath stated on every kernel, False or its flags: numba compiles a kernel that leaves it unset with
# its first caller's flags, for every later call too (numba #7168; tests/runtime/test_jit_flags.py)
_JIT = {"cache": True, "nogil": True, "fastmath": False}
# The float32 kernels not held to the per-step bits (issue 37): divisions without a zero check (Python's error
# model: they vectorise), and a * b + c contracted into one FMA (one rounding, not two: within the same float32
# tolerance; the exp's polynomial takes ~0.85x the time, h50r's note). The helpers they share with _JIT
# kernels (prefill_fused's _load_in, _out_edge, ...) are _JIT: the same code whichever kernel calls them.
_F32_JIT = {**_JIT, "error_model": "numpy", "fastmath": {"contract"}}
_BLOCK = 128  # numpy's pairwise leaf (jit._BLOCK)

_INT8_LIMIT = np.float32(127.0)  # symmetric int8: codes in [-127, 127] (-128 unused)


@njit(inline="always")
def int8_code(t):
    """The int8 code of t = x / scale: rint, clipped to [-127, 127] (inlined:
    the callers' loops stay vectorisable)."""
    return np.int8(min(max(np.rint(t), -_INT8_LIMIT), _INT8_LIMIT))


@njit(inline="always")
def int8_scale(amax):
    """A row's int8 scale from its max |value|: amax / 127, 1 for a zero row
    or one whose maximum is a NaN."""
    return amax / _INT8_LIMIT if amax > 0 else np.float32(1.0)


def pairwise_program(k: int) -> np.ndarray:
    """numpy's pairwise summation of k values as a post-order program of
    [op, lo, n] rows: op 0 sums the leaf [lo, lo + n) (n <= 128), op 1 adds
    the two partial sums on top of the stack (left + right). The split: a run
    longer than 128 at half its length rounded down to a multiple of eight
    (numpy/_core/src/umath/loops_utils.h)."""
    prog: list[tuple[int, int, int]] = []

    def walk(lo: int, n: int) -> None:
        if n <= _BLOCK:
            prog.append((0, lo, n))
            return
        half = n // 2
        half -= half % 8
        walk(lo, half)
        walk(lo + half, n - half)
        prog.append((1, 0, 0))
    walk(0, k)
    return np.asarray(prog, np.int64).reshape(-1, 3)


@njit(**_JIT)
def _leaf_squares(buf, lo, n, res, acc):
    """res[:] = each lane's sum of buf[lo:lo+n, lane] ** 2 in numpy's leaf
    order (jit._leaf_squares): sequential below 8, else eight accumulators
    combined as a tree, then the tail."""
    if n < 8:
        for lane in range(LANES):
            res[lane] = np.float32(0.0)
        for i in range(n):
            for lane in range(LANES):
                v = buf[lo + i, lane]
                res[lane] += v * v
        return
    for j in range(8):
        for lane in range(LANES):
            v = buf[lo + j, lane]
            acc[j, lane] = v * v
    i = 8
    end = n - n % 8
    while i < end:
        for j in range(8):
            for lane in range(LANES):
                v = buf[lo + i + j, lane]
                acc[j, lane] += v * v
        i += 8
    for lane in range(LANES):
        res[lane] = (((acc[0, lane] + acc[1, lane]) + (acc[2, lane] + acc[3, lane]))
                     + ((acc[4, lane] + acc[5, lane]) + (acc[6, lane] + acc[7, lane])))
    while i < n:
        for lane in range(LANES):
            v = buf[lo + i, lane]
            res[lane] += v * v
        i += 1


@njit(**_JIT)
def _sum_squares(buf, prog, stack, acc, out):
    """out[lane] = the pairwise sum of squares of buf[:, lane] (prog: pairwise_program)."""
    sp = 0
    for p in range(prog.shape[0]):
        if prog[p, 0] == 0:
            _leaf_squares(buf, prog[p, 1], prog[p, 2], stack[sp], acc)
            sp += 1
        else:
            for lane in range(LANES):
                stack[sp - 2, lane] = stack[sp - 2, lane] + stack[sp - 1, lane]
            sp -= 1
    for lane in range(LANES):
        out[lane] = stack[0, lane]


@njit(**_JIT)
def _load_tile(x, m0, r, buf):
    """buf[:, :r] = rows m0..m0+r-1 of x transposed; lanes past r zeroed."""
    k = x.shape[1]
    for i in range(k):
        for lane in range(r):
            buf[i, lane] = x[m0 + lane, i]
        for lane in range(r, LANES):
            buf[i, lane] = np.float32(0.0)


@njit(**_JIT)
def rms_norm(x, w, eps, prog, out):
    """jit.rms_norm over rows of x [M, K], LANES rows at a time."""
    rows, k = x.shape
    kf = np.float64(k)
    buf = np.empty((k, LANES), np.float32)
    stack = np.empty((prog.shape[0] + 1, LANES), np.float32)
    acc = np.empty((8, LANES), np.float32)
    sums = np.empty(LANES, np.float32)
    roots = np.empty(rows, np.float32)
    for m0 in range(0, rows, LANES):
        r = min(LANES, rows - m0)
        _load_tile(x, m0, r, buf)
        _sum_squares(buf, prog, stack, acc, sums)
        for lane in range(r):
            ms = np.float32(np.float64(sums[lane]) / kf) + eps
            roots[m0 + lane] = np.float32(np.sqrt(ms))
    if x.strides[0] < x.strides[1]:  # column-major: rows innermost
        for i in range(k):
            for m in range(rows):
                out[m, i] = (x[m, i] / roots[m]) * w[i]
    else:
        for m in range(rows):
            root = roots[m]
            for i in range(k):
                out[m, i] = (x[m, i] / root) * w[i]


@njit(**_JIT)
def dequantize_rows(acc, row_scale, ch_scale, bias, has_bias, out):
    """jit.dequantize_rows for a column-major acc (an NPU output read in its
    layout) and out: the loops with rows innermost, in memory order."""
    rows, n = acc.shape
    rs = np.empty(rows, np.float64)
    for m in range(rows):
        rs[m] = np.float64(row_scale[m])
    for j in range(n):
        cs = np.float64(ch_scale[j])
        b = np.float64(bias[j])
        for m in range(rows):
            y = (np.float64(acc[m, j]) * rs[m]) * cs
            if has_bias:
                y += b
            out[m, j] = np.float32(y)


@njit(**_JIT)
def _butterflies(buf, block):
    """jit.hadamard_rows's butterflies (pairs i, i + h for h = 1, 2, 4, ...
    within each block), on every lane of buf [K, LANES]. Two stages at a
    time (h and 2h over each group of four: the same additions on the same
    values, one pass over the buffer instead of two)."""
    butterfly_stages(buf, block, 1)


@njit(**_JIT)
def butterfly_stages(buf, block, first):
    """_butterflies' stages from h = `first` (a power of two) on, the stages
    below it done already (by _butterflies on blocks of `first` channels,
    while those were in L1): the same additions in the same order as
    _butterflies(buf, block)."""
    k = buf.shape[0]
    for b in range(0, k, block):
        h = first
        while 2 * h < block:
            for i in range(b, b + block, 4 * h):
                for j in range(i, i + h):
                    for lane in range(LANES):
                        x0 = buf[j, lane]
                        x1 = buf[j + h, lane]
                        x2 = buf[j + 2 * h, lane]
                        x3 = buf[j + 3 * h, lane]
                        a0, a1 = x0 + x1, x0 - x1  # stage h: (j, j+h), (j+2h, j+3h)
                        a2, a3 = x2 + x3, x2 - x3
                        buf[j, lane] = a0 + a2  # stage 2h: (j, j+2h), (j+h, j+3h)
                        buf[j + 2 * h, lane] = a0 - a2
                        buf[j + h, lane] = a1 + a3
                        buf[j + 3 * h, lane] = a1 - a3
            h *= 4
        if h < block:  # an odd number of stages: the last alone
            for j in range(b, b + h):
                for lane in range(LANES):
                    u = buf[j, lane]
                    v = buf[j + h, lane]
                    buf[j, lane] = u + v
                    buf[j + h, lane] = u - v


@njit(**_JIT)
def _signed_tile(x, signs, m0, r, buf):
    k = x.shape[1]
    for i in range(k):
        s = signs[i]
        for lane in range(r):
            buf[i, lane] = x[m0 + lane, i] * s
        for lane in range(r, LANES):
            buf[i, lane] = np.float32(0.0)


@njit(**_JIT)
def hadamard_rows(x, signs, block, norm, out):
    """jit.hadamard_rows over rows of x [M, K] into out (C order), LANES rows at a time."""
    rows, k = x.shape
    buf = np.empty((k, LANES), np.float32)
    for m0 in range(0, rows, LANES):
        r = min(LANES, rows - m0)
        _signed_tile(x, signs, m0, r, buf)
        _butterflies(buf, block)
        for lane in range(r):
            for i in range(k):
                out[m0 + lane, i] = buf[i, lane] * norm


@njit(**_JIT)
def scaled_amax(buf, norm, amax):
    """buf [K, LANES] *= norm (the rotation's last step), and each lane's max
    |value|. The lane loops run to amax's length (LANES): with the constant,
    LLVM unrolls them and its SLP pass, unable to prove amax and the tile
    apart, kept them scalar; a run-time trip count vectorises (with
    _quantize_tile's division: 490 -> 356 us over 128 x 2048, the same codes)."""
    lanes = amax.shape[0]
    for lane in range(lanes):
        amax[lane] = np.float32(0.0)
    for i in range(buf.shape[0]):
        for lane in range(lanes):
            v = buf[i, lane] * norm
            buf[i, lane] = v
            a = abs(v)
            if a > amax[lane] or a != a:  # a NaN stays the maximum (jit.quantize_rows)
                amax[lane] = a


@njit(**_JIT)
def _hadamard_stages(x, signs, block, norm, out, work):
    """jit.hadamard_rows with its two scratch rows `work` [2, K] (here, where
    rotate_quantize_rows runs it too: jit imports this module)."""
    rows, k = x.shape
    half = block // 2
    for m in range(rows):
        src = work[0]
        dst = work[1]
        for i in range(k):
            src[i] = x[m, i] * signs[i]
        h = 1
        if block >= _PAIRED_STAGES:
            src, dst, h = _two_stages_a_pass(src, dst, k, block)
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


_PAIRED_STAGES = 1024  # the block from which _two_stages_a_pass pays (2048: 3.4 -> 1.9 us a row; 128: slower)


@njit(**_JIT)
def _two_stages_a_pass(src, dst, k, block):
    """_hadamard_stages' stages two at a time while two remain: each pass
    reads four neighbours s0..s3 and writes what two stages write, (s0 + s1)
    +- (s2 + s3) and (s0 - s1) +- (s2 - s3) at the places the second stage
    puts them (quarters of the block); the same sums of the same values in
    the same order, so the same bits, with half the passes over the row.
    Returns the rows swapped as the stages leave them and the next stage's h."""
    half, q = block // 2, block // 4
    h = 1
    while h * 2 < block:
        for base in range(0, k, block):
            s = src[base:base + block]
            d = dst[base:base + block]
            for j in range(q):
                s0, s1, s2, s3 = s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]
                a, b, c, e = s0 + s1, s2 + s3, s0 - s1, s2 - s3
                d[j] = a + b
                d[j + half] = a - b
                d[j + q] = c + e
                d[j + q + half] = c - e
        src, dst = dst, src
        h *= 4
    return src, dst, h


_MAGNITUDE = np.uint32(0x7FFFFFFF)  # a float32's bits without the sign


@njit(**_JIT)
def _magnitude_peak(run, peak):
    """max(peak, the largest |value| of `run` as float32 bits without the sign):
    an unsigned maximum orders non-negative floats as the floats (+inf the
    largest), and a NaN's bits lie above +inf's, so a NaN stays the maximum
    (jit.quantize_rows' amax). An integer reduction vectorises; the float
    select with its NaN test (the previous form) stayed scalar: ~80 % of the
    codes' time (1.06 of 1.33 ms over 128 x 8960)."""
    for i in range(run.shape[0]):
        v = run[i] & _MAGNITUDE
        peak = v if v > peak else peak
    return peak


@njit(**_JIT)
def rotated_row_scale(x, m, signs, block, norm, out, work, peak):
    """Row m of x [M, K] rotated as jit.hadamard_rows rotates it into out
    [1, K] (work: its two scratch rows), and the row's int8 scale as
    jit.quantize_rows takes it (max |value| / 127 by _magnitude_peak, 1 for
    a zero row or one holding a NaN; peak: a uint32 [1] scratch). The same
    operations in the same order, so the same bits: the self-sorting stages
    are contiguous loops that vectorise over a row in L1, where [K, LANES]
    tiles of a 2048-wide block (128 KB) spill it."""
    _hadamard_stages(x[m:m + 1], signs, block, norm, out, work)
    peak[0] = _magnitude_peak(out[0].view(np.uint32), np.uint32(0))
    amax = peak.view(np.float32)[0]
    return int8_scale(amax)


@njit(**_JIT)
def rotate_quantize_rows(x, signs, block, norm, q, scale):
    """jit.hadamard_rows then jit.quantize_rows (a rotation without a
    block-mixing factor) row by row (rotated_row_scale), the rotated row
    never stored: the same bits. [K, LANES] tiles took 2.9x (1.26 against
    0.44 ms over 128 x 2048, one thread; h51f's note); a column-major x is
    read with a stride."""
    rows, k = x.shape
    work = np.empty((2, k), np.float32)
    out = np.empty((1, k), np.float32)
    row = out[0]
    peak = np.zeros(1, np.uint32)
    for m in range(rows):
        s = rotated_row_scale(x, m, signs, block, norm, out, work, peak)
        scale[m] = s
        qm = q[m]
        for i in range(k):
            qm[i] = int8_code(row[i] / s)


@njit(**_JIT)
def rope(x, cos, sin, dims, neox, out):
    """jit.rope with the pairing decided outside the loops, and the loops in
    x's memory order: tokens innermost when they are (an NPU output read
    column-major), else channels (NeoX's halves then contiguous)."""
    t_, heads, d = x.shape
    half = dims // 2
    tokens_inner = x.strides[0] < x.strides[2]
    for hh in range(heads):
        for t in range(t_):
            for i in range(dims, d):
                out[t, hh, i] = x[t, hh, i]
        if tokens_inner:
            for i in range(half):
                a_i, b_i = (i, i + half) if neox else (2 * i, 2 * i + 1)
                for t in range(t_):
                    a = x[t, hh, a_i]
                    b = x[t, hh, b_i]
                    out[t, hh, a_i] = a * cos[t, i] - b * sin[t, i]
                    out[t, hh, b_i] = a * sin[t, i] + b * cos[t, i]
        elif neox:
            for t in range(t_):
                for i in range(half):
                    a = x[t, hh, i]
                    b = x[t, hh, i + half]
                    out[t, hh, i] = a * cos[t, i] - b * sin[t, i]
                    out[t, hh, i + half] = a * sin[t, i] + b * cos[t, i]
        else:
            for t in range(t_):
                for i in range(half):
                    a = x[t, hh, 2 * i]
                    b = x[t, hh, 2 * i + 1]
                    out[t, hh, 2 * i] = a * cos[t, i] - b * sin[t, i]
                    out[t, hh, 2 * i + 1] = a * sin[t, i] + b * cos[t, i]


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693145751953125)  # ln 2 in two parts (Cody-Waite): k * _LN2_HI is exact for |k| < 2^11
_LN2_LO = np.float32(1.428606765330187e-06)
_EXP_LO, _EXP_HI = np.float32(-87.0), np.float32(88.0)  # 2^k stays a normal float32 for k in [-126, 127]


@njit(inline="always")
def exp_parts(t):
    """exp(t) as (p, b): p = exp(r) by its degree-7 polynomial and b the int32
    bits of the float32 2^k, t = k ln 2 + r (Cody-Waite), t clamped to
    [_EXP_LO, _EXP_HI]; exp(t) = p * b viewed as float32. Inlined into the
    callers' loops, which stay vectorisable (no call to expf)."""
    v = min(max(t, _EXP_LO), _EXP_HI)
    k = np.floor(v * _LOG2E + np.float32(0.5))
    r = (v - k * _LN2_HI) - k * _LN2_LO
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p, (np.int32(k) + np.int32(127)) << 23


@njit(inline="always")
def exp_f32(t):
    """exp(t) as one float32 (exp_parts' p times its 2^k, the bits viewed as
    float32 in a register): for a loop that computes and uses the value in one
    pass. A scratch row for the bits (exp_into's form) between two loops kept
    the second one scalar in _act_mul (LLVM's SLP pass cannot prove the row
    and the tile apart): 2.4 against 1.1 ms over a 128 x 8960 SiLU."""
    p, bits = exp_parts(t)
    return p * np.int32(bits).view(np.float32)


ACT_SILU, ACT_GELU_TANH = 0, 1  # a gated FFN's activation (the compiled kernels' argument)
_GELU_C = np.float32(0.7978845608028654)  # sqrt(2 / pi)
_GELU_K = np.float32(0.044715)


@njit(inline="always")
def activation(x, act):
    """act(x) in float32 through exp_f32 (inlined: the callers' loops stay
    vectorisable): SiLU x / (1 + exp(-x)); GELU's tanh form 0.5 x (1 +
    tanh(y)) = x / (1 + exp(-2y)), y = C (x + K x^3)."""
    if act == ACT_SILU:
        t = -x
    else:
        t = np.float32(-2.0) * _GELU_C * (x + _GELU_K * x * x * x)
    return x / (np.float32(1.0) + exp_f32(t))


@njit(**_F32_JIT)  # (the polynomial's a * b + c fused, as exp_f32 inlined in the prefill tiles)
def exp_into(t, e, bits):
    """e[i] = exp(t[i]) over 1-d t (float32, relative error < 3e-7 for t in
    [-87, 88]; t outside is clamped there: exp(-87) ~ 1.6e-38 and exp(88) ~ 1.7e38
    leave x / (1 + e) at 0 or x to float32 precision). 2^k is built in the
    exponent bits (`bits`: an int32 scratch row as long as t), so the loop
    vectorises where a call to expf would not. e may be t."""
    scaled = bits.view(np.float32)
    for lane in range(t.shape[0]):
        e[lane], bits[lane] = exp_parts(t[lane])
    for lane in range(t.shape[0]):
        e[lane] = e[lane] * scaled[lane]


# Softmax weights below 2^-100 are 0: times any nonzero fp16 value (>= 2^-24) a kept weight's product
# stays a normal float32, where subnormal ones slowed the values' sgemm ~20x on x86 (scores spread over
# ~64, as Gemma 4 E2B's garbage-fed null-device bench gave them); what is dropped, under 2^-100 per
# key, is far below the output's float32 rounding.
_WEIGHT_FLOOR = np.float32(2.0 ** -100)


@njit(**_JIT)
def softmax_columns(s, scale, kp, qcol, window):
    """s [P, C] in place: each column's softmax over P of scale * s, a key the
    column's query cannot see (kp[p] > qcol[c], or `window` and qcol[c] -
    kp[p] >= window) weighted 0; float32 (exp_parts), loops with the columns
    innermost (contiguous) so each pass vectorises; a weight below
    _WEIGHT_FLOOR flushed to 0. Every column must see a key."""
    p_, c_ = s.shape
    m = np.full(c_, -np.inf, np.float32)
    neg = np.float32(-np.inf)
    for p in range(p_):
        row = s[p]
        kpp = kp[p]
        for c in range(c_):
            v = row[c] * scale
            if kpp > qcol[c] or (window != 0 and qcol[c] - kpp >= window):
                v = neg
            row[c] = v
            if v > m[c]:
                m[c] = v
    bits = np.empty(c_, np.int32)
    scaled = bits.view(np.float32)  # exp_parts' 2^k
    total = np.zeros(c_, np.float32)
    for p in range(p_):
        row = s[p]
        for c in range(c_):  # exp_parts inlined in the loop: a call to exp_into per row cost ~1.4x
            v = row[c]
            e, bits[c] = exp_parts(v - m[c])
            row[c] = np.float32(0.0) if v == neg else e  # hidden: an exact zero (exp_parts clamps -inf)
        for c in range(c_):
            row[c] = row[c] * scaled[c]
            total[c] += row[c]
    for c in range(c_):
        total[c] = np.float32(1.0) / total[c]
    for p in range(p_):
        row = s[p]
        for c in range(c_):
            v = row[c] * total[c]
            row[c] = v if v >= _WEIGHT_FLOOR else np.float32(0.0)
