"""The rotation of rotated W8A8 (runtime/kernels/hadamard.py, compiler/llm/rotate.py)
against dense matrices built independently (tests/llm/reference.dense_rotation)."""

from __future__ import annotations

import numpy as np
import pytest

from llm.reference import dense_rotation
from rkc.compiler.llm.rotate import rotate_hessian, rotate_matrix
from rkc.runtime.kernels.hadamard import (FLAT_FACTOR_LIMIT, KINDS, Rotation, compiled_form, describe,
                                         hartley_matrix, hartley_split, make_rotation, paley_hadamard, rotate,
                                         unrotate)
from rkc.runtime.llm.kernels import KERNELS
from rkc.runtime.llm.weights import Int8Weight, quantize_rows

# Gemma 3 270M (640, 1024, 2048) and other models' widths; 96 = 12 x 8; 7: no Hadamard factor;
# 4864 = 19 x 256 (H76 (x) H64 or C19 (x) H256), 448 = 7 x 64, 1344 = 21 x 64: odd parts with and without
# a Paley factor of their own width
WIDTHS = [640, 1152, 1536, 2560, 8960, 4864, 1024, 1344, 448, 96, 7]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", WIDTHS)
def test_fast_rotation_is_the_dense_orthogonal_matrix(k, kind):
    rot = make_rotation(k, kind)
    r = dense_rotation(k, kind)
    rows = np.random.default_rng(k).choice(k, min(k, 256), replace=False)  # R R^T = I on a sample of rows
    np.testing.assert_allclose(r[rows] @ r.T, np.eye(k)[rows], atol=1e-6)
    x = np.random.default_rng(k).standard_normal((3, k))
    np.testing.assert_allclose(rotate(x, rot), x @ r, atol=1e-6)
    np.testing.assert_allclose(unrotate(rotate(x, rot), rot), x, atol=1e-6)
    x32 = x.astype(np.float32)
    assert rotate(x32, rot).dtype == np.float32
    np.testing.assert_allclose(rotate(x32, rot), x @ r, atol=1e-5)



@pytest.mark.parametrize("k", [3, 5, 6, 35, 64, 140, 4864, 18944])
def test_rotation_is_norm_preserving_and_inverted_at_wide_odd_widths(k):
    """Widths too wide for a dense R in a fast test (18944 = 37 x 512, Qwen2.5-7B's
    FFN): every kind keeps each row's norm and the inner products between rows
    (x R (y R)^T = x y^T), and unrotate inverts rotate, in float64."""
    x = np.random.default_rng(k).standard_normal((4, k))
    for kind in KINDS:
        rot = make_rotation(k, kind)
        y = rotate(x, rot)
        np.testing.assert_allclose(y @ y.T, x @ x.T, rtol=1e-6, atol=1e-6 * k)
        np.testing.assert_allclose(unrotate(y, rot), x, atol=1e-6)


# FFN widths with a large odd part: Qwen2.5-1.5B 8960 = 35 x 256, Llama-7B-like 11008 = 43 x 256,
# Gemma 3 1B 6912 = 27 x 256, 5632 = 11 x 512, 2816 = 11 x 256 (TinyLlama's and its half)
FFN_WIDTHS = [8960, 11008, 6912, 5632, 2816]


@pytest.mark.parametrize("kind", ["auto", "hartley", "kron", "block"])
@pytest.mark.parametrize("k", FFN_WIDTHS)
def test_rotation_rows_are_orthonormal_and_spread_an_outlier(k, kind):
    """Rows of R taken through `rotate` itself (e_i R for 64 channels i, float64):
    orthonormal (R R^T = I on the sample, to the float32 factor's rounding), and
    an outlier in channel i lands on no rotated channel with more than R's
    largest entry: 1/sqrt(K) with a Paley factor (flat), sqrt(2/K) with the
    Hartley one (cas is at most sqrt 2), 1/sqrt(block) without a factor; so
    a one-channel row's int8 step is at most sqrt 2 coarser than flat's with
    the Hartley factor, against sqrt(K / block) block-diagonal."""
    rot = make_rotation(k, kind)
    m = k // rot.block
    channels = np.random.default_rng(k).choice(k, 64, replace=False)
    rows = rotate(np.eye(k)[channels], rot)
    np.testing.assert_allclose(rows @ rows.T, np.eye(64), atol=1e-6)
    peak = np.abs(rows).max()
    if rot.factor is None:
        bound = 1 / np.sqrt(rot.block)
    elif paley_hadamard(m) is not None:
        bound = 1 / np.sqrt(k)
        np.testing.assert_allclose(np.abs(rows), bound, rtol=1e-6)  # every entry flat
    elif describe(rot).startswith("C"):
        bound = np.sqrt(2 / k)
    else:  # kron without a known Hadamard order: a seeded random orthogonal factor, no bound to state
        bound = 1.0
    assert peak <= bound * (1 + 1e-6), (describe(rot), peak, bound)
    if kind in ("auto", "hartley"):  # never the block-diagonal spread where a factor exists
        assert rot.factor is not None and peak <= np.sqrt(2 / k) * (1 + 1e-6)


@pytest.mark.parametrize("m", [1, 3, 5, 7, 9, 19, 35, 37, 141])
def test_hartley_matrix_is_orthogonal_symmetric_and_spread(m):
    c = hartley_matrix(m)
    np.testing.assert_allclose(c @ c.T, np.eye(m), atol=1e-12)
    np.testing.assert_allclose(c, c.T, atol=0)
    assert np.abs(c).max() <= np.sqrt(2 / m) + 1e-12  # cas is at most sqrt 2
    # against the definition term by term (float64)
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    np.testing.assert_allclose(c, (np.cos(2 * np.pi * i * j / m) + np.sin(2 * np.pi * i * j / m)) / np.sqrt(m),
                               atol=1e-12)


@pytest.mark.parametrize("m, split", [(35, (5, 7)), (15, (3, 5)), (45, (5, 9)), (63, (7, 9)), (12, (3, 4)),
                                      (13, None), (27, None), (37, None), (4, None)])
def test_hartley_split_is_the_hartley_matrix(m, split):
    """The prime-factor form (coprime m1 m2 only: a prime or a prime power has none) applied by its
    definition in float64 is H_m x to rounding."""
    got = hartley_split(m)
    if split is None:
        assert got is None
        return
    m1, m2, pin, pout = got
    assert (m1, m2) == split and sorted(pin.ravel()) == sorted(pout.ravel()) == list(range(m))
    x = np.random.default_rng(m).standard_normal((m, 5))
    t = hartley_matrix(m1) @ x[pin].reshape(m1, -1)  # along n1
    t = np.einsum("dc,acj->adj", hartley_matrix(m2), t.reshape(m1, m2, -1))  # along n2
    r1, r2 = (-np.arange(m1)) % m1, (-np.arange(m2)) % m2
    y = np.empty_like(x)
    y[pout.ravel()] = (0.5 * (t + t[r1] + t[:, r2] - t[r1][:, r2])).reshape(m, -1)
    np.testing.assert_allclose(y, hartley_matrix(m) @ x, atol=1e-12)


@pytest.mark.parametrize("k, want", [(640, "H20 (x) H32"), (1536, "H12 (x) H128"), (3584, "H28 (x) H128"),
                                     (1152, "H36 (x) H32"), (8960, "C35 (x) H256"), (4864, "C19 (x) H256"),
                                     (6912, "C27 (x) H256"), (18944, "C37 (x) H512"), (7, "C7 (x) H1"), (1344, "C21 (x) H64"),
                                     (2048, "H2048")])
def test_auto_keeps_narrow_paley_factors_and_takes_hartley_past_them(k, want):
    """auto (the compiler's default): the flat Paley factor while it is at most
    FLAT_FACTOR_LIMIT wide, else the Hartley factor of K's odd part."""
    rot = make_rotation(k, "auto")
    assert describe(rot) == want
    flat = make_rotation(k, "kron")
    if rot.factor is not None and describe(rot)[0] == "H":
        assert rot.factor.shape[0] <= FLAT_FACTOR_LIMIT and np.array_equal(rot.factor, flat.factor)
    if describe(rot)[0] == "C":
        assert rot.block == k & -k and np.array_equal(rot.factor, make_rotation(k, "hartley").factor)
        # the multiply-adds a value the block-mixing factor costs: the odd part, not the wider Paley order
        assert rot.factor.shape[0] < flat.factor.shape[0] or describe(flat)[0] == "Q"
    assert np.array_equal(rot.signs, flat.signs)  # the seeded signs do not depend on the kind


@pytest.mark.parametrize("k, kind", [(640, "kron"), (640, "block"), (1536, "kron"), (256, "kron"),
                                     (8960, "auto"), (640, "hartley")])
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
    assert describe(make_rotation(8960, "hartley")) == "C35 (x) H256"
    assert describe(make_rotation(640, "hartley")) == "C5 (x) H128"


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


@pytest.mark.parametrize("k", [640, 1536, 4864, 8960])
def test_an_int4_builds_auto_rotation_is_the_flat_one(k):
    """int4 weights (groups along K) keep the flat R at every width; int8's auto
    takes the Hartley factor past FLAT_FACTOR_LIMIT; an explicit kind is kept."""
    from rkc.compiler.llm.rotate import rotation_for

    assert describe(rotation_for(k, "auto", "int4")) == describe(make_rotation(k, "kron"))
    assert describe(rotation_for(k, "auto", "int8")) == describe(make_rotation(k, "auto"))
    assert describe(rotation_for(k, "hartley", "int4")) == describe(make_rotation(k, "hartley"))
    assert rotation_for(k, "none", "int4") is None
