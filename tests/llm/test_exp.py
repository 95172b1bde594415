"""The host's float32 exp (runtime/llm/prefill_kernels.exp_parts), inlined into
the softmax loops, within its stated relative error of float64's exp, with and
without fused multiply-adds (the prefill softmax compiles it with contraction,
decode attention too)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from rkc.runtime.llm.prefill_kernels import exp_parts


def _exps(fastmath):
    @njit(fastmath=fastmath)
    def run(t, out, bits):
        scaled = bits.view(np.float32)
        for j in range(t.shape[0]):
            out[j], bits[j] = exp_parts(t[j])
        for j in range(t.shape[0]):
            out[j] = out[j] * scaled[j]
    return run


@pytest.mark.parametrize("fastmath", [False, {"contract"}, {"reassoc", "contract", "nsz", "arcp"}])
def test_exp_within_3e_7(fastmath):
    rng = np.random.default_rng(7)
    t = np.concatenate([np.linspace(-87, 88, 200_003), rng.uniform(-87, 88, 100_000),
                        rng.standard_normal(10_000) * 1e-3]).astype(np.float32)
    out, bits = np.empty_like(t), np.empty(t.size, np.int32)
    _exps(fastmath)(t, out, bits)
    exact = np.exp(t.astype(np.float64))
    assert np.abs(out / exact - 1).max() < 3e-7
    edges = np.array([-np.inf, -1e4, -87.5, 88.5, 1e4], np.float32)  # clamped to [-87, 88]
    out, bits = np.empty_like(edges), np.empty(edges.size, np.int32)
    _exps(fastmath)(edges, out, bits)
    np.testing.assert_allclose(out, np.exp(np.float64([-87, -87, -87, 88, 88])), rtol=3e-7)
