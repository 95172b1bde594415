"""The measuring tools of the int8 work (tools/llm_top1_noise.py,
tools/llm_quant_eval.py's K-group emulation) against plain float64 references."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import llm_quant_eval  # noqa: E402
import llm_top1_noise  # noqa: E402

from llm.llamacpp import Agreement  # noqa: E402
from rkc.compiler.llm.quantize import quantize_matrix  # noqa: E402
from rkc.runtime.kernels.hadamard import make_rotation, unrotate  # noqa: E402
from rkc.runtime.llm.weights import Int8Weight, quantize_rows  # noqa: E402


@pytest.mark.parametrize("size", [1e-3, 0.03, 0.5])
def test_noise_figures_are_the_log_softmax_figures(size):
    """Block.figures' KLs and top-1 from the perturbation alone equal
    llamacpp.Agreement's (float64 log-softmaxes of the perturbed logits)."""
    rng = np.random.default_rng(3)
    logits = (3 * rng.standard_normal((24, 3000))).astype(np.float32)
    ref = logits + (0.3 * rng.standard_normal(logits.shape)).astype(np.float32)
    ref[:4] = logits[:4]  # some rows where the references agree exactly
    delta = (size * rng.standard_normal(logits.shape)).astype(np.float32)
    kl_float, kl_ref, top1 = llm_top1_noise.Block(logits, ref).figures(delta)
    tokens = list(range(len(logits) + 1))
    vs_float, vs_ref = Agreement(), Agreement()
    vs_float.add(logits, logits + delta, tokens)
    vs_ref.add(ref, logits + delta, tokens)
    assert kl_float / len(logits) == pytest.approx(vs_float.figures()["kl"], rel=1e-4)
    assert kl_ref / len(logits) == pytest.approx(vs_ref.figures()["kl"], rel=1e-4)
    assert top1 == vs_ref.top1
    assert vs_ref.top1 < len(logits) or size < 0.1  # the largest noise moves some top-1


def test_head_inputs_are_recovered_from_the_logits():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5000, 64)).astype(np.float32)
    h = rng.standard_normal((10, 64)).astype(np.float32)
    got = llm_top1_noise.head_inputs(h @ w.T, w, vocab_block=1024)
    np.testing.assert_allclose(got, h, rtol=0, atol=1e-5)


def test_npy_rows_reads_blocks(tmp_path):
    a = np.arange(60, dtype=np.float32).reshape(12, 5)
    np.save(tmp_path / "a.npy", a)
    rows = llm_top1_noise.NpyRows(tmp_path / "a.npy")
    assert len(rows) == 12
    np.testing.assert_array_equal(rows[3:7], a[3:7])
    np.testing.assert_array_equal(rows[10:20], a[10:])


def _grouped_reference(x, q, scale, group, rot):
    """y = sum over groups of (int sums) x row scale x group scale, all in float64."""
    xq, xs = quantize_rows(x, rot)
    n, k = q.shape
    y = np.zeros((len(x), n))
    for g in range(k // group):
        cols = slice(g * group, (g + 1) * group)
        sums = xq[:, cols].astype(np.float64) @ q[:, cols].astype(np.float64).T
        y += sums * xs.astype(np.float64)[:, None] * scale[:, g].astype(np.float64)[None, :]
    return y


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("rotated", [False, True])
def test_grouped_int8_emulation_is_its_float64_reference(group, rotated):
    rng = np.random.default_rng(5)
    k = 640
    rot = make_rotation(k) if rotated else None
    w = rng.standard_normal((48, k)).astype(np.float32)
    w[:, 7] *= 30  # an outlier column: its group's scales differ from the others'
    x = rng.standard_normal((9, k)).astype(np.float32)
    weight = llm_quant_eval.GroupedInt8Weight.rounded(w, group, rot)
    # the rounding: nearest, a max/127 scale per row and group, in float64
    wg = w.astype(np.float64).reshape(48, -1, group)
    s64 = np.abs(wg).max(axis=2) / 127
    np.testing.assert_allclose(weight.scale, s64, rtol=1e-7)
    q64 = np.clip(np.rint(wg / weight.scale.astype(np.float64)[:, :, None]), -127, 127).reshape(48, k)
    assert np.mean(weight.q == q64) > 0.9999  # float32 / float64 division ties apart
    got = weight.matmul(x)
    want = _grouped_reference(x, weight.q, weight.scale, group, rot)
    np.testing.assert_allclose(got, want, rtol=2 ** -23, atol=0)
    assert got.dtype == np.float32
    # finer than one scale a row: the dense weight (rotated back) nearer the float one
    per_row = Int8Weight(*quantize_matrix(w), rot)
    exact = w if rot is None else unrotate(w, rot)
    assert np.abs(weight.dense() - exact).mean() < 0.5 * np.abs(per_row.dense() - exact).mean()


def test_one_group_is_the_per_row_int8_weight():
    """group = K: the same codes, scales and product as Int8Weight (bit for bit)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    q, s = quantize_matrix(w)
    grouped = llm_quant_eval.GroupedInt8Weight.rounded(w, 128)
    np.testing.assert_array_equal(grouped.q, q)
    np.testing.assert_array_equal(grouped.scale[:, 0], s)
    np.testing.assert_array_equal(grouped.matmul(x), Int8Weight(q, s).matmul(x))


def test_groups_that_do_not_divide_k_are_refused():
    with pytest.raises(ValueError, match="whole number of groups"):
        llm_quant_eval.group_quantize(np.ones((2, 100), np.float32), 64)
