"""The prefill kernels over tokens-innermost tensors (runtime/llm/prefill_channels.py,
and the prepared RMSNorm / RoPE steps that route such inputs to them) against
float64 references, over shapes and both RoPE pairings. Float32 tolerance:
RMSNorm and RoPE are a few roundings per value, so 4 float32 ulps of the
largest output (relative 5e-7) bound them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from llm import reference

from rkc.ir.program import Step
from rkc.runtime.llm import prefill_channels as channels
from rkc.runtime.llm import prepared

TOL = 4 * np.finfo(np.float32).eps


def npu_layout(rng, t: int, heads: int, d: int, scale: float = 3.0) -> np.ndarray:
    """A [T, heads, D] float32 tensor laid out as an NPU output read in place: [heads, D, T] in memory."""
    return (rng.standard_normal((heads, d, t)) * scale).astype(np.float32).transpose(2, 0, 1)


def rope64(x: np.ndarray, pos: np.ndarray, dims: int, base: float, neox: bool) -> np.ndarray:
    """reference.rope (float64) for a bare RoPE step: no config beyond its pairing and dims."""
    cfg = SimpleNamespace(rope_mode="neox" if neox else "normal", rope_dims=dims)
    return reference.rope(x.astype(np.float64), pos, cfg, base, 1.0, None)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL * np.abs(want).max())


@pytest.mark.parametrize("t,heads,d", [(16, 1, 8), (32, 4, 256), (45, 2, 64), (128, 1, 640), (200, 3, 96)])
def test_rms_norm_channel_major_is_float64s(t, heads, d):
    rng = np.random.default_rng(t * 7 + d)
    x = npu_layout(rng, t, heads, d)
    x[1] *= 1e-3  # a small row: eps matters there
    w = rng.standard_normal(d).astype(np.float32)
    step = Step("cpu", "norm", op="RMSNorm", inputs=["x", "w"], outputs=["y"], attrs={"epsilon": 1e-6})
    run = prepared.rms_norm(step, [None, w], None)
    got = run([x, w])[0]
    _close(got, reference.rms_norm(x.astype(np.float64), w.astype(np.float64), 1e-6))
    assert channels.channel_major(got) is not None  # the output keeps the input's layout


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("t,heads,d,dims", [(16, 1, 64, 64), (48, 4, 256, 256), (33, 2, 128, 64)])
def test_rope_channel_major_is_float64s(neox, t, heads, d, dims):
    rng = np.random.default_rng(t + d + dims)
    x = npu_layout(rng, t, heads, d)
    pos = (np.arange(t) + 37).astype(np.int32)
    attrs = {"dims": dims, "base": 10000.0, "scale": 1.0, "mode": "neox" if neox else "normal"}

    class State:
        pass
    step = Step("cpu", "rope", op="RoPE", inputs=["x", "pos"], outputs=["y"], attrs=attrs)
    run = prepared.rope(step, [None, None], State())
    got = run([x, pos])[0]
    # the angles are rounded to float32 cos/sin first (as every RoPE kernel here): the bound is
    # a few roundings of values up to |x|, plus those of the tables
    want = rope64(x, pos, dims, 10000.0, neox)
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * TOL * np.abs(x).max())
    assert channels.channel_major(got) is not None


def test_row_major_tensors_are_not_channel_major():
    rng = np.random.default_rng(0)
    assert channels.channel_major(rng.standard_normal((32, 4, 8)).astype(np.float32)) is None
    assert channels.channel_major(npu_layout(rng, 32, 4, 8)).shape == (4, 8, 32)


@pytest.mark.parametrize("t,heads,d", [(16, 1, 256), (45, 2, 24), (128, 1, 512), (17, 1, 8)])
def test_kv_rows_from_npu_layout_are_numpys_casts(t, heads, d):
    """A chunk's keys in the NPU's layout stored as KV cache rows: the fp16
    values numpy's cast gives (overflow, subnormals, ties included; a NaN a
    NaN, its payload not kept) and the fp32 rows exactly those widened."""
    rng = np.random.default_rng(t + d)
    x = npu_layout(rng, t, heads, d)
    x[1, 0, :4] = [np.nan, np.inf, 7e4, 3e-6]
    x[2, -1, -1] = -np.float32(np.nan)
    x[3, 0, :3] = [65520.0, -6e-8, 1.0 + 2.0 ** -11]  # to inf; to the smallest subnormal; a tie to even
    rows16, rows32 = np.empty(x.shape, np.float16), np.empty(x.shape, np.float32)
    assert channels.store_rows(x, rows16, rows32)
    with np.errstate(over="ignore"):
        want16 = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.isnan(rows16[nan]).all() and np.isnan(rows32[nan]).all()
    np.testing.assert_array_equal(rows16.view(np.uint16)[~nan], want16.view(np.uint16)[~nan])
    np.testing.assert_array_equal(rows32.view(np.uint32), rows16.astype(np.float32).view(np.uint32))
    assert not channels.store_rows(np.ascontiguousarray(x), rows16, rows32)  # rows: numpy's path


@pytest.mark.parametrize("norm,rotary", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("t,heads,d,dims", [(16, 1, 64, 64), (45, 4, 256, 256), (128, 2, 512, 128), (200, 3, 96, 64)])
def test_norm_rope_in_place_is_float64s(norm, rotary, neox, t, heads, d, dims):
    """A q or k edge's per-head RMSNorm then RoPE in one pass, in place
    (channels.norm_rope, what fused_rows' heads edge runs after dequantizing):
    within the two kernels' bounds of float64's."""
    rng = np.random.default_rng(t * 13 + d + dims + 2 * norm + rotary)
    x = npu_layout(rng, t, heads, d)
    x[:, 0] *= 1e-3  # a small head: eps matters there
    w = rng.standard_normal(d).astype(np.float32)
    pos = (np.arange(t) + 11).astype(np.int32)
    tables = prepared._RopeTables(10000.0 ** (-np.arange(0, dims, 2, dtype=np.float64) / dims), 1.0)
    cos_t, sin_t = tables.at_transposed(pos)
    got = x.copy(order="K")
    xc = channels.channel_major(got)
    channels.norm_rope(xc, norm, w, np.float32(1e-6), rotary, cos_t, sin_t, dims, neox, 0, heads, t)
    want = x.astype(np.float64)
    if norm:
        want = reference.rms_norm(want, w.astype(np.float64), 1e-6)
    if rotary:
        want = rope64(want, pos, dims, 10000.0, neox)
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * TOL * np.abs(want).max())


def test_norm_rope_touches_only_its_blocks():
    rng = np.random.default_rng(5)
    x = npu_layout(rng, 32, 4, 64)
    before = x.copy()
    cos_t, sin_t = prepared._RopeTables(np.ones(32), 1.0).at_transposed(np.arange(32, dtype=np.int32))
    channels.norm_rope(channels.channel_major(x), True, np.ones(64, np.float32), np.float32(1e-6), True,
                       cos_t, sin_t, 64, True, 1, 3, 32)
    assert np.array_equal(x[:, [0, 3]], before[:, [0, 3]]) and not np.array_equal(x[:, 1:3], before[:, 1:3])


def test_norm_rope_leaves_the_pad_tokens():
    """Tokens past `tokens` pad a short chunk: left as they are, the real
    ones as a call over only them gives."""
    rng = np.random.default_rng(6)
    x = npu_layout(rng, 48, 2, 64)
    x[20:] = np.nan  # what a pad row may hold: never read
    cos_t, sin_t = prepared._RopeTables(np.ones(32), 1.0).at_transposed(np.arange(48, dtype=np.int32))
    alone = np.ascontiguousarray(x[:20].transpose(1, 2, 0))  # [B, D, 20], C order
    channels.norm_rope(alone, True, np.ones(64, np.float32), np.float32(1e-6), True,
                       np.ascontiguousarray(cos_t[:, :20]), np.ascontiguousarray(sin_t[:, :20]), 64, True, 0, 2, 20)
    channels.norm_rope(channels.channel_major(x), True, np.ones(64, np.float32), np.float32(1e-6), True,
                       cos_t, sin_t, 64, True, 0, 2, 20)
    assert np.isnan(x[20:]).all() and np.array_equal(x[:20], alone.transpose(2, 0, 1))


def per_layer_inputs64(proj: np.ndarray, scale: float, w: np.ndarray, eps: float, rows: np.ndarray,
                       mix: float) -> np.ndarray:
    """Gemma 4's per-layer inputs in float64: (RMSNorm(scale * proj per layer, w) + rows) * mix."""
    t, layers, p = rows.shape
    x = proj.astype(np.float64).reshape(t, layers, p) * scale
    return (reference.rms_norm(x, w.astype(np.float64), eps) + rows) * mix


@pytest.mark.parametrize("npu", [True, False])
@pytest.mark.parametrize("t,layers,p", [(1, 1, 8), (16, 3, 64), (45, 5, 256), (128, 35, 256), (130, 2, 96)])
def test_per_layer_inputs_are_float64s(npu, t, layers, p):
    """The fused per-layer inputs kernel over the NPU's layout (tokens innermost) and C order, each
    layer range alone (threads take disjoint ranges): 4 float32 ulps of the largest output."""
    rng = np.random.default_rng(t * 31 + layers * 7 + p)
    proj = (rng.standard_normal((t, layers * p)) * 20.0).astype(np.float32)
    proj[:, :p] *= 1e-4  # a small layer: eps matters there
    if npu:
        proj = np.asfortranarray(proj)
    rows = rng.standard_normal((t, layers, p)).astype(np.float32)
    w = rng.standard_normal(p).astype(np.float32)
    scale, mix, eps = np.float32(1 / np.sqrt(1536)), np.float32(1 / np.sqrt(2)), np.float32(1e-6)
    xv = np.lib.stride_tricks.as_strided(proj, (layers, p, t), (p * proj.strides[1], proj.strides[1], proj.strides[0]))
    out = np.full((t, layers, p), np.nan, np.float32)
    cut = layers // 2
    channels.per_layer_inputs(xv, scale, w, eps, rows, mix, out, 0, cut, t)
    channels.per_layer_inputs(xv, scale, w, eps, rows, mix, out, cut, layers, t)
    _close(out, per_layer_inputs64(proj, float(scale), w, float(eps), rows, float(mix)))


def test_per_layer_inputs_leave_the_pad_tokens():
    rng = np.random.default_rng(5)
    proj = rng.standard_normal((32, 3 * 16)).astype(np.float32)
    rows = rng.standard_normal((32, 3, 16)).astype(np.float32)
    out = np.full((32, 3, 16), 7.0, np.float32)
    xv = np.lib.stride_tricks.as_strided(proj, (3, 16, 32), (16 * 4, 4, proj.strides[0]))
    channels.per_layer_inputs(xv, np.float32(1), np.ones(16, np.float32), np.float32(1e-6), rows, np.float32(1),
                              out, 0, 3, 20)
    assert np.all(out[20:] == 7.0) and np.all(np.isfinite(out[:20])) and not np.any(out[:20] == 7.0)
