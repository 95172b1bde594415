"""Prefill's int4 stretches (runtime/llm/int4_prefill.py: residual and gated FFN
with int4 edges, float32, tiles shared among threads) against a float64
reference of the same stretch: the in edge combined from int16 K-group partials
in their atoms (1 to 3 groups, with and without a bias, the output width
padded per group), the body, the out edge rotated (with and without a
block-mixing factor) and quantized to codes in [-119, 119] as two nibble rows
per row; row counts that fill tiles, leave a partial one, and give the threads
unequal shares. Tolerances (float32 arithmetic):
  - values before the out edge: within 2e-5 relative to the row's largest
    |value| (the group sums' float32 roundings, relative to the sum of the
    terms' magnitudes, then the norms' and the activation's few ulps);
  - scales within 1e-5 relative (the rotation's float32 sums); codes within 1
    of the reference's (a value at a rounding tie may round either way), at
    most 0.5 % of them off; every nibble in [-8, 7]; the pad rows zeroed."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import layout
from rkc.runtime.kernels.hadamard import compiled_form, make_rotation, rotate
from rkc.runtime.llm import int4_prefill as k4
from rkc.runtime.llm.int4_rows import ACT_LIMIT
from rkc.runtime.llm.prefill_kernels import ACT_GELU_TANH, ACT_SILU
from rkc.runtime.llm.prefill_kernels import LANES
from rkc.runtime.llm.threads import over_ranges

F32 = np.float32
NONE = np.zeros((0, 0), F32)
GELU_C, GELU_K = np.sqrt(2.0 / np.pi), 0.044715
EPS = 1e-6


def to_atoms(a: np.ndarray, c2: int, stored: int, fill: int) -> np.ndarray:
    """Rows [R, C] as a GEMM operand's atoms [C1, stored rows, C2]; rows past R hold `fill` (stale bytes)."""
    r, c = a.shape
    out = np.full((-(-c // c2), stored, c2), fill, a.dtype)
    padded = np.zeros((r, out.shape[0] * c2), a.dtype)
    padded[:, :c] = a
    out[:, :r] = padded.reshape(r, -1, c2).transpose(1, 0, 2)
    return out


def from_atoms(atoms: np.ndarray, rows: int, cols: int) -> np.ndarray:
    c1, _, c2 = atoms.shape
    return atoms[:, :rows].transpose(1, 0, 2).reshape(rows, c1 * c2)[:, :cols]


def _int4_in(rng, rows: int, n: int, groups: int, bias: bool):
    """(partials' int16 atoms, n_pad, group scales, row scales, bias, the float64 value)."""
    n_pad = -(-n // 64) * 64
    p = rng.integers(-2 ** 15, 2 ** 15, (2 * rows, groups * n_pad)).astype(np.int16)
    rs = rng.uniform(1e-3, 1e-2, rows).astype(F32)
    sw = rng.uniform(1e-4, 1e-3, (groups, n)).astype(F32)
    b = rng.standard_normal(n).astype(F32)
    part = p.astype(np.float64).reshape(2 * rows, groups, n_pad)[:, :, :n]
    merged = 16 * part[0::2] + part[1::2]
    x = (merged * sw.astype(np.float64)[None]).sum(axis=1) * rs.astype(np.float64)[:, None]
    return to_atoms(p, 8, 2 * rows + 2, 7), n_pad, sw, rs, b if bias else np.zeros(0, F32), x + (b if bias else 0)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w.astype(np.float64)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert np.all(np.abs(got - want) <= 2e-5 * np.abs(want).max(axis=1, keepdims=True))


def _out_edge(rows: int, k: int, kind: str):
    """(rotation, its compiled form, nibble atoms holding stale bytes, scales, rotated-by-blocks buffer)."""
    rot = make_rotation(k, kind)
    form = compiled_form(rot, k)
    q = np.full((k // 32, 2 * rows + 3, 16), 0x5A, np.uint8)
    rotated = np.full((k // form.block, rows * form.block), np.nan, F32) if form.factor is not None else NONE
    return rot, form, q, np.full(rows, np.nan, F32), rotated


def _check_nibbles(want: np.ndarray, rot, form, q, scale, rotated, rows: int, k: int) -> None:
    if form.factor is not None:  # the caller's factor product (fused_rows), then the nibble rows
        mixed = form.factor @ rotated
        over_ranges(lambda lo, hi: k4.quantize_nibble_blocks_into_atoms(mixed, form.block, q, scale, ACT_LIMIT,
                                                                         lo, hi), rows)
    y = rotate(want, rot)  # float64: the rotation's own reference
    want_scale = np.abs(y).max(axis=1) / ACT_LIMIT
    np.testing.assert_allclose(scale, want_scale, rtol=1e-5)
    nibbles = layout.unpack_nibbles(from_atoms(q, 2 * rows, k // 2)).astype(np.int64)
    assert nibbles.min() >= -8 and nibbles.max() <= 7
    codes = 16 * nibbles[0::2] + nibbles[1::2]
    off = np.abs(codes - np.clip(np.rint(y / want_scale[:, None]), -ACT_LIMIT, ACT_LIMIT))
    assert off.max() <= 1 and (off > 0).mean() <= 0.005
    assert not q[:, 2 * rows:].any()  # pad rows zeroed


@pytest.mark.parametrize("rows", [16, 37])
@pytest.mark.parametrize("k,kind", [(640, "kron"), (1024, "block"), (1536, "kron")])
@pytest.mark.parametrize("groups,bias", [(1, False), (2, True), (3, False)])
@pytest.mark.parametrize("first_norm", [True, False])
@pytest.mark.parametrize("body_scale,last_norm", [(None, True), (0.37, True), (None, False)])  # Gemma 4's bodies
def test_int4_residual_tiles_match_a_float64_reference(rows, k, kind, groups, bias, first_norm, body_scale,
                                                       last_norm):
    rng = np.random.default_rng(rows * k + groups)
    p, n_pad, sw, rs, b, x = _int4_in(rng, rows, k, groups, bias)
    res = (rng.standard_normal((rows, k)) * 2).astype(F32)
    w1, w2 = (rng.uniform(0.5, 1.5, k).astype(F32) for _ in range(2))
    n1 = _rms(x, w1, EPS) if first_norm else x
    total = (n1 + res) * (body_scale or 1.0)
    n2 = _rms(total, w2, EPS) if last_norm else total
    rot, form, q, scale, rotated = _out_edge(rows, k, kind)
    kept = [np.full((rows, k), np.nan, F32, order="F") for _ in range(4)]
    args = (p, n_pad, sw, rs, b, bias, first_norm, w1, F32(EPS), res, F32(body_scale or 1.0), body_scale is not None,
            last_norm, w2, F32(EPS), True, first_norm, True, last_norm,
            kept[0], kept[1] if first_norm else NONE, kept[2], kept[3] if last_norm else NONE, form.signs,
            form.block, form.norm, q, scale, ACT_LIMIT, rotated, form.factor is not None)
    over_ranges(lambda lo, hi: k4.residual_tiles(*args, lo, hi), -(-rows // LANES))
    for got, want in zip(kept, (x, n1, total, n2)):
        if (got is kept[1] and not first_norm) or (got is kept[3] and not last_norm):
            continue
        _close(got, want)
    _check_nibbles(n2, rot, form, q, scale, rotated, rows, k)


def _act(g: np.ndarray, act: int) -> np.ndarray:
    if act == ACT_SILU:
        return g / (1.0 + np.exp(-g))
    return 0.5 * g * (1.0 + np.tanh(GELU_C * (g + GELU_K * g ** 3)))


@pytest.mark.parametrize("rows", [16, 80])
@pytest.mark.parametrize("k,kind", [(640, "kron"), (2048, "block")])
@pytest.mark.parametrize("groups,bias", [(1, False), (6, True)])
@pytest.mark.parametrize("act", [ACT_SILU, ACT_GELU_TANH])
def test_int4_ffn_tiles_match_a_float64_reference(rows, k, kind, groups, bias, act):
    rng = np.random.default_rng(rows * k + act + groups)
    gp, g_pad, g_sw, g_rs, g_b, g = _int4_in(rng, rows, k, groups, bias)
    up, u_pad, u_sw, u_rs, u_b, u = _int4_in(rng, rows, k, groups, bias)
    want = _act(g, act) * u
    rot, form, q, scale, rotated = _out_edge(rows, k, kind)
    args = (gp, g_pad, g_sw, g_rs, g_b, bias, up, u_pad, u_sw, u_rs, u_b, bias, act, rows, k,
            form.signs, form.block, form.norm, q, scale, ACT_LIMIT, rotated, form.factor is not None)
    over_ranges(lambda lo, hi: k4.ffn_tiles(*args, lo, hi), -(-rows // LANES))
    if form.factor is not None:  # the rotated rows by blocks before F mixes them
        before = rotate(want, type(rot)(rot.signs, rot.block))
        got = rotated.reshape(k // form.block, rows, form.block).transpose(1, 0, 2).reshape(rows, k)
        _close(got, before)
    _check_nibbles(want, rot, form, q, scale, rotated, rows, k)


@pytest.mark.parametrize("rows", [16, 37, 80])
@pytest.mark.parametrize("n,groups,bias", [(256, 1, False), (1024, 2, True), (200, 3, False), (100, 2, True)])
def test_int4_combine_tiles_match_a_float64_reference(rows, n, groups, bias):
    """An int4 in edge on its own (attention's q, k, v) into column-major rows; n = 100 ends in half an atom
    (the channels past the whole atoms, combined one by one)."""
    rng = np.random.default_rng(rows + n + groups)
    p, n_pad, sw, rs, b, want = _int4_in(rng, rows, n, groups, bias)
    out = np.full((rows, n), np.nan, F32, order="F")
    over_ranges(lambda lo, hi: k4.combine_tiles(p, n_pad, sw, rs, b, bias, out.T, lo, hi), -(-rows // LANES))
    _close(out, want)
