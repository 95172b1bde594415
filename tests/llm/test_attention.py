"""The runtime's attention (runtime/llm/kernels.attend; the plans' one-row
kernel, runtime/llm/decode_attention.py; prefill's blocks,
runtime/llm/prefill_attention.py) within float32 tolerance of a float64
attention (issue 37: no bit identity with the einsum formulation the runtime
ran before, whose own float32 error sets the bound) over head sizes, KV-head
groupings, key counts, windows, masks, and keys that are a view into a
larger cache (as the KV cache hands them over)."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime import blas
from rkc.runtime.llm.kernels import attend


def einsum_attention(q, keys, values, kpos, pos, window, scale, rows):
    """The formulation the runtime ran before (its bits are the reference's)."""
    t, h, hd = q.shape
    hkv = keys.shape[1]
    qg = q.astype(np.float32).reshape(t, hkv, h // hkv, hd)
    s = np.einsum("tkgd,pkd->kgtp", qg, keys, optimize=True) * np.float32(scale)
    allowed = kpos[None, :] <= pos[:, None]
    if window:
        allowed &= (pos[:, None] - kpos[None, :]) < window
    s = np.where(allowed[None, None], s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    out = np.einsum("kgtp,pkd->tkgd", s / s.sum(axis=-1, keepdims=True), values, optimize=True)
    full = np.zeros((rows, h * values.shape[-1]), np.float32)
    full[:t] = out.reshape(t, -1)
    return full


@pytest.mark.parametrize("hd", [8, 16, 64, 256])
@pytest.mark.parametrize("hkv,g", [(1, 1), (1, 4), (2, 3), (8, 2)])
@pytest.mark.parametrize("t", [1])
def test_attention_of_one_row(hd, hkv, g, t):
    rng = np.random.default_rng(hd * 100 + hkv * 10 + g)
    with blas.one_thread():  # as the runtime runs host kernels
        for p in (1, 5, 23, 100, 257, 600):
            if p < t:
                continue
            cache = rng.standard_normal((p + 9, hkv, hd)).astype(np.float16).astype(np.float32)
            keys, values = cache[3:p + 3], cache[::-1][:p]  # views, as the KV cache's
            q = (rng.standard_normal((t, hkv * g, hd)) * 3).astype(np.float32)
            kpos = np.arange(p)
            cases = [(0, np.arange(p - t, p)), (max(2, p // 3), np.arange(p - t, p))]
            if p >= t + 2:  # queries before the last keys: the mask applies
                cases.append((0, np.arange(p - t - 2, p - 2)))
            for window, pos in cases:
                attrs = {"scale": hd ** -0.5, "window": window}
                got = attend(q, keys, values, kpos, pos, attrs, t + 1)
                assert not got[t:].any()
                within_float32(got, q, keys, values, kpos, pos, window, attrs["scale"], t + 1)


def within_float32(got, q, keys, values, kpos, pos, window, scale, rows) -> None:
    """The one-row attention's float32 tolerance: against a float64 attention,
    its largest error at most 2x the einsum formulation's own (both float32)
    or 2e-6 of the largest |value|, whichever is larger."""
    keys, values = np.asarray(keys, np.float32), np.asarray(values, np.float32)
    exact = float64_attention(q, keys, values, kpos, pos, window, scale, rows)
    with blas.one_thread():
        err = np.abs(einsum_attention(q, keys, values, kpos, pos, window, scale, rows) - exact).max()
    assert got.shape == exact.shape and got.dtype == np.float32
    assert np.abs(got - exact).max() <= max(2 * err, 2e-6 * np.abs(exact).max()), \
        f"p={len(kpos)} window={window} pos={pos[0]}"


@pytest.mark.parametrize("hd", [8, 16, 64, 256])
@pytest.mark.parametrize("hkv,g", [(1, 1), (1, 4), (2, 3), (8, 2), (4, 1), (1, 6)])
def test_decode_attention_against_float64(hd, hkv, g):
    """The plans' one-row attention over fp32 views of the cache
    (decode_attention.attend_row: one compiled float32 kernel) within float32
    tolerance of a float64 attention: keys and values that are views into
    larger caches (as the KV cache hands them over), every key visible, a
    window that hides the oldest keys, keys after the query (masked), and
    out-of-order positions."""
    from rkc.runtime.llm import decode_attention

    rng = np.random.default_rng(hd * 100 + hkv * 10 + g + 1)
    for p in (1, 2, 7, 9, 100, 600, 1030):
        kcache, vcache = rng.standard_normal((2, p + 9, hkv, hd)).astype(np.float16).astype(np.float32)
        keys, values = kcache[3:p + 3], vcache[5:p + 5]
        q = (rng.standard_normal((1, hkv * g, hd)) * 3).astype(np.float32)
        kpos = np.arange(p)
        for window, at in [(0, p - 1), (max(2, p // 3), p - 1), (0, max(0, p - 3)), (5, p // 2)]:
            for positions in (kpos, rng.permutation(kpos)):
                attrs = {"scale": hd ** -0.5, "window": window}
                pos = np.asarray([at], np.int32)
                got = decode_attention.attend_row(q, keys, values, positions, pos, attrs, 2)
                within_float32(got, q, keys, values, positions, pos, window, attrs["scale"], 2)


def test_decode_attention_other_layouts():
    """Values with a negative stride (read through a contiguous copy) are
    attended; a query of two rows is not one row's (a clear error)."""
    from rkc.runtime.llm.decode_attention import attend_row

    rng = np.random.default_rng(5)
    cache = rng.standard_normal((40, 1, 8)).astype(np.float16).astype(np.float32)
    keys, values = cache[3:33], cache[::-1][:30]
    kpos, attrs = np.arange(30), {"scale": 8 ** -0.5, "window": 0}
    with blas.one_thread():
        q = rng.standard_normal((1, 4, 8)).astype(np.float32)
        within_float32(attend_row(q, keys, values, kpos, np.asarray([29]), attrs, 3), q, keys, values, kpos,
                       np.asarray([29]), 0, attrs["scale"], 3)
        q = rng.standard_normal((2, 4, 8)).astype(np.float32)
        with pytest.raises(ValueError, match="do not fit"):
            attend_row(q, keys, values, kpos, np.arange(28, 30), attrs, 3)


def float64_attention(q, keys, values, kpos, pos, window, scale, rows):
    """The same attention in float64 (the reference both float32 forms are measured against)."""
    t, h, hd = q.shape
    g = h // keys.shape[1]
    out = np.zeros((rows, h, values.shape[-1]))
    allowed = kpos[None, :] <= pos[:, None]
    if window:
        allowed &= (pos[:, None] - kpos[None, :]) < window
    for hh in range(h):
        s = (q[:, hh].astype(np.float64) @ keys[:, hh // g].T.astype(np.float64)) * scale
        s = np.exp(np.where(allowed, s, -np.inf) - np.where(allowed, s, -np.inf).max(axis=1, keepdims=True))
        out[:t, hh] = (s / s.sum(axis=1, keepdims=True)) @ values[:, hh // g].astype(np.float64)
    return out.reshape(rows, -1)


@pytest.mark.parametrize("hd,hkv,g", [(256, 1, 4), (64, 2, 3), (128, 8, 2), (128, 2, 6), (256, 1, 8), (64, 4, 1)])
@pytest.mark.parametrize("t,start", [(2, 0), (4, 7), (7, 3), (38, 150), (65, 0), (128, 0), (128, 300), (150, 0),
                                     (200, 0), (512, 0), (130, 40)])
@pytest.mark.parametrize("layout", ["rows", "npu"])
def test_prefill_attention_by_blocks(hd, hkv, g, t, start, layout):
    """A prefill chunk (two rows or more) attends by
    blocks of query rows over the keys each block sees, its softmax compiled
    in float32 (issue 37: not the einsum's bits). Bound: against a float64
    attention, its largest error at most 2x the einsum formulation's own
    (both float32) or 1e-6 of the largest |value|, whichever is larger;
    causal, sliding windows (inside and past the chunk), GQA groups, keys
    cached before the chunk; queries as rows or as an NPU output read in
    place (tokens innermost: [heads, hd, T] in memory)."""
    rng = np.random.default_rng(hd + t + start)
    p = start + t
    keys = rng.standard_normal((p, hkv, hd)).astype(np.float16).astype(np.float32)
    values = rng.standard_normal((p, hkv, hd)).astype(np.float16).astype(np.float32)
    q = (rng.standard_normal((t, hkv * g, hd)) * 3).astype(np.float32)
    if layout == "npu":
        q = np.ascontiguousarray(q.transpose(1, 2, 0)).transpose(2, 0, 1)
    kpos, pos = np.arange(p), np.arange(start, p)
    with blas.one_thread():
        for window in (0, 100, 512):
            attrs = {"scale": hd ** -0.5, "window": window}
            got = attend(q, keys, values, kpos, pos, attrs, t + 3)
            want = einsum_attention(q, keys, values, kpos, pos, window, attrs["scale"], t + 3)
            exact = float64_attention(q, keys, values, kpos, pos, window, attrs["scale"], t + 3)
            assert not got[t:].any()  # rows past the chunk stay zero
            err = np.abs(want - exact).max()
            assert np.abs(got - exact).max() <= max(2 * err, 1e-6 * np.abs(exact).max()), f"window={window}"


@pytest.mark.parametrize("spread", [8.0, 40.0])
def test_prefill_attention_of_peaked_scores(spread):
    """Scores spread over hundreds (large queries, scale 1, as Gemma's
    q-normed heads can give): most softmax weights underflow. The weights
    the values' product reads are 0 or normal float32 (no subnormal operand:
    prefill_kernels._WEIGHT_FLOOR), and the output keeps
    test_prefill_attention_by_blocks' bound against float64's (scores in
    the hundreds carry float32 errors of ~1e-5 into the weights, the einsum
    formulation's too)."""
    from rkc.runtime.llm import prefill_kernels

    rng = np.random.default_rng(int(spread))
    t, hkv, g, hd = 96, 1, 4, 64
    keys = rng.standard_normal((t, hkv, hd)).astype(np.float16).astype(np.float32)
    values = rng.standard_normal((t, hkv, hd)).astype(np.float16).astype(np.float32)
    q = (rng.standard_normal((t, hkv * g, hd)) * spread).astype(np.float32)
    kpos = pos = np.arange(t)
    seen = []
    softmax = prefill_kernels.softmax_columns

    def recording(s, *args):
        softmax(s, *args)
        seen.append(s.copy())
    import rkc.runtime.llm.prefill_attention as pa
    old, pa.softmax_columns = pa.softmax_columns, recording
    try:
        with blas.one_thread():
            got = attend(q, keys, values, kpos, pos, {"scale": 1.0, "window": 0}, t)
    finally:
        pa.softmax_columns = old
    weights = np.concatenate([w.ravel() for w in seen])
    assert (weights == 0).mean() > 0.3  # the case this test is about: most weights underflow
    assert not ((weights > 0) & (weights < np.finfo(np.float32).tiny)).any()
    exact = float64_attention(q, keys, values, kpos, pos, 0, 1.0, t)
    err = np.abs(einsum_attention(q, keys, values, kpos, pos, 0, 1.0, t) - exact).max()
    assert np.abs(got - exact).max() <= max(2 * err, 1e-6 * np.abs(exact).max())


@pytest.mark.parametrize("hd,hdv", [(8, 8), (64, 64), (256, 256), (16, 8), (80, 40), (128, 128)])
@pytest.mark.parametrize("hkv,g", [(1, 1), (1, 4), (2, 3), (8, 2), (4, 1), (2, 4), (1, 9), (1, 6)])
def test_decode_attention_over_the_fp16_rows(hd, hdv, hkv, g, monkeypatch):
    """A fused attention stretch's one-row attention (decode_attention.RowAttention
    over the cache's fp16 rows, its output row made once) within float32
    tolerance of a float64 attention over the same values, token after
    token as a decode runs: prefill chunks between the decode steps, every
    key visible, a sliding window dropping the oldest (the cache's buffers
    sliding), contexts past 1000, two layers sharing the work buffer, and the
    keys cut into blocks shared by two threads or run on one in one call
    (blocks of 40 keys here, so that some ranges see no key at all under the
    window of 7); groups of four
    query heads and more (their keys in pairs and fours, odd counts left
    over), and of fewer."""
    from rkc.runtime.llm import decode_attention
    from rkc.runtime.llm.decode_attention import RowAttention, RowWork
    from rkc.runtime.llm.kvcache import KVCache

    monkeypatch.setattr(decode_attention, "KEYS_PER_BLOCK", 40)
    monkeypatch.setattr(decode_attention, "SHARED_KEYS", 80)
    rng = np.random.default_rng(hd * 100 + hkv * 10 + g + hdv)
    scale = hd ** -0.5
    for window in (0, 7, 300):
        windows = [window, 0]
        cache, work = KVCache(2, windows, 2000), RowWork()
        attend_ = [RowAttention(hkv * g, hkv, hd, hdv, scale, w, work, threads_max=2) for w in windows]
        alone = [RowAttention(hkv * g, hkv, hd, hdv, scale, w, work, threads_max=1) for w in windows]
        pos, steps = 0, 0
        for t in [3, 1, 1, 9, 1, 1, 290, 1, 1, 120, 1, 600, 1]:
            k = rng.standard_normal((t, hkv, hd)).astype(np.float32)
            v = rng.standard_normal((t, hkv, hdv)).astype(np.float32)
            p = np.arange(pos, pos + t)
            if t > 1:
                for layer in range(2):
                    cache.store_and_view(layer, k, v, p)
                pos += t
                continue
            for layer in range(2):
                q = (rng.standard_normal((1, hkv * g, hd)) * 3).astype(np.float32)
                k16, v16, kpos = cache.store_half(layer, k, v, p.astype(np.int32))
                keys, values, seen = cache.shared(layer)
                np.testing.assert_array_equal(seen, kpos)
                np.testing.assert_array_equal(keys, k16.astype(np.float32))
                got = attend_[layer](q, k16, v16, kpos, pos)
                within_float32(got, q, keys, values, kpos, p, windows[layer], scale, 1)
                got = alone[layer](q, k16, v16, kpos, pos)  # every block on this thread, in one call
                within_float32(got, q, keys, values, kpos, p, windows[layer], scale, 1)
                # the fused stretch's call: the same blocks over the whole buffers' rows [s, e), sliced in it
                kb, vb, pb = cache.half_bits(layer)
                s = (k16.ctypes.data - kb.ctypes.data) // kb[0].nbytes
                e = s + len(kpos)
                np.testing.assert_array_equal(pb[s:e], kpos)
                one = alone[layer]
                scores, bits = work.buffers(hkv * g * (e - s), e - s)
                dst = np.full((hkv * g, hdv), np.nan, np.float32)
                decode_attention.attend_span(q[0], kb, vb, pb, s, e, pos, one.scale_value, one.window,
                                             one.blocks(e - s), scores, bits, one.acc, one.mx, one.total, dst)
                np.testing.assert_array_equal(dst.reshape(1, -1), got)
                steps += 1
            pos += 1
        assert steps == 2 * 8


def test_decode_attention_sees_no_key(monkeypatch):
    """A query that sees no key (every cached position after it) gives NaN, as
    the softmax of nothing but -inf does, in one range or cut into two."""
    from rkc.runtime.llm import decode_attention
    from rkc.runtime.llm.decode_attention import RowAttention, RowWork

    monkeypatch.setattr(decode_attention, "KEYS_PER_BLOCK", 40)
    monkeypatch.setattr(decode_attention, "SHARED_KEYS", 80)
    rng = np.random.default_rng(3)
    keys, values = rng.standard_normal((2, 90, 1, 8)).astype(np.float16)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    for threads_max in (1, 2):
        got = RowAttention(2, 1, 8, 8, 0.3, 0, RowWork(), threads_max)(q, keys, values, np.arange(10, 100), 5)
        assert np.isnan(got).all()


def test_cached_rows_widen_as_numpy_widens_fp16():
    """decode attention's widening of the cache's fp16 rows (half.widen_value
    through decode_attention._value) gives numpy's float32 value for every fp16
    pattern: the same bits for every number and infinity, a NaN for a NaN."""
    from numba import njit

    from rkc.runtime.llm.decode_attention import _value

    @njit
    def widen_rows(src, out):
        for r in range(src.shape[0]):
            for d in range(src.shape[1]):
                out[r, d] = _value(src, r, d)

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    out = np.empty((256, 256), np.float32)
    widen_rows(bits, out)
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert nan.sum() == 2 * 1023 and np.isnan(out[nan]).all()
    np.testing.assert_array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))
