"""W4A8 by nibble rows (compiler/llm/int4.py): the split is exact, the CPU combine
is the float64 product of the quantized operands, and the simulator's int4 GEMM
feeds it the same partials numpy computes."""

import numpy as np
import pytest

from rkc.compiler.llm import int4
from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.runtime import sim
from npu_runner import run


def test_every_int8_activation_splits_into_two_int4_nibbles():
    a = np.arange(-int4.ACT_LIMIT, int4.ACT_LIMIT + 1, dtype=np.int8)[None, :]
    rows = int4.split_nibbles(a)
    assert rows.min() >= -8 and rows.max() <= 7
    np.testing.assert_array_equal(16 * rows[0].astype(int) + rows[1], a[0])


@pytest.mark.parametrize("m,k,n,group", [(1, 640, 256, 256), (5, 1152, 192, 128), (3, 96, 64, 32)])
def test_combine_is_the_product_of_the_quantized_operands(m, k, n, group):
    rng = np.random.default_rng(m * 1000 + k)
    x = rng.standard_normal((m, k)).astype(np.float32) * 3
    w = int4.quantize_weight(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k), group)
    q, s = int4.quantize_activations(x)
    want = (q.astype(np.float64) * s[:, None]) @ w.dequantized().astype(np.float64).T
    # float32 sums over the K groups: within a few float32 roundings of the float64 product
    np.testing.assert_allclose(int4.emulate(x, w), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_weight_groups_search_the_clip_and_stay_close():
    rng = np.random.default_rng(3)
    wf = rng.standard_normal((128, 512)).astype(np.float32)
    w = int4.quantize_weight(wf, 256)
    assert w.data.min() >= -8 and w.data.max() <= 7 and w.scales.shape == (2, 128)
    err = ((w.dequantized() - wf) ** 2).sum()
    plain = np.abs(wf.reshape(128, 2, 256)).max(axis=2, keepdims=True) / 8
    plain_err = ((np.clip(np.rint(wf.reshape(128, 2, 256) / plain), -8, 7) * plain - wf.reshape(128, 2, 256)) ** 2).sum()
    assert err <= plain_err
    assert err / (wf ** 2).sum() < 0.012  # 4-bit Gaussian RTN: ~1 % relative squared error


@pytest.mark.parametrize("m,k,n", [(1, 640, 256), (6, 1000, 130)])
def test_the_simulated_npu_partials_give_the_emulated_product(m, k, n):
    rng = np.random.default_rng(k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = int4.quantize_weight(rng.standard_normal((n, k)).astype(np.float32), 256)
    rows, s = int4.npu_rows(x)
    r2 = rows.shape[0]
    a = api.Feature.gemm("A", 0, r2, k, "int4")
    probe = api.GemmInt4(a, w.data.T.copy(), None, r2, w.group, "w4")
    c = api.Feature.gemm("C", 0, r2, probe.segments * probe.n_padded, "int16")
    result = emit(api.GemmInt4(a, probe.b, c, r2, w.group, "w4"))
    apad = np.zeros((api.gemm_rows(r2), k), np.int8)
    apad[:r2] = rows
    out = run([result], sim.SimDevice(), {"A": (a, apad.T[:, :, None])}).feature(c)[:, :r2, 0].T
    partials = out.reshape(r2, probe.segments, probe.n_padded)[:, :, :n]
    np.testing.assert_array_equal(int4.combine(partials, s, w.scales), int4.emulate(x, w))


@pytest.mark.parametrize("n,k,group", [(40, 640, 640), (23, 1000, 256), (9, 96, 32), (5, 3584, 1216)])
def test_each_group_takes_the_clip_ratio_of_least_error(n, k, group):
    """The compiled clip search against the definition in float64: per row and
    K group, the scale amax * ratio / 8 (ratio of CLIP_RATIOS) of least squared
    rounding error, up to float32 rounding of the errors; values rounded to
    nearest with it. Rows of very different magnitudes, one all zero."""
    rng = np.random.default_rng(n * k)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 5.0, (n, 1))).astype(np.float32)
    w[0] = 0.0
    got = int4.quantize_weight(w, group)
    for r in range(n):
        for g, k0 in enumerate(range(0, k, group)):
            x = w[r, k0:k0 + group].astype(np.float64)
            amax = np.abs(x).max()
            if amax == 0:
                assert got.scales[g, r] == 1.0 and not got.data[r, k0:k0 + group].any()
                continue
            cands = np.float32(amax) * np.asarray(int4.CLIP_RATIOS, np.float32) / np.float32(8)
            errs = [((np.clip(np.rint(x / s), -8, 7) * s - x) ** 2).sum() for s in cands.astype(np.float64)]
            s = float(got.scales[g, r])
            assert s in cands.tolist()
            err = ((np.clip(np.rint(x / s), -8, 7) * s - x) ** 2).sum()
            assert err <= min(errs) * (1 + 1e-6)
            want = np.clip(np.rint(w[r, k0:k0 + group] / np.float32(s)), -8, 7)
            np.testing.assert_array_equal(got.data[r, k0:k0 + group], want)
