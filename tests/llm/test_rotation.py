"""The rotation of rotated W8A8 (runtime/kernels/hadamard.py, compiler/llm/rotate.py)
against dense matrices built independently (tests/llm/reference.dense_rotation)."""

from __future__ import annotations

import numpy as np
import pytest

from llm.reference import dense_rotation
from rkc.compiler.llm.rotate import rotate_hessian, rotate_matrix
from rkc.runtime.kernels.hadamard import (KINDS, Rotation, compiled_form, describe, make_rotation, paley_hadamard,
                                         rotate, unrotate)
from rkc.runtime.llm.kernels import KERNELS
from rkc.runtime.llm.weights import Int8Weight, quantize_rows

# Gemma 3 270M (640, 1024, 2048) and other models' widths; 96 = 12 x 8; 7: no Hadamard factor
WIDTHS = [640, 1152, 1536, 2560, 8960, 1024, 96, 7]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", WIDTHS)
def test_fast_rotation_is_the_dense_orthogonal_matrix(k, kind):
    rot = make_rotation(k, kind)
    r = dense_rotation(k, kind)
    np.testing.assert_allclose(r @ r.T, np.eye(k), atol=1e-6)
    x = np.random.default_rng(k).standard_normal((3, k))
    np.testing.assert_allclose(rotate(x, rot), x @ r, atol=1e-6)
    np.testing.assert_allclose(unrotate(rotate(x, rot), rot), x, atol=1e-6)
    x32 = x.astype(np.float32)
    assert rotate(x32, rot).dtype == np.float32
    np.testing.assert_allclose(rotate(x32, rot), x @ r, atol=1e-5)



@pytest.mark.parametrize("k, kind", [(640, "kron"), (640, "block"), (1536, "kron"), (256, "kron")])
def test_compiled_form_is_the_rotation_in_float32(k, kind):
    rot = make_rotation(k, kind, seed=3)
    form = compiled_form(rot, k)
    assert form.signs.dtype == np.float32 and form.signs.flags.c_contiguous and np.array_equal(form.signs, rot.signs)
    assert form.block == rot.block and form.norm == np.float32(1 / np.sqrt(rot.block))
    if rot.factor is None:
        assert form.factor is None and form.factor_t is None
    else:
        assert np.array_equal(form.factor, rot.factor.astype(np.float32))
        assert np.array_equal(form.factor_t, rot.factor.T.astype(np.float32))
    assert compiled_form(rot, k + 1) is None and compiled_form(None, k) is None


@pytest.mark.parametrize("block, factor", [(3, None), (0, None), (7, None), (128, np.eye(4)), (256, None)])
def test_compiled_form_refuses_what_the_compiled_kernels_cannot_apply(block, factor):
    """A direct caller's rotation the compiled kernels cannot apply (a block that is
    not a power of two or does not divide K, a factor of the wrong order) keeps the
    general kernel; a loaded rkbin's is refused before (kernel_attrs._check_rotation)."""
    assert compiled_form(Rotation(np.ones(640, np.float32), block, factor), 640) is None


@pytest.mark.parametrize("m", [1, 2, 12, 20, 36, 140])
def test_paley_hadamard(m):
    h = paley_hadamard(m)
    assert set(np.unique(h)) <= {-1.0, 1.0}
    np.testing.assert_array_equal(h @ h.T, m * np.eye(m))


def test_kron_uses_known_hadamard_factors():
    assert describe(make_rotation(640, "kron")) == "H20 (x) H32"
    assert describe(make_rotation(640, "block")) == "5 x H128"
    assert describe(make_rotation(8960, "kron")) == "H140 (x) H64"
    assert describe(make_rotation(7, "kron")) == "Q7 (x) H1"  # random orthogonal: no Hadamard of order 7


def test_rotation_spreads_an_outlier():
    """Why: one channel 100x the rest costs per-row int8 nearly all its resolution;
    rotated, its energy is spread and the product's error falls by far."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 640)).astype(np.float32)
    x[:, 7] *= 100
    w = rng.standard_normal((64, 640)).astype(np.float32)
    rot = make_rotation(640, "kron")
    exact = x @ w.T
    err = {}
    for name, r in (("plain", None), ("rotated", rot)):
        wr = w if r is None else rotate_matrix(w, r)
        q, s = quantize_rows(wr)
        err[name] = np.linalg.norm(Int8Weight(q, s, r).matmul(x) - exact) / np.linalg.norm(exact)
    assert err["rotated"] < err["plain"] / 5, err


def test_folded_weight_and_hessian_are_exact_in_float():
    rng = np.random.default_rng(1)
    rot = make_rotation(640, "kron")
    x = rng.standard_normal((8, 640))
    w = rng.standard_normal((5, 640)).astype(np.float32)
    np.testing.assert_allclose(rotate(x, rot) @ rotate_matrix(w, rot).T.astype(np.float64), x @ w.T.astype(np.float64),
                               rtol=1e-5, atol=1e-4)
    h = x.T @ x
    xr = rotate(x, rot)
    np.testing.assert_allclose(rotate_hessian(h, rot), xr.T @ xr, atol=1e-8)


def test_quantize_rows_kernel_rotates_by_its_attrs():
    rot = make_rotation(640, "kron")
    x = np.random.default_rng(2).standard_normal((2, 640)).astype(np.float32)
    attrs = {"rotation": "hadamard", "block": rot.block}
    q, s = KERNELS["QuantizeRows"]([x, rot.signs, rot.factor], attrs, None)
    q0, s0 = quantize_rows(rotate(x, rot))
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(s, s0)
    plain, _ = KERNELS["QuantizeRows"]([x], {}, None)
    assert not np.array_equal(plain, q)
