"""runtime/kernels/softmax_jit.py: attention's softmax from a GEMM's fp16 output
atoms into the next GEMM's fp16 run-time weights or into atoms of the same layout
(in place too), against a float64 softmax over a sweep of shapes (kernel groups and
32-channel tiles whole and partial, rows padded to 4), and the interpreter's
SoftmaxTranspose and ScaledSoftmax kernels against the same."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import geometry
from rkc.runtime.kernels import run_kernel
from rkc.runtime.kernels import softmax_jit
from rkc.runtime.kernels.softmax_jit import softmax_into_atoms, softmax_into_weights

SHAPES = [(400, 400), (1, 8), (5, 3), (17, 33), (45, 45), (33, 30), (16, 100), (64, 40), (3, 65), (40, 70), (100, 37)]


def _reference(s: np.ndarray, scale: float) -> np.ndarray:
    x = s.astype(np.float64) * scale
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 0.17677669, 3.0])
def test_scores_atoms_into_weights(m, n, scale):
    rng = np.random.default_rng(m * 1000 + n)
    s = (rng.standard_normal((m, n)) * 6).astype(np.float16)
    _, _, rows, _ = geometry.feature_map((m, n), "native-gemm")
    atoms = geometry.pack(s, "native-gemm").reshape(-1, rows, 8).view(np.uint16)
    atoms[-1, :, n % 8 or 8:] = 0x7BFF  # the last atom's lanes past the keys: padding, not scores (65504)
    out = np.full(geometry.nbytes((n, m), "native-weights", 2) // 2, 0x7E00, np.uint16)  # NaN: all overwritten
    softmax_into_weights(atoms, m, n, out, scale)
    got = geometry.unpack(out.view(np.uint8), (n, m), "native-weights", np.float16)
    want = _reference(s, scale).T
    # fp16 rounding (half an ulp: at most 2^-11 of the value) plus float32's exp and sum (< 1e-6),
    # subnormal fp16 weights to their spacing 2^-24
    assert (np.abs(got.astype(np.float64) - want) <= 2.0 ** -11 * want + 1e-6 + 2.0 ** -24).all()
    # padding channels and kernels are zero: the bytes are exactly the pack of the values
    assert np.array_equal(geometry.pack(got, "native-weights").reshape(-1).view(np.uint16), out)


def _within(got: np.ndarray, want: np.ndarray) -> bool:
    """fp16 rounding (half an ulp: at most 2^-11 of the value) plus float32's exp and sum
    (< 1e-6), subnormal fp16 values to their spacing 2^-24."""
    return bool((np.abs(got.astype(np.float64) - want) <= 2.0 ** -11 * want + 1e-6 + 2.0 ** -24).all())


@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 0.17677669])
@pytest.mark.parametrize("in_place", [False, True])
def test_scores_atoms_into_atoms(m, n, scale, in_place):
    rng = np.random.default_rng(m * 1000 + n + 7)
    s = (rng.standard_normal((m, n)) * 6).astype(np.float16)
    _, _, rows, _ = geometry.feature_map((m, n), "native-gemm")
    atoms = geometry.pack(s, "native-gemm").reshape(-1, rows, 8).view(np.uint16)
    atoms[-1, :, n % 8 or 8:] = 0x7BFF  # the last atom's lanes past the keys: padding, not scores (65504)
    atoms[:, m:] = 0x7BFF  # rows past the scores (stored padded to 4)
    out = atoms if in_place else np.full(atoms.shape, 0x7E00, np.uint16)  # NaN: all overwritten
    softmax_into_atoms(atoms, m, n, out, scale)
    got = geometry.unpack(out.reshape(-1).view(np.uint8), (m, n), "native-gemm", np.float16)
    assert _within(got, _reference(s, scale))
    # padding lanes and rows are zero: the bytes are exactly the pack of the values
    assert np.array_equal(geometry.pack(got, "native-gemm").reshape(-1).view(np.uint16), out.reshape(-1))


@pytest.mark.parametrize("m,n", [(400, 400), (45, 45), (33, 30)])
@pytest.mark.parametrize("scale", [0.17677669, -0.5])
def test_row_groups_split_as_the_threads_share_them(m, n, scale):
    """The kernels over row groups [lo, hi) and [hi, end) (two threads' shares: each takes
    its own rows' maxima first) give the bytes of one call over all of them, in place too;
    a negative scale (the largest scaled score is the least score) against the reference."""
    rng = np.random.default_rng(m + n)
    s = (rng.standard_normal((m, n)) * 6).astype(np.float16)
    _, _, rows, _ = geometry.feature_map((m, n), "native-gemm")
    atoms = geometry.pack(s, "native-gemm").reshape(-1, rows, 8).view(np.uint16)
    whole = np.empty_like(atoms)
    softmax_into_atoms(atoms, m, n, whole, scale)
    assert _within(geometry.unpack(whole.reshape(-1).view(np.uint8), (m, n), "native-gemm", np.float16),
                   _reference(s, scale))
    groups, c = -(-rows // 16), np.float32(scale * softmax_jit._LOG2E)
    in_place = atoms.copy()
    for src, out in ((atoms, np.empty_like(atoms)), (in_place, in_place)):
        for lo, hi in ((0, groups // 2), (groups // 2, groups)):
            softmax_jit._groups_into_atoms(src, m, n, c, 16, out, lo, hi)
        assert np.array_equal(out, whole)
    weights = np.empty(geometry.nbytes((n, m), "native-weights", 2) // 2, np.uint16)
    split = np.empty_like(weights)
    softmax_into_weights(atoms, m, n, weights, scale)
    kernels = -(-m // 16)
    cp = -(-n // 8) * 8
    for lo, hi in ((0, kernels // 2), (kernels // 2, kernels)):
        softmax_jit._groups_into_kernels(atoms, m, n, c, 16, split[:kernels * 16 * cp], lo, hi)
    assert np.array_equal(split[:kernels * 16 * cp], weights[:kernels * 16 * cp])


def test_atoms_of_another_shape_are_refused():
    atoms = np.zeros((2, 8, 8), np.uint16)
    with pytest.raises(ValueError, match="do not hold"):
        softmax_into_atoms(atoms, 8, 16, np.zeros((2, 4, 8), np.uint16))
    with pytest.raises(ValueError, match="do not hold"):
        softmax_into_atoms(atoms, 8, 24, np.zeros_like(atoms))  # 24 keys need three atoms


@pytest.mark.parametrize("m,n", [(5, 3), (45, 45)])
def test_interpreter_kernel(m, n):
    s = np.random.default_rng(n).standard_normal((1, 1, m, n)).astype(np.float32) * 4
    (got,) = run_kernel("SoftmaxTranspose", [s], {"scale": 0.5})
    assert got.shape == (1, 1, n, m)
    assert np.abs(got[0, 0].astype(np.float64) - _reference(s[0, 0], 0.5).T).max() <= 1e-6


def test_interpreter_scaled_softmax():
    s = np.random.default_rng(3).standard_normal((1, 1, 9, 20)).astype(np.float32) * 4
    (got,) = run_kernel("ScaledSoftmax", [s], {"scale": 0.5})
    assert got.shape == s.shape
    assert np.abs(got[0, 0].astype(np.float64) - _reference(s[0, 0], 0.5)).max() <= 1e-6
