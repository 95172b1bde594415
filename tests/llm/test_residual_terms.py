"""int8 activations in two terms (--int8-residual): a row quantized as its int8
value plus its int8 residual, run as more rows of the same int8 product and
summed by DequantizeRows (runtime/llm/weights.py)."""

from __future__ import annotations

import numpy as np
import pytest

from llm.reference import quantize_terms
from rkc.runtime.kernels.hadamard import make_rotation
from rkc.runtime.llm import kernel_attrs, kernels
from rkc.runtime.llm.weights import Int8Weight, quantize_rows


def _rows(m: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 3] *= 40  # an outlier channel, as LLM activations have
    return x


@pytest.mark.parametrize("m,k", [(1, 640), (7, 128), (3, 1024)])
def test_two_terms_are_the_reference_terms(m, k):
    """The runtime's two int8 terms sum to what the numpy W8A8 reference defines,
    bit for bit, and leave a residual of at most half the second term's step."""
    x = _rows(m, k)
    q, s = quantize_rows(x, terms=2)
    assert q.shape == (2 * m, k) and s.shape == (2 * m,)
    got = q[:m] * s[:m, None].astype(np.float64) + q[m:] * s[m:, None].astype(np.float64)
    np.testing.assert_array_equal(got, quantize_terms(x, 2))
    q1, s1 = quantize_rows(x)
    np.testing.assert_array_equal(q[:m], q1)  # the first term is the one-term int8
    assert np.all(np.abs(x - got) <= s[m:, None] * 0.5 * (1 + 1e-6))
    one = np.abs(x - q1 * s1[:, None]).max()
    assert np.abs(x - got).max() < one / 50  # ~7 more bits


def test_two_term_product_is_closer_to_float():
    """Through the same int8 weights, two activation terms cut the product's error
    against float activations by far (what is left is the weights' rounding)."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((96, 640)).astype(np.float32)
    rot = make_rotation(640, "kron", 0)
    from rkc.compiler.llm.rotate import rotate_matrix

    q, s = quantize_rows(rotate_matrix(w, rot))
    x = _rows(5, 640)
    one, two = Int8Weight(q, s, rot), Int8Weight(q, s, rot, act_terms=2)
    exact = x.astype(np.float64) @ one.dense().astype(np.float64).T
    e1 = np.linalg.norm(one.matmul(x) - exact)
    e2 = np.linalg.norm(two.matmul(x) - exact)
    assert e2 < e1 / 50


def test_dequantize_rows_sums_the_terms_as_the_emulation():
    x = _rows(4, 256)
    rng = np.random.default_rng(7)
    wq = rng.integers(-127, 128, (32, 256)).astype(np.int8)
    ws = rng.random(32).astype(np.float32)
    bias = rng.standard_normal(32).astype(np.float32)
    xq, xs = kernels.quantize_rows_kernel([x], {"terms": 2}, None)
    acc = xq.astype(np.int32) @ wq.T.astype(np.int32)
    got = kernels.dequantize_rows([acc, xs, ws, bias], {"terms": 2}, None)[0]
    want = Int8Weight(wq, ws, act_terms=2).matmul(x, bias)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (4, 32)
    with pytest.raises(ValueError):  # row scales that are not two per row
        kernels.dequantize_rows([acc, xs[:5], ws], {"terms": 2}, None)


def test_kernel_table_shapes_and_limits():
    assert kernel_attrs.output_shape("QuantizeRows", [(3, 640)], {"terms": 2}) == (6, 640)
    assert kernel_attrs.output_shape("DequantizeRows", [(6, 100), (6,), (100,)], {"terms": 2}) == (3, 100)
    with pytest.raises(ValueError):
        kernel_attrs.output_shape("DequantizeRows", [(5, 100), (5,), (100,)], {"terms": 2})
    assert kernel_attrs.attribute_problem("QuantizeRows", 1, {"terms": 2}) is None
    assert "terms" in kernel_attrs.attribute_problem("QuantizeRows", 1, {"terms": 3})
    assert "terms" in kernel_attrs.attribute_problem("DequantizeRows", 3, {"terms": 0})
