"""LRN on the NPU (compiler/npu/lrn.py) on the simulator against ONNX's formula in float64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from rkc.compiler.npu import api, lrn
from rkc.compiler.npu.dispatch import emit
from rkc.ir.errors import UnsupportedError

sim = pytest.importorskip("rkc.runtime.sim", reason="the NPU simulator (issue 3) is not in this tree yet")
from npu_runner import run  # noqa: E402

# fp16 roundings: the square, the window weight, the factor, the product (2^-11 each),
# and the table's TABLE_ERROR: 5 * 2^-11 relative to the result
RELATIVE = 5 * 2.0 ** -11


def reference_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """ONNX LRN over [C, H, W] in float64."""
    x = x.astype(np.float64)
    c = x.shape[0]
    sq = np.zeros_like(x)
    for ch in range(c):
        sq[ch] = (x[max(0, ch - (size - 1) // 2): min(c - 1, ch + size // 2) + 1] ** 2).sum(axis=0)
    return x / (bias + alpha / size * sq) ** beta


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(3, 40), h=st.integers(4, 12), w=st.integers(6, 20), size=st.sampled_from([1, 3, 5, 6]),
       alpha=st.sampled_from([1e-4, 1e-2, 0.5]), beta=st.sampled_from([0.5, 0.75, 1.0]),
       bias=st.sampled_from([1.0, 2.0]), reach=st.sampled_from([0.01, 0.3, 1.0]), seed=st.integers(0, 999))
def test_lrn_matches_onnx_within_fp16(c, h, w, size, alpha, beta, bias, reach, seed):
    # the window sums of the largest inputs reach about `reach` of the table's default range
    scale = np.sqrt(reach * lrn.power_table(bias, beta).x_max / alpha) / 3.5
    x = (np.random.default_rng(seed).standard_normal((c, h, w)) * scale).astype(np.float16)
    X, Y = api.Feature("x", 0, c, h, w, "fp16"), api.Feature("y", 0, c, h, w, "fp16")
    x_max = float(np.abs(x.astype(np.float64)).max())
    u_max = alpha * x_max ** 2  # alpha / size * size squares at most
    spec = lrn.power_table(bias, beta)
    try:
        r = emit(api.LocalResponseNorm(X, Y, size, alpha, beta, bias, name="lrn", input_max=x_max))
    except UnsupportedError as exc:
        if u_max > spec.x_max:  # past the table: refused, and only then
            assert "past the power's table" in str(exc)
            event("refused: past the table")
            return
        assert "atoms" in str(exc)  # the element-wise path's small-map limits (test_emit_sim.py)
        event("refused: a map too small for the element-wise path")
        return
    assert u_max <= spec.x_max
    got = run([r], sim.SimDevice(), {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = reference_lrn(x, size, alpha, beta, bias)
    assert np.all(np.abs(got - ref) <= RELATIVE * np.abs(ref) + 2.0 ** -24 * 4)


def test_the_table_stays_within_its_bound_and_holds_its_end():
    spec = lrn.power_table(1.0, 0.75)
    assert spec.x_max == 16  # Inception's k = 1, beta = 0.75: 512 steps of 1/32
    assert lrn.table_error(spec, spec.x_max) <= lrn.TABLE_ERROR + 2.0 ** -15
    # past U the last entry holds: the error grows as the power falls ((17 / 33)^0.75 - 1 at u = 32)
    assert abs(lrn.table_error(spec, 32.0) - (1 - (17 / 33) ** 0.75) / (17 / 33) ** 0.75) < 1e-3
    assert lrn.power_table(2.0, 0.75).x_max == 32  # h scales with the bias


def test_lrn_of_int8_maps_or_of_an_unknown_range_is_refused():
    X = api.Feature("x", 0, 8, 4, 4, "int8", api.Quant(0.1, 0))
    with pytest.raises(UnsupportedError, match="fp16"):
        emit(api.LocalResponseNorm(X, X, 5, input_max=12.7))
    X = api.Feature("x", 0, 8, 4, 8, "fp16")
    with pytest.raises(UnsupportedError, match="range is unknown"):
        emit(api.LocalResponseNorm(X, X, 5))
