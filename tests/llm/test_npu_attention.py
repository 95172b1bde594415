"""Prefill attention with its two products on the NPU (compiler/llm/npu_attention.py,
runtime/llm/npu_attention.py), run on the simulator against a float64 numpy
attention over a sweep of heads, KV heads (GQA groups), head dims 64/128/256,
chunks of 1 to 130 rows, with and without a cache before the chunk, empty
slots, sliding windows over a ring.

The reference is the float64 attention of what the NPU is given: the cache's
keys and values as the KV cache holds them (fp16 values) and the queries
rounded to fp16 (the products' input conversion, as at every fp16 segment's
edge). What remains is the probabilities' fp16 rounding (relative 2^-11 each)
and the fp32 sums: the output is within 2^-10 of max |v|, elementwise."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.compiler.llm.npu_attention import AttentionShape, HeadBuffers, products
from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.ir.errors import UnsupportedError
from rkc.runtime.llm import npu_attention as host

sim = pytest.importorskip("rkc.runtime.sim")
from llm.npu_attention_runner import ChunkRun, attend  # noqa: E402

def reference(q, keys, values, kpos, pos, scale, window=0) -> np.ndarray:
    """float64 attention of q [T, H, D] over keys/values [P, Hkv, D] at kpos: [T, H * Dv]."""
    t, h, _ = q.shape
    g = h // keys.shape[1]
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, keys, values))
    s = np.einsum("thd,phd->thp", q64, np.repeat(k64, g, axis=1)) * scale
    p, qp = np.asarray(kpos)[None, None, :], np.asarray(pos)[:, None, None]
    hidden = (p > qp) | ((window > 0) & (qp - p >= window))
    s = np.where(hidden, -np.inf, s)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("thp,phd->thd", w, np.repeat(v64, g, axis=1)).reshape(t, -1)


def _half(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


# (chunk rows, query heads, kv heads, head dim, cached keys before the chunk, key slots, window)
CASES = [
    (1, 1, 1, 64, 0, 32, 0),
    (1, 8, 2, 128, 37, 64, 0),  # a decode-sized chunk over a cache
    (2, 4, 4, 64, 0, 32, 0),  # MHA
    (7, 12, 2, 128, 0, 32, 0),  # Qwen2.5-1.5B's grouping (6 heads a group)
    (16, 4, 1, 256, 16, 64, 0),  # Gemma 3 270M's grouping and head dim
    (33, 6, 3, 64, 5, 96, 0),  # empty slots past the fill
    (64, 8, 1, 128, 64, 128, 0),
    (130, 4, 1, 256, 0, 160, 0),  # more rows than one kernel group, a partial last one
    (40, 4, 1, 256, 100, 160, 32),  # a sliding window shorter than the chunk
    (128, 12, 2, 128, 128, 256, 0),
]


@pytest.mark.parametrize("rows,heads,kv_heads,head_dim,past,slots,window", CASES)
def test_npu_attention_matches_float64(rows, heads, kv_heads, head_dim, past, slots, window):
    rng = np.random.default_rng(rows * 1009 + heads * 31 + head_dim + past)
    keys_total = past + rows
    q = (rng.standard_normal((rows, heads, head_dim)) * 1.5).astype(np.float32)
    k = _half(rng, (keys_total, kv_heads, head_dim))
    v = _half(rng, (keys_total, kv_heads, head_dim), 2.0)
    kpos, pos = np.arange(keys_total), np.arange(past, past + rows)
    scale = 1 / np.sqrt(head_dim)
    got = attend(sim.SimDevice(), q, k, v, kpos, pos, scale, slots, window)
    want = reference(q.astype(np.float16), k, v, kpos, pos, scale, window)
    tol = 2.0 ** -10 * np.abs(v).max()
    assert np.isfinite(got).all()
    err = np.abs(got - want).max()
    assert err <= tol, f"max error {err:.3g} above {tol:.3g}"


def test_npu_attention_over_a_ring_of_slots():
    """A sliding-window layer's cache is a ring (slot = position mod slots):
    the newest keys overwrite the oldest, the slots hold positions out of
    order, the mask reads each slot's position. Earlier chunks are stored,
    then a chunk attends over the window, against the float64 attention over
    the whole history."""
    rng = np.random.default_rng(7)
    window, rows, start, d = 48, 24, 90, 128
    run = ChunkRun(sim.SimDevice(), AttentionShape(rows, 2, d, d, 96), 1, window)
    k, v = _half(rng, (start + rows, 1, d)), _half(rng, (start + rows, 1, d))
    for c0 in range(0, start, 20):
        c1 = min(start, c0 + 20)
        run.cache.store(k[c0:c1], v[c0:c1], np.arange(c0, c1))
    pos = np.arange(start, start + rows)
    run.cache.store(k[start:], v[start:], pos)
    assert sorted(run.cache.positions) == list(range(start + rows - 96, start + rows))
    q = rng.standard_normal((rows, 2, d)).astype(np.float32)
    got = run.attend(q, pos, 0.125)
    want = reference(q.astype(np.float16), k, v, np.arange(start + rows), pos, 0.125, window)
    assert np.abs(got - want).max() <= 2.0 ** -10 * np.abs(v).max()


def test_consecutive_chunks_read_the_cache_they_left():
    """Two chunks of one program over a linear cache: the second's queries
    see the first's keys, written in place by the first chunk's store."""
    rng = np.random.default_rng(9)
    rows, d = 32, 64
    run = ChunkRun(sim.SimDevice(), AttentionShape(rows, 3, d, d, 64), 2)
    k, v = _half(rng, (2 * rows, 2, d)), _half(rng, (2 * rows, 2, d))
    q = rng.standard_normal((2 * rows, 6, d)).astype(np.float32)
    for c0 in (0, rows):
        pos = np.arange(c0, c0 + rows)
        run.cache.store(k[c0:c0 + rows], v[c0:c0 + rows], pos)
        got = run.attend(q[c0:c0 + rows], pos, d ** -0.5)
        want = reference(q[c0:c0 + rows].astype(np.float16), k[:c0 + rows], v[:c0 + rows], np.arange(c0 + rows),
                         pos, d ** -0.5)
        assert np.abs(got - want).max() <= 2.0 ** -10 * np.abs(v).max()


def test_a_cache_refuses_what_it_cannot_hold():
    keys, values = [np.zeros(64 * 64, np.float16)], [np.zeros(64 * 64, np.float16)]
    with pytest.raises(ValueError, match="past the cache"):
        host.LayerCache(keys, values, 64, 64, 64).store(np.zeros((1, 1, 64)), np.zeros((1, 1, 64)), np.array([64]))
    with pytest.raises(ValueError, match="cannot hold a window"):
        host.LayerCache(keys, values, 64, 64, 64, window=48).store(np.zeros((20, 1, 64)), np.zeros((20, 1, 64)),
                                                                   np.arange(20))


def test_the_products_read_the_cache_in_place():
    """No constant is packed: both GEMMs' B operands are the cache's and the
    softmax's buffers, and every task reads them where the host writes them."""
    shape = AttentionShape(64, 6, 128, 128, 256)
    buf = HeadBuffers.named("chunk", "cache")
    qk, pv = (emit(g, api.EmitOptions()) for g in products(shape, buf, "attn"))
    assert not qk.constants and not pv.constants
    assert {b for t in qk.tasks for b, *_ in t.touches} == {buf.queries, buf.keys, buf.scores}
    assert {b for t in pv.tasks for b, *_ in t.touches} == {buf.values, buf.probs, buf.out}
    k_elems, v_elems = host.cache_elements(256, 128, 128)
    assert qk.extents()[buf.keys] <= 2 * k_elems and pv.extents()[buf.values] <= 2 * v_elems


def test_cache_offsets_are_the_packed_layouts():
    """The host's offsets place each key and value where layout.pack_weights and
    pack_feature put B^T and A (the products' own packing of constants)."""
    from rkc.ir.npu import layout
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((48, 128)).astype(np.float16)
    flat = np.zeros(host.cache_elements(48, 128, 64)[0], np.float16)
    flat[host.key_offsets(np.arange(48), 128)] = keys
    np.testing.assert_array_equal(flat, layout.pack_weights(keys[:, None, None, :]))
    vals = rng.standard_normal((48, 64)).astype(np.float16)
    flat = np.zeros(host.cache_elements(48, 128, 64)[1], np.float16)
    flat[host.value_offsets(np.arange(48), 64)] = vals
    np.testing.assert_array_equal(flat, layout.pack_feature(vals[:, :, None]).reshape(-1))


@pytest.mark.parametrize("bad", ["keys", "int8"])
def test_bad_shapes_are_refused(bad):
    if bad == "keys":
        with pytest.raises(UnsupportedError, match="whole groups of 32"):
            AttentionShape(8, 2, 64, 64, 40)
        return
    g = api.Gemm(api.Feature.gemm("a", 0, 8, 64, "int8"), np.broadcast_to(np.int8(0), (64, 32)),
                 api.Feature.gemm("c", 0, 8, 32, "int32"), 8, b_buffer="cache")
    with pytest.raises(UnsupportedError, match="run-time B operand is fp16"):
        emit(g, api.EmitOptions())


def test_probabilities_round_to_fp16_as_numpy():
    """The softmax's fp16 rounding of a probability (runtime/llm/npu_attention
    ._halves_of_units) is numpy's astype over [0, 1]: every denormal and the
    smallest normals, ties of every exponent, and a random sample."""
    rng = np.random.default_rng(11)
    ties = np.arange(-24, 1)[:, None]
    picks = [np.arange(0, 0x3880_0000, 0x100, dtype=np.uint32).view(np.float32),  # up to 2^-14 and past
             (np.ldexp(1.0, ties) * (1 + (np.arange(1024)[None, :] + 0.5) / 1024)).astype(np.float32).ravel(),
             rng.random(1 << 18, np.float32), np.array([0.0, 1.0, 2.0 ** -25, 2.0 ** -24], np.float32)]
    x = np.concatenate(picks)
    x = x[(x >= 0) & (x <= 1)]
    out = np.empty(x.size, np.uint16)
    host._halves_of_units(x, 0, x.size, np.empty_like(x), out)
    np.testing.assert_array_equal(out, x.astype(np.float16).view(np.uint16))


def test_the_cost_model_counts_the_npu_paths_host_work():
    """Two submissions a layer cost more than a short chunk's products on the
    host (at its peak); the NPU path's own host work (queries, scores and
    probabilities converted) costs more than the products it saves at Qwen2.5-1.5B's
    shapes (bench/prefill_attention.py measured the same), less at Gemma 3
    270M's 512 rows (four query heads a key head, 256 wide)."""
    from rkc.compiler.llm.npu_attention import modelled_seconds, npu_path_host_seconds, on_npu
    qwen = [AttentionShape(c, 6, 128, 128, max(32, c)) for c in (8, 128, 512)]
    assert [on_npu(s, 2) for s in qwen] == [False, False, False]
    times = [modelled_seconds(s, 2) for s in qwen]
    assert times == sorted(times) and times[0] > 0
    extra = [npu_path_host_seconds(s, 2) for s in qwen]
    assert extra == sorted(extra) and extra[0] > 0
    assert [on_npu(AttentionShape(c, 4, 256, 256, c), 1) for c in (128, 512)] == [False, True]
