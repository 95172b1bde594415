"""Attention of one query row (a decode step) over the KV cache: one compiled
float32 kernel (`attend_keys`) for the load-time plans (runtime/llm/prepared.py,
fused_attention.py), reading the cache's rows as they are stored: the fp16 rows a
decode step writes (KVCache.store_half; `RowAttention`, a fused attention
stretch's) or fp32 views (`attend_row`: kernels.attend's one query row,
the interpreter's and the unfused plans').

Each key is read once per pass, widened in registers (fp16 -> fp32 by
fpext: half.widen_value), its scores against the query heads of its KV group
summed in float32 (vectorised: fastmath's reassociation), then the softmax
(exp: prefill_kernels.exp_into, a float32 polynomial) and the weighted sum of
the values, with no widened copy of the cache and no BLAS call. Each pass
asks the caches for the rows AHEAD keys on (llvm.prefetch): the hardware's
stream prefetcher does not cross a 4 KB page, which a 512-byte row ends
every eight keys. From 1024 keys on the keys are cut into contiguous
blocks (KEYS_PER_BLOCK), each its own running maximum, sum and weighted
values (the split softmax of flash decoding), combined at the end; from
4096 (SHARED_KEYS) the host threads take the blocks as each comes free
(runtime/llm/threads.py's over_blocks: a helper that wakes late leaves the
caller no block to wait for).
Not kernels.attend's bits (issue 37 dropped that rule):
tests/llm/test_attention.py bounds the error against a float64 attention over
head sizes, groupings, key counts, windows, masks and thread splits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from rkc.runtime.half import widen_value
from rkc.runtime.llm import jit, threads
from rkc.runtime.llm.prefill_kernels import exp_into

F32 = np.float32
# the dot products and weighted sums reassociate (vectorised float32 sums); no
# nnan/ninf: hidden keys are -inf until the exp
_JIT = {"cache": True, "nogil": True, "fastmath": {"reassoc", "contract", "nsz", "arcp"}}
# the keys are cut into blocks of at least this many (each block's float32 sums shorter: a range
# of 1030 keys in one exceeds test_attention's bound), up to BLOCKS_MAX, combined at the end
KEYS_PER_BLOCK = 512
BLOCKS_MAX = 8
# from this many keys the host threads take the blocks as they come (threads.over_blocks), below it
# the caller's thread runs them all. Measured here (docs/notes/2026-12-07-decode-long-positions-2.md):
# a second thread lost at 512 and 2048 keys (the hand-off and a second stream of the cache cost more
# than half the keys save) and gained at 4096
SHARED_KEYS = 4096
# keys a pass asks the caches for ahead of the one it reads: Gemma 3's rows are 512 bytes, eight to a
# 4 KB page, and the CPU's own prefetcher stops at each page's end (a wait on DRAM every eight keys)
AHEAD = 8


def _value(src, r, d):  # pragma: no cover - compiled through the overload below
    """src[r, d] as float32: fp16 bits widened (half.widen_value), or the float32."""


@overload(_value, jit_options=_JIT, inline="always")
def _value_impl(src, r, d):
    if src.dtype == types.uint16:
        return lambda src, r, d: widen_value(src[r, d])
    return lambda src, r, d: src[r, d]


@intrinsic
def _prefetch_row(typingctx, arr, row):
    """Ask the caches for arr[row, :] (a 2-d array, rows contiguous): one
    llvm.prefetch (read, keep in all levels) per 64-byte line, no load."""
    if not isinstance(arr, types.Array) or arr.ndim != 2 or not isinstance(row, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        aryty, rowty = sig.args
        ary = context.make_array(aryty)(context, builder, args[0])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        stride = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
        r = context.cast(builder, args[1], rowty, types.intp)
        start = builder.gep(builder.bitcast(ary.data, i8p), [builder.mul(r, stride)])
        width = cgutils.unpack_tuple(builder, ary.shape, 2)[1]
        nbytes = builder.mul(width, context.get_constant(types.intp, aryty.dtype.bitwidth // 8))
        # the typed-pointer name: LLVM 14's (numba 0.60), which later LLVMs upgrade to their ".p0"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        step = context.get_constant(types.intp, 64)
        with cgutils.for_range_slice(builder, context.get_constant(types.intp, 0), nbytes, step) as (offset, _):
            builder.call(fn, [builder.gep(start, [offset]), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(arr, row), codegen


@njit(**_JIT)
def _hidden(kp, p0, window) -> bool:
    return kp > p0 or (window != 0 and p0 - kp >= window)


@njit(**_JIT)
def _scores(q, i0, i1, keys, r, scale, s, p, mx):
    """s[i, p] = scale * (q[i] . keys[r]) for query heads i0 <= i < i1, and
    their running maxima mx[i]; four heads a pass over the key row while there
    are four (each element widened once for them)."""
    hd = q.shape[1]
    i = i0
    while i < i1:
        n = 4 if i1 - i >= 4 else 1
        t0 = t1 = t2 = t3 = np.float32(0.0)
        if n == 4:
            for d in range(hd):
                x = _value(keys, r, d)
                t0 += q[i, d] * x
                t1 += q[i + 1, d] * x
                t2 += q[i + 2, d] * x
                t3 += q[i + 3, d] * x
        else:
            for d in range(hd):
                t0 += q[i, d] * _value(keys, r, d)
        for c, t in enumerate((t0, t1, t2, t3)):
            if c < n:
                _score(t * scale, i + c, p, s, mx)
        i += n


@njit(**_JIT)
def _score(t, i, p, s, mx):
    s[i, p] = t
    if t > mx[i]:
        mx[i] = t


@njit(**_JIT)
def _scores_pair(q, i, keys, r0, r1, scale, s, p, mx):
    """_scores of query heads i..i+3 against two key rows r0, r1 (keys p,
    p + 1) in one pass: each query element loaded once for both, eight sums
    in registers (one key a pass was bound by the query's loads)."""
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
    for d in range(q.shape[1]):
        x, y = _value(keys, r0, d), _value(keys, r1, d)
        q0, q1, q2, q3 = q[i, d], q[i + 1, d], q[i + 2, d], q[i + 3, d]
        a0 += q0 * x
        a1 += q1 * x
        a2 += q2 * x
        a3 += q3 * x
        b0 += q0 * y
        b1 += q1 * y
        b2 += q2 * y
        b3 += q3 * y
    for c, t in enumerate((a0, a1, a2, a3)):
        _score(t * scale, i + c, p, s, mx)
    for c, t in enumerate((b0, b1, b2, b3)):
        _score(t * scale, i + c, p + 1, s, mx)


@njit(**_JIT)
def _weighted(s, p, i0, i1, values, r, acc):
    """acc[i] += s[i, p] * values[r] for query heads i0 <= i < i1, four a pass
    over the value row while there are four."""
    hdv = acc.shape[1]
    i = i0
    while i < i1:
        if i1 - i >= 4:
            w0, w1, w2, w3 = s[i, p], s[i + 1, p], s[i + 2, p], s[i + 3, p]
            for d in range(hdv):
                x = _value(values, r, d)
                acc[i, d] += w0 * x
                acc[i + 1, d] += w1 * x
                acc[i + 2, d] += w2 * x
                acc[i + 3, d] += w3 * x
            i += 4
        else:
            w = s[i, p]
            for d in range(hdv):
                acc[i, d] += w * _value(values, r, d)
            i += 1


@njit(**_JIT)
def _weighted_quad(s, p, i, values, r, step, acc):
    """_weighted of query heads i..i+3 for four keys p..p+3 (value rows r,
    r + step, r + 2 step, r + 3 step) in one pass: each accumulator loaded
    and stored once for four keys (one key a pass was bound by those)."""
    w = s[i:i + 4, p:p + 4]
    w00, w01, w02, w03 = w[0, 0], w[0, 1], w[0, 2], w[0, 3]
    w10, w11, w12, w13 = w[1, 0], w[1, 1], w[1, 2], w[1, 3]
    w20, w21, w22, w23 = w[2, 0], w[2, 1], w[2, 2], w[2, 3]
    w30, w31, w32, w33 = w[3, 0], w[3, 1], w[3, 2], w[3, 3]
    for d in range(acc.shape[1]):
        x0, x1 = _value(values, r, d), _value(values, r + step, d)
        x2, x3 = _value(values, r + 2 * step, d), _value(values, r + 3 * step, d)
        acc[i, d] += w00 * x0 + w01 * x1 + w02 * x2 + w03 * x3
        acc[i + 1, d] += w10 * x0 + w11 * x1 + w12 * x2 + w13 * x3
        acc[i + 2, d] += w20 * x0 + w21 * x1 + w22 * x2 + w23 * x3
        acc[i + 3, d] += w30 * x0 + w31 * x1 + w32 * x2 + w33 * x3


# keys a run of _weighted_tile calls takes before the next: their value rows stay in L1 across the dims
KEY_TILE = 32
VEC = 8  # floats a vector register holds (AVX2)
TILE = 16  # output dims a _weighted_tile call holds: two 8-float vectors per query head


@intrinsic
def _weighted_tile(typingctx, s, i, values, r0, step, lo, hi, d, acc):
    """acc[i + c, d:d + TILE] += sum over keys p in [lo, hi) of s[i + c, p] *
    values[r0 + (p - lo) * step, d:d + TILE] for the four query heads c < 4,
    with fp16 values (uint16 bits; 2-d arrays, rows contiguous). The eight
    accumulator vectors (two a head) stay in registers across the keys,
    stored once, and each value chunk is widened once for the four heads;
    per key and 16 dims: 2 value loads, 4 weight broadcasts, 8 FMAs.
    Written as vector IR: numba's scalar form of it was not merged into
    vectors (4x slower), and the loop-vectorised _weighted_quad loads and
    stores the accumulators every four keys."""
    arrays = (s, values, acc)
    if (any(not isinstance(a, types.Array) or a.ndim != 2 for a in arrays) or values.dtype != types.uint16
            or s.dtype != types.float32 or acc.dtype != types.float32):
        return None

    def codegen(context, builder, sig, args):
        f32, i16, i8p = ir.FloatType(), ir.IntType(16), ir.IntType(8).as_pointer()
        vf, vh, vi = ir.VectorType(f32, VEC), ir.VectorType(ir.HalfType(), VEC), ir.VectorType(i16, VEC)
        intp = context.get_value_type(types.intp)
        s_a, v_a, acc_a = (context.make_array(sig.args[k])(context, builder, args[k]) for k in (0, 2, 8))
        ii, r0_, step_, lo_, hi_, d_ = (context.cast(builder, args[k], sig.args[k], types.intp)
                                        for k in (1, 3, 4, 5, 6, 7))

        def at(ary, row, col, size):  # i8* of ary[row, col] (rows strided, columns contiguous)
            stride = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
            off = builder.add(builder.mul(row, stride), builder.mul(col, intp(size)))
            return builder.gep(builder.bitcast(ary.data, i8p), [off])

        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v8f32")
        parts = TILE // VEC
        slots = []  # (head, part, pointer into acc, the accumulator's alloca)
        for c in range(4):
            for j in range(parts):
                ptr = builder.bitcast(at(acc_a, builder.add(ii, intp(c)), builder.add(d_, intp(j * VEC)), 4),
                                      vf.as_pointer())
                slot = cgutils.alloca_once(builder, vf)
                builder.store(builder.load(ptr, align=4), slot)
                slots.append((c, j, ptr, slot))
        undef = ir.Constant(vf, ir.Undefined)
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), VEC), [0] * VEC)
        with cgutils.for_range(builder, builder.sub(hi_, lo_)) as loop:
            k = loop.index
            p = builder.add(lo_, k)
            r = builder.add(r0_, builder.mul(k, step_))
            xs = []
            for j in range(parts):
                raw = builder.load(builder.bitcast(at(v_a, r, builder.add(d_, intp(j * VEC)), 2), vi.as_pointer()),
                                   align=2)
                xs.append(builder.fpext(builder.bitcast(raw, vh), vf))
            ws = []
            for c in range(4):
                w = builder.load(builder.bitcast(at(s_a, builder.add(ii, intp(c)), p, 4), f32.as_pointer()), align=4)
                ws.append(builder.shuffle_vector(builder.insert_element(undef, w, ir.IntType(32)(0)), undef, zeros))
            for c, j, _, slot in slots:
                builder.store(builder.call(fma, [ws[c], xs[j], builder.load(slot)]), slot)
        for _, _, ptr, slot in slots:
            builder.store(builder.load(slot), ptr, align=4)
        return context.get_dummy_value()
    return types.void(s, i, values, r0, step, lo, hi, d, acc), codegen


@njit(**_JIT)
def _weighted_dims(s, p, i, values, r, d0, acc):
    """acc[i + c, d] += s[i + c, p] * values[r, d] for c < 4, d0 <= d < hdv
    (the dims _weighted_tile's whole tiles leave)."""
    for c in range(4):
        w = s[i + c, p]
        for d in range(d0, acc.shape[1]):
            acc[i + c, d] += w * _value(values, r, d)


def _weighted_tiles(s, i, values, h, hkv, lo, hi, acc):  # pragma: no cover - compiled through the overload below
    """acc[i..i+3] += the weighted values of keys lo..hi-1 (all seen) of KV
    head h by _weighted_tile, TILE dims at a time (the dims past the last
    whole tile one key at a time): True; float32 values: False, nothing done
    (the caller's loops take them)."""


@overload(_weighted_tiles, jit_options=_JIT, inline="always")
def _weighted_tiles_impl(s, i, values, h, hkv, lo, hi, acc):
    if values.dtype != types.uint16:
        return lambda s, i, values, h, hkv, lo, hi, acc: False

    def tiles(s, i, values, h, hkv, lo, hi, acc):
        hdv = acc.shape[1]
        whole = hdv - hdv % TILE
        for a in range(lo, hi, KEY_TILE):
            b = min(a + KEY_TILE, hi)
            for d in range(0, whole, TILE):
                _weighted_tile(s, i, values, a * hkv + h, hkv, a, b, d, acc)
            if whole < hdv:
                for p in range(a, b):
                    _weighted_dims(s, p, i, values, p * hkv + h, whole, acc)
        return True
    return tiles


@njit(**_JIT)
def _seen(kpos, p, n, p0, window) -> bool:
    """Keys p..p+n-1 all visible to the query at p0."""
    for c in range(n):
        if _hidden(kpos[p + c], p0, window):
            return False
    return True


@njit(**_JIT)
def attend_keys(q, keys, values, kpos, p0, scale, window, lo, hi, s, e_bits, acc, mx, total):
    """One range [lo, hi) of the keys for q [Hkv * G, hd] (float32; query
    head j of KV head h at row h * G + j) over keys [P * Hkv, hd] / values
    [P * Hkv, hdv] (fp16 bits as uint16, or float32; key p of KV head h at
    row p * Hkv + h) at kpos [P], for the query at p0: per query head the
    range's largest scaled score mx [Hkv * G], the sum of exp(score - mx)
    total [Hkv * G] and the values weighted by those exps acc [Hkv * G, hdv]
    (not yet divided). A key the query cannot see (kpos > p0, or `window`
    and p0 - kpos >= window) weighs 0; a range that sees none leaves mx
    -inf, total and acc 0. s [Hkv * G, P] holds the range's scores, e_bits
    [P] (int32) exp_into's scratch. Loops index 2-d arrays by (computed row,
    range index) and make no slices per key: what lets them vectorise.
    Query heads go four at a time while a group has four (the rest one at a
    time): their scores two visible keys a pass, their weighted values by
    _weighted_tiles when the range's keys are all seen and fp16, else four
    keys a pass."""
    hdv, nq = values.shape[1], q.shape[0]
    hkv = keys.shape[0] // kpos.shape[0]
    g = nq // hkv
    neg = np.float32(-np.inf)
    for i in range(nq):
        mx[i] = neg
        total[i] = np.float32(0.0)
        for d in range(hdv):
            acc[i, d] = np.float32(0.0)
    for h in range(hkv):
        i = h * g
        while i < h * g + g:
            n = 4 if h * g + g - i >= 4 else 1
            p = lo
            while p < hi:
                if p + AHEAD + 1 < hi:
                    _prefetch_row(keys, (p + AHEAD) * hkv + h)
                    _prefetch_row(keys, (p + AHEAD + 1) * hkv + h)
                if n == 4 and p + 1 < hi and _seen(kpos, p, 2, p0, window):
                    _scores_pair(q, i, keys, p * hkv + h, (p + 1) * hkv + h, scale, s, p, mx)
                    p += 2
                    continue
                if _hidden(kpos[p], p0, window):
                    for c in range(n):
                        s[i + c, p] = neg
                else:
                    _scores(q, i, i + n, keys, p * hkv + h, scale, s, p, mx)
                p += 1
            i += n
    for i in range(nq):
        m = mx[i]
        if m == neg:
            continue
        si = s[i, lo:hi]
        for c in range(hi - lo):
            si[c] -= m
        exp_into(si, si, e_bits[lo:hi])  # (each range its own part of the scratch)
        t = np.float32(0.0)
        for c in range(hi - lo):
            if _hidden(kpos[lo + c], p0, window):
                si[c] = np.float32(0.0)  # an exact zero (exp_into clamps -inf to exp(-87))
            t += si[c]
        total[i] = t
    for h in range(hkv):
        i = h * g
        while i < h * g + g:
            n = 4 if h * g + g - i >= 4 else 1
            # every key seen (a decode step's usual range): fp16 values go by tiles of output dims
            if n == 4 and hdv >= TILE and _seen(kpos, lo, hi - lo, p0, window) and _weighted_tiles(
                    s, i, values, h, hkv, lo, hi, acc):
                i += 4
                continue
            p = lo
            while p < hi:
                if p + AHEAD + 3 < hi:
                    for c in range(4):
                        _prefetch_row(values, (p + AHEAD + c) * hkv + h)
                if n == 4 and p + 3 < hi and _seen(kpos, p, 4, p0, window):
                    _weighted_quad(s, p, i, values, p * hkv + h, hkv, acc)
                    p += 4
                    continue
                if not _hidden(kpos[p], p0, window):
                    _weighted(s, p, i, i + n, values, p * hkv + h, acc)
                p += 1
            i += n


@njit(**_JIT)
def combine(parts, mx, total, acc, dst):
    """dst [Hkv * G, hdv] = the softmax-weighted values from `parts` ranges'
    mx [N, Hkv * G], total [N, Hkv * G], acc [N, Hkv * G, hdv]: each range's
    sums rescaled to the largest maximum (NaN where no key is visible, as a
    softmax of nothing but -inf)."""
    nq, hdv = acc.shape[1], acc.shape[2]
    neg = np.float32(-np.inf)
    for i in range(nq):
        m = neg
        for n in range(parts):
            m = max(m, mx[n, i])
        if m == neg:
            for d in range(hdv):
                dst[i, d] = np.float32(np.nan)
            continue
        t = np.float32(0.0)
        for d in range(hdv):
            dst[i, d] = np.float32(0.0)
        for n in range(parts):
            if mx[n, i] == neg:
                continue
            f = np.float32(np.exp(mx[n, i] - m))
            t += total[n, i] * f
            for d in range(hdv):
                dst[i, d] += acc[n, i, d] * f
        inv = np.float32(1.0) / t
        for d in range(hdv):
            dst[i, d] *= inv


@njit(**_JIT)
def attend_blocks(q, keys, values, kpos, p0, scale, window, blocks, s, e_bits, acc, mx, total, dst):
    """attend_keys over the keys cut into `blocks` contiguous ranges, one
    after another, then combine into dst: RowAttention's one-thread path as
    one compiled call (a call per block and one to combine cost ~2 us of
    dispatch each, a Python closure and loop more)."""
    p = kpos.shape[0]
    for b in range(blocks):
        attend_keys(q, keys, values, kpos, p0, scale, window, p * b // blocks, p * (b + 1) // blocks, s, e_bits,
                    acc[b], mx[b], total[b])
    combine(blocks, mx, total, acc, dst)


@njit(**_JIT)
def attend_span(q, keys, values, kpos, s, e, p0, scale, window, blocks, scores, e_bits, acc, mx, total, dst):
    """attend_blocks over rows [s, e) of a layer's whole cache buffers
    keys [capacity, Hkv, hd] / values [capacity, Hkv, hdv] (fp16 bits) and
    positions kpos [capacity], for q [H, hd], in `blocks` ranges
    (RowAttention.blocks): RowAttention's one-thread path with its slices and
    reshapes made here (each a numpy view of ~0.3-1 us in Python, ten a
    layer). `scale` a float, narrowed to float32 here (RowAttention's F32 of
    it); `scores` and `e_bits` RowWork's flat buffers."""
    p, nq = e - s, q.shape[0]
    attend_blocks(q, keys[s:e].reshape(-1, keys.shape[2]), values[s:e].reshape(-1, values.shape[2]), kpos[s:e], p0,
                  np.float32(scale), window, blocks, scores[:nq * p].reshape(nq, p), e_bits, acc, mx, total, dst)


@njit(**_JIT)
def front_and_attend(q, k, v, qw, qeps, kw, keps, vw, veps, norms, v_norm, qn, kn, vn, qx, kx, cos, sin, dims, neox,
                     qr, kr, kr_bits, v_bits, k16, v16, kpos, s, e, p0, scale, window, blocks, scores, e_bits, acc,
                     mx, total, dst):
    """A one-row attention stretch's compiled work in one call: jit.attention_front
    (its cache row written into row e - 1 of k16 / v16) then attend_span of
    qr over rows [s, e). The eps values are floats, narrowed to float32 here
    (the F32 the stretch would pass: the same bits); one dispatch and no
    numpy scalar arguments instead of two dispatches and the views between."""
    jit.attention_front(q, k, v, qw, np.float32(qeps), kw, np.float32(keps), vw, np.float32(veps), norms, v_norm,
                        qn, kn, vn, qx, kx, cos, sin, dims, neox, qr, kr, kr_bits, v_bits, k16, v16, e - 1)
    attend_span(qr[0], k16, v16, kpos, s, e, p0, scale, window, blocks, scores, e_bits, acc, mx, total, dst)


class RowWork:
    """The scores and exp scratch of a one-row attention, shared by every
    layer of an engine's plans (their steps run one at a time); grown to the
    longest context seen."""

    def __init__(self) -> None:
        self.scores = np.empty(0, F32)
        self.bits = np.empty(0, np.int32)

    def buffers(self, n_scores: int, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
        if self.scores.size < n_scores:
            self.scores = np.empty(max(n_scores, 2 * self.scores.size), F32)
        if self.bits.size < n_keys:
            self.bits = np.empty(max(n_keys, 2 * self.bits.size), np.int32)
        return self.scores, self.bits


class RowAttention:
    """One layer's one-row attention for q [1, heads, hd] over keys/values
    [P, hkv, hd(v)] (the cache's fp16 rows, or float32 with C-contiguous
    rows): [1, heads * hdv]. Its output row and per-thread buffers are made
    once (the row is valid until the next call)."""

    def __init__(self, heads: int, hkv: int, hd: int, hdv: int, scale: float, window: int, work: RowWork,
                 threads_max: int = threads.THREADS) -> None:
        self.heads, self.hd, self.hdv = heads, hd, hdv
        self.scale, self.window, self.work = F32(scale), int(window), work
        self.scale_value = float(self.scale)  # (attend_span narrows it back: the same float32)
        self.full = np.zeros((1, heads * hdv), F32)
        self.dst = self.full[0].reshape(heads, hdv)
        self.threads = max(1, threads_max)
        self.mx = np.empty((BLOCKS_MAX, heads), F32)
        self.total = np.empty((BLOCKS_MAX, heads), F32)
        self.acc = np.empty((BLOCKS_MAX, heads, hdv), F32)

    def one_thread(self, keys: int) -> bool:
        """Whether `keys` keys run on the caller's thread alone (attend_span's path)."""
        return keys < SHARED_KEYS or self.threads == 1

    @staticmethod
    def blocks(keys: int) -> int:
        """The ranges `keys` keys are cut into (each its own float32 sums)."""
        return max(1, min(BLOCKS_MAX, keys // KEYS_PER_BLOCK))

    def __call__(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, p0: int) -> np.ndarray:
        p = len(kpos)
        scores, bits = self.work.buffers(self.heads * p, p)
        s = scores[:self.heads * p].reshape(self.heads, p)
        k2, v2 = keys.reshape(-1, self.hd), values.reshape(-1, self.hdv)  # views of contiguous rows
        args = (q.reshape(self.heads, self.hd), k2.view(np.uint16) if k2.dtype == np.float16 else k2,
                v2.view(np.uint16) if v2.dtype == np.float16 else v2, np.asarray(kpos, np.int64), int(p0),
                self.scale, self.window)

        blocks = self.blocks(p)
        if self.one_thread(p):
            attend_blocks(*args, blocks, s, bits, self.acc, self.mx, self.total, self.dst)
            return self.full

        def run(b: int) -> None:
            attend_keys(*args, p * b // blocks, p * (b + 1) // blocks, s, bits, self.acc[b], self.mx[b], self.total[b])
        threads.over_blocks(run, blocks, self.threads)
        combine(blocks, self.mx, self.total, self.acc, self.dst)
        return self.full


def attend_row(q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray,
               attrs: dict, rows: int) -> np.ndarray:
    """kernels.attend of one query row: q [1, H, hd] over keys/values
    [P, Hkv, hd(v)] (float32, any strides) at kpos [P] for the query at
    pos [1]: [rows, H * hdv] (rows past the first zero), through RowAttention."""
    if (q.ndim != 3 or keys.ndim != 3 or values.ndim != 3 or q.shape[0] != 1 or len(pos) != 1
            or keys.shape[0] == 0 or keys.shape[1] == 0 or q.shape[1] % keys.shape[1]
            or keys.shape[2] != q.shape[2] or values.shape[:2] != keys.shape[:2] or kpos.shape != keys.shape[:1]):
        raise ValueError(f"attention: query {list(q.shape)}, keys {list(keys.shape)}, values {list(values.shape)} "
                         f"and {len(kpos)} key positions do not fit together")
    _, heads, hd = q.shape
    hkv, hdv = keys.shape[1], values.shape[2]
    one = RowAttention(heads, hkv, hd, hdv, float(attrs["scale"]), int(attrs["window"]), RowWork())
    full = np.zeros((rows, heads * hdv), F32)
    full[0] = one(np.ascontiguousarray(q, F32), np.ascontiguousarray(keys, F32), np.ascontiguousarray(values, F32),
                  kpos, int(pos[0]))[0]
    return full
