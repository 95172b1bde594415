"""The compiled int4 edges the plans run (runtime/llm/int4_jit.py: quantize_nibbles_into_atoms,
combine_int4_atoms), straight from and into the NPU's atoms, over shape sweeps:
against a float64 reference within stated float32 tolerances, and against the
numpy kernels (runtime/llm/int4_rows.py) they stand in for."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import layout
from rkc.runtime.kernels.hadamard import Rotation
from rkc.runtime.llm import int4_jit, int4_rows

EPS32 = float(np.finfo(np.float32).eps)


def to_atoms(a: np.ndarray, c2: int, stored: int) -> np.ndarray:
    """Rows [R, C] as a GEMM operand's atoms [C1, stored rows, C2] (channels past C zero)."""
    r, c = a.shape
    c1 = -(-c // c2)
    padded = np.zeros((r, c1 * c2), a.dtype)
    padded[:, :c] = a
    out = np.zeros((c1, stored, c2), a.dtype)
    out[:, :r] = padded.reshape(r, c1, c2).transpose(1, 0, 2)
    return out


def from_atoms(atoms: np.ndarray, rows: int, cols: int) -> np.ndarray:
    c1, _, c2 = atoms.shape
    return atoms[:, :rows].transpose(1, 0, 2).reshape(rows, c1 * c2)[:, :cols]


@pytest.mark.parametrize("m,k", [(1, 32), (1, 640), (2, 1152), (5, 96), (17, 1024), (33, 64)])
def test_nibble_rows_written_into_atoms(m, k):
    """Codes within half a step of x / scale in float64 (plus the float32
    division's rounding), the scale max|x| / 119 within one float32 rounding,
    hi/lo nibbles in [-8, 7] with 16 hi + lo the code; the same bytes as the
    numpy kernel; pad rows zeroed whatever they held; rows shared out in ranges."""
    rng = np.random.default_rng(m * 7919 + k)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 50, (m, 1))).astype(np.float32)
    if m > 1:
        x[1] = 0  # a zero row: scale 1, codes 0
    stored = 2 * m + 3
    atoms = np.full((k // 32, stored, 16), 0x5A, np.uint8)
    scale = np.empty(m, np.float32)
    cut = m // 2
    for lo, hi in ((0, cut), (cut, m)):  # two ranges, as over_ranges hands them to threads
        int4_jit.quantize_nibbles_into_atoms(x, atoms, scale, int4_rows.ACT_LIMIT, lo, hi, 0)
    amax = np.abs(x.astype(np.float64)).max(axis=1)
    want_scale = np.where(amax > 0, amax / 119, 1.0)
    np.testing.assert_allclose(scale, want_scale, rtol=EPS32, atol=0)
    nibbles = layout.unpack_nibbles(from_atoms(atoms, 2 * m, k // 2)).astype(np.int64)
    assert nibbles.min() >= -8 and nibbles.max() <= 7
    codes = 16 * nibbles[0::2] + nibbles[1::2]
    exact = x.astype(np.float64) / scale[:, None].astype(np.float64)
    assert np.abs(codes).max() <= 119
    assert (np.abs(codes - exact) <= 0.5 + 4 * EPS32 * np.abs(exact)).all()
    assert not atoms[:, 2 * m:].any()
    rows, s = int4_rows.npu_rows(x)
    np.testing.assert_array_equal(from_atoms(atoms, 2 * m, k // 2).view(np.int8), int4_rows.packed_rows(rows))
    np.testing.assert_array_equal(scale, s)


@pytest.mark.parametrize("m,n,groups", [(1, 640, 1), (1, 100, 3), (2, 1000, 2), (7, 64, 5), (17, 136, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_partials_combined_from_atoms(m, n, groups, bias):
    """y = row scale x sum_g scale[g] (16 P_hi + P_lo) (+ bias) from int16
    partials in their atoms (padding channels past N in each group): within
    (G + 3) float32 roundings of the float64 value, relative to the sum of
    the terms' magnitudes; the numpy kernel's bits."""
    rng = np.random.default_rng(m * 31 + n * 7 + groups)
    n_pad = -(-n // 64) * 64
    p = rng.integers(-2 ** 15, 2 ** 15, (2 * m, groups * n_pad)).astype(np.int16)
    rs = rng.uniform(1e-3, 1, m).astype(np.float32)
    sw = rng.uniform(1e-4, 1e-2, (groups, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    out = np.full((m, n), np.nan, np.float32)
    atoms = to_atoms(p, 8, 2 * m + 1)
    for lo, hi in ((0, m // 2), (m // 2, m)):
        int4_jit.combine_int4_atoms(atoms, n, n_pad, sw, rs, b if bias else sw[0], bias, out, lo, hi, False)
    part = p.astype(np.float64).reshape(2 * m, groups, n_pad)[:, :, :n]
    merged = 16 * part[0::2] + part[1::2]  # [M, G, N]
    terms = merged * sw.astype(np.float64)[None] * rs.astype(np.float64)[:, None, None]
    want = terms.sum(axis=1) + (b.astype(np.float64) if bias else 0)
    size = np.abs(terms).sum(axis=1) + (np.abs(b.astype(np.float64)) if bias else 0)
    assert (np.abs(out - want) <= (groups + 3) * EPS32 * size).all()
    np.testing.assert_array_equal(out, int4_rows.combine(p, rs, sw, b))


@pytest.mark.parametrize("m,k,group", [(1, 64, 32), (1, 640, 256), (1, 1536, 768), (1, 1504 * 6, 1504),
                                         (1, 12288, 1376), (3, 96, 64), (5, 1536, 768)])
def test_paired_nibble_rows_written_into_atoms(m, k, group):
    """Nibble rows with two K groups per segment (int4_rows.pair_rows): token t's
    group g hi/lo rows at 4t + 2 (g % 2) (+1) and zeros in the other two
    whatever the atoms held, pad rows past 4M zeroed; the codes and scales are
    the unpaired kernel's."""
    rng = np.random.default_rng(k + group + m)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    atoms = np.full((k // 32, 4 * m + 2, 16), 0x5A, np.uint8)
    scale = np.empty(m, np.float32)
    for lo, hi in ((0, m // 2), (m // 2, m)):
        int4_jit.quantize_nibbles_into_atoms(x, atoms, scale, int4_rows.ACT_LIMIT, lo, hi, group)
    rows, s = int4_rows.npu_rows(x)
    want = int4_rows.packed_rows(int4_rows.pair_rows(rows, group))
    np.testing.assert_array_equal(from_atoms(atoms, 4 * m, k // 2).view(np.int8), want)
    np.testing.assert_array_equal(scale, s)
    assert not atoms[:, 4 * m:].any()
    nib = layout.unpack_nibbles(want)
    for t in range(m):
        for g, k0 in enumerate(range(0, k, group)):  # each group in its own pair of rows, zeros in the other
            r = 4 * t + 2 * (g % 2)
            np.testing.assert_array_equal(nib[r:r + 2, k0:k0 + group], rows[2 * t:2 * t + 2, k0:k0 + group])
            z = 4 * t + 2 - 2 * (g % 2)
            assert not nib[z:z + 2, k0:k0 + group].any()


@pytest.mark.parametrize("n,groups", [(640, 2), (100, 3), (1536, 9), (64, 5), (136, 6)])
@pytest.mark.parametrize("bias", [False, True])
def test_paired_int4_partials_combined_from_atoms(n, groups, bias):
    """One token's partials with two K groups per block of 4 rows: the same bits
    as the unpaired layout's combine of the same partials (jit and numpy alike)."""
    rng = np.random.default_rng(n * 7 + groups)
    n_pad = -(-n // 64) * 64
    blocks = -(-groups // 2)
    p = rng.integers(-2 ** 15, 2 ** 15, (4, blocks * n_pad)).astype(np.int16)
    if groups % 2:  # the last block's second pair of rows is no group's
        p[2:, (blocks - 1) * n_pad:] = rng.integers(-2 ** 15, 2 ** 15, (2, n_pad))
    rs = rng.uniform(1e-3, 1, 1).astype(np.float32)
    sw = rng.uniform(1e-4, 1e-2, (groups, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    unpaired = int4_rows.unpair_partials(p, groups)  # [2, G, Np]
    for g in range(groups):
        r, blk = 2 * (g % 2), g // 2
        np.testing.assert_array_equal(unpaired[:, g], p[r:r + 2, blk * n_pad:(blk + 1) * n_pad])
    want = int4_rows.combine(unpaired.reshape(2, groups * n_pad), rs, sw, b)
    np.testing.assert_array_equal(int4_rows.combine(p, rs, sw, b, paired=True), want)
    out = np.full((1, n), np.nan, np.float32)
    int4_jit.combine_int4_atoms(to_atoms(p, 8, 5), n, n_pad, sw, rs, b if bias else sw[0], bias, out, 0, 1, True)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("m,k,block", [(16, 640, 128), (37, 1024, 1024), (20, 96, 32)])
def test_rotated_nibble_rows_by_tiles(m, k, block):
    """Rotation (signs, blockwise Walsh-Hadamard) and nibble rows in one pass by
    tiles of rows: codes within half a step of the float64 rotation over the
    scale (plus float32 rounding of the rotation: log2(block) additions); the
    numpy kernel's bytes and scales; tiles shared out in ranges."""
    rng = np.random.default_rng(m + k)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 20, (m, 1))).astype(np.float32)
    signs = rng.choice([-1.0, 1.0], k).astype(np.float32)
    atoms = np.full((k // 32, 2 * m + 2, 16), 0xA5, np.uint8)
    scale = np.empty(m, np.float32)
    tiles = -(-m // 16)
    for lo, hi in ((0, tiles // 2), (tiles // 2, tiles)):
        int4_jit.rotate_nibbles_into_atoms(x, signs, block, np.float32(1 / np.sqrt(block)), atoms, scale,
                                      int4_rows.ACT_LIMIT, lo, hi)
    h = np.array([[1.0]])
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    rotated = ((x.astype(np.float64) * signs).reshape(m, k // block, block) @ h / np.sqrt(block)).reshape(m, k)
    nibbles = layout.unpack_nibbles(from_atoms(atoms, 2 * m, k // 2)).astype(np.int64)
    codes = 16 * nibbles[0::2] + nibbles[1::2]
    bound = np.abs(x).max(axis=1, keepdims=True) * np.sqrt(block) * np.log2(2 * block) * 2 * EPS32
    slack = (bound + 2 * EPS32 * np.abs(rotated)) / scale[:, None]
    assert (np.abs(codes - rotated / scale[:, None]) <= 0.5 + slack).all()
    assert not atoms[:, 2 * m:].any()
    rows, s = int4_rows.npu_rows(x, Rotation(signs, block, None))
    np.testing.assert_array_equal(from_atoms(atoms, 2 * m, k // 2).view(np.int8), int4_rows.packed_rows(rows))
    np.testing.assert_array_equal(scale, s)
