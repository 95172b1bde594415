"""The runtime's attention (runtime/llm/kernels.attend) computes what numpy's
einsum formulation computes, bit for bit: for one query row its scores come
from a float32 matmul instead of the einsum (numpy's einsum takes each score
as a BLAS dot product; sgemm sums in the same order), which this checks over
head sizes, KV-head groupings, key counts, windows, and keys that are a view
into a larger cache (as the KV cache hands them over)."""

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
def test_attention_is_the_einsum_formulation(hd, hkv, g, t):
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
                want = einsum_attention(q, keys, values, kpos, pos, window, attrs["scale"], t + 1)
                np.testing.assert_array_equal(got, want, err_msg=f"p={p} window={window} pos={pos[0]}")


@pytest.mark.parametrize("hd", [8, 16, 64, 256])
@pytest.mark.parametrize("hkv,g", [(1, 1), (1, 4), (2, 3), (8, 2), (4, 1)])
def test_decode_attention_is_the_einsum_formulation(hd, hkv, g, monkeypatch):
    """The plans' one-row attention (runtime/llm/decode_attention.py: the
    einsum's matmuls on views of the cache, compiled softmax loops) against
    the einsum formulation, bit for bit: keys and values that are views into
    larger caches (as the KV cache hands them over), every key visible, a
    window that hides the oldest keys, keys after the query (masked), and
    out-of-order positions. None of these fall back to kernels.attend."""
    from rkc.runtime.llm import decode_attention

    def no_fallback(*args):
        raise AssertionError("fell back to kernels.attend")
    monkeypatch.setattr(decode_attention, "attend", no_fallback)
    rng = np.random.default_rng(hd * 100 + hkv * 10 + g + 1)
    with blas.one_thread():
        for p in (1, 2, 7, 8, 9, 23, 100, 257, 600, 1030):
            kcache, vcache = rng.standard_normal((2, p + 9, hkv, hd)).astype(np.float16).astype(np.float32)
            keys, values = kcache[3:p + 3], vcache[5:p + 5]
            q = (rng.standard_normal((1, hkv * g, hd)) * 3).astype(np.float32)
            kpos = np.arange(p)
            cases = [(0, p - 1), (max(2, p // 3), p - 1), (0, max(0, p - 3)), (5, p // 2)]
            for window, at in cases:
                for positions in (kpos, rng.permutation(kpos)):
                    attrs = {"scale": hd ** -0.5, "window": window}
                    pos = np.asarray([at], np.int32)
                    got = decode_attention.attend_row(q, keys, values, positions, pos, attrs, 2)
                    want = einsum_attention(q, keys, values, positions, pos, window, attrs["scale"], 2)
                    np.testing.assert_array_equal(got, want, err_msg=f"p={p} window={window} pos={at}")


def test_decode_attention_leaves_other_layouts_to_the_kernel():
    """Values with a negative stride (the einsum copies those before its
    matmul) and a query of two rows go to kernels.attend: its bits."""
    from rkc.runtime.llm.decode_attention import attend_row

    rng = np.random.default_rng(5)
    cache = rng.standard_normal((40, 1, 8)).astype(np.float16).astype(np.float32)
    keys, values = cache[3:33], cache[::-1][:30]
    kpos, attrs = np.arange(30), {"scale": 8 ** -0.5, "window": 0}
    with blas.one_thread():
        for t in (1, 2):
            q = rng.standard_normal((t, 4, 8)).astype(np.float32)
            pos = np.arange(30 - t, 30)
            want = (einsum_attention(q, keys, values, kpos, pos, 0, attrs["scale"], 3) if t == 1
                    else attend(q, keys, values, kpos, pos, attrs, 3))  # two rows: a prefill chunk's kernel
            np.testing.assert_array_equal(attend_row(q, keys, values, kpos, pos, attrs, 3), want)


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


@pytest.mark.parametrize("hd,hkv,g", [(256, 1, 4), (64, 2, 3), (128, 8, 2)])
@pytest.mark.parametrize("t,start", [(2, 0), (4, 7), (38, 150), (65, 0), (128, 0), (128, 300), (200, 0), (512, 0),
                                     (130, 40)])
def test_prefill_attention_by_blocks(hd, hkv, g, t, start):
    """A prefill chunk (two rows or more) attends by
    blocks of query rows over the keys each block sees, its softmax compiled
    in float32 (issue 37: not the einsum's bits). Bound: against a float64
    attention, its largest error at most 2x the einsum formulation's own
    (both float32) or 1e-6 of the largest |value|, whichever is larger;
    causal, sliding windows (inside and past the chunk), GQA groups, keys
    cached before the chunk."""
    rng = np.random.default_rng(hd + t + start)
    p = start + t
    keys = rng.standard_normal((p, hkv, hd)).astype(np.float16).astype(np.float32)
    values = rng.standard_normal((p, hkv, hd)).astype(np.float16).astype(np.float32)
    q = (rng.standard_normal((t, hkv * g, hd)) * 3).astype(np.float32)
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


@pytest.mark.parametrize("hd,hdv", [(8, 8), (64, 64), (256, 256), (16, 8)])
@pytest.mark.parametrize("hkv,g", [(1, 1), (1, 4), (2, 3), (8, 2), (4, 1)])
def test_decode_attention_over_the_fp16_rows_is_the_einsum_formulation(hd, hdv, hkv, g):
    """A fused attention stretch's one-row attention (decode_attention.RowAttention:
    the cache's fp16 rows widened into a shared buffer, its output row made
    once) against the einsum formulation over the cache's fp32 rows, bit for
    bit, token after token as a decode runs: prefill chunks between the
    decode steps, every key visible, a sliding window dropping the oldest
    (the cache's buffers sliding), contexts past 300 keys (where sgemm
    leaves its small-matrix kernel) and past 1000, two layers sharing the
    work buffer."""
    from rkc.runtime.llm.decode_attention import RowAttention, RowWork
    from rkc.runtime.llm.kvcache import KVCache

    rng = np.random.default_rng(hd * 100 + hkv * 10 + g + hdv)
    scale = hd ** -0.5
    with blas.one_thread():
        for window in (0, 7, 300):
            windows = [window, 0]
            cache, work = KVCache(2, windows, 2000), RowWork()
            attend = [RowAttention(hkv * g, hkv, hd, hdv, scale, w, work) for w in windows]
            pos, steps = 0, 0
            for t in [3, 1, 1, 9, 1, 1, 290, 1, 1, 1, 120, 1, 1, 600, 1, 1]:
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
                    got = attend[layer](q, k16, v16, kpos, pos)
                    want = einsum_attention(q, keys, values, kpos, p, windows[layer], scale, 1)
                    np.testing.assert_array_equal(got, want, err_msg=f"pos={pos} layer={layer} window={window}")
                    steps += 1
                pos += 1
            assert steps == 2 * 11


def test_cached_rows_widen_as_numpy_widens_fp16():
    """decode attention's widening of the cache's fp16 rows (half.widen_all)
    gives numpy's astype bits for every fp16 pattern, NaN payloads included."""
    from rkc.runtime.half import widen_all

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.size, np.uint32)
    widen_all(bits, out)
    np.testing.assert_array_equal(out, bits.view(np.float16).astype(np.float32).view(np.uint32))
