"""The host's float32 exp (runtime/llm/prefill_kernels.exp_parts), inlined into
the softmax loops, within its stated relative error of float64's exp, with and
without fused multiply-adds (the prefill softmax compiles it with contraction,
decode attention too); exp_f32 (the same value in one expression, the FFN
activation's form) bit for bit exp_parts' product."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from rkc.runtime.llm.prefill_kernels import exp_f32, exp_parts


def _exps(fastmath):
    @njit(fastmath=fastmath)
    def run(t, out, bits):
        scaled = bits.view(np.float32)
        for j in range(t.shape[0]):
            out[j], bits[j] = exp_parts(t[j])
        for j in range(t.shape[0]):
            out[j] = out[j] * scaled[j]
    return run


@njit
def _exps_in_one_pass(t, out):
    for j in range(t.shape[0]):
        out[j] = exp_f32(t[j])


def _arguments() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate([np.linspace(-87, 88, 200_003), rng.uniform(-87, 88, 100_000),
                           rng.standard_normal(10_000) * 1e-3]).astype(np.float32)


@pytest.mark.parametrize("fastmath", [False, {"contract"}, {"reassoc", "contract", "nsz", "arcp"}])
def test_exp_within_3e_7(fastmath):
    t = _arguments()
    out, bits = np.empty_like(t), np.empty(t.size, np.int32)
    _exps(fastmath)(t, out, bits)
    exact = np.exp(t.astype(np.float64))
    assert np.abs(out / exact - 1).max() < 3e-7
    edges = np.array([-np.inf, -1e4, -87.5, 88.5, 1e4], np.float32)  # clamped to [-87, 88]
    out, bits = np.empty_like(edges), np.empty(edges.size, np.int32)
    _exps(fastmath)(edges, out, bits)
    np.testing.assert_allclose(out, np.exp(np.float64([-87, -87, -87, 88, 88])), rtol=3e-7)


def test_exp_f32_is_exp_parts_product():
    t = np.concatenate([_arguments(), np.array([-np.inf, -1e4, -87.5, 88.5, 1e4, 0.0, -0.0], np.float32)])
    one, two, bits = np.empty_like(t), np.empty_like(t), np.empty(t.size, np.int32)
    _exps_in_one_pass(t, one)
    _exps(False)(t, two, bits)
    assert np.array_equal(one.view(np.int32), two.view(np.int32))
    finite = slice(0, t.size - 7)
    assert np.abs(one[finite] / np.exp(t[finite].astype(np.float64)) - 1).max() < 3e-7
