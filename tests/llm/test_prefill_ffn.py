"""The many-row gated FFN stretch (runtime/llm/prefill_fused.ffn_tiles, float32,
threaded over tiles) against a float64 reference of the same stretch: gate and
up from fp16 or int32 atoms (dequantized by row and channel scales, with and
without a bias), SiLU or GELU (tanh form), their product, into fp16 atoms or
rotated and quantized to int8 (with and without a block-mixing factor); row
counts that fill tiles, leave a partial one, and give the threads unequal
shares. Tolerances (float32 arithmetic, not numpy's order):
  - values before the out edge: within 4e-6 relative to the row's largest |value|
    (a few float32 ulps of the dequantization, exp and products);
  - fp16 out edge: each half the reference's rounding or a neighbour of it (or, for a subnormal half,
    within the float32 tolerance above);
  - int8 out edge: scales within 1e-5 relative, codes within 1 of the
    reference's (a value at a rounding tie may round either way), at most
    0.5 % of them off."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import geometry
from rkc.ir.program import TensorInfo
from rkc.runtime.execute import to_layout
from rkc.runtime.kernels.hadamard import Rotation, compiled_form, make_rotation, rotate
from rkc.runtime.llm import prefill_fused as pf
from rkc.runtime.llm import prefill_rows
from rkc.runtime.llm.prefill_kernels import ACT_GELU_TANH, ACT_SILU, LANES
from rkc.runtime.llm.threads import over_ranges
from rkc.runtime.plan import BoTensor

F32 = np.float32
GELU_C, GELU_K = np.sqrt(2.0 / np.pi), 0.044715
NO_PARTIAL = np.zeros((0, 0, 0), np.int32)


def _operand(m: int, k: int, dtype: str, seed: int):
    itemsize = {"fp16": 2, "int8": 1, "int32": 4}[dtype]
    info = TensorInfo("t", [m, k], dtype, "native-gemm", "r", 0, geometry.nbytes([m, k], "native-gemm", itemsize))
    host = np.random.default_rng(seed).integers(0, 256, info.nbytes, dtype=np.uint8)  # stale bytes
    return BoTensor(info, host), info, host


def _in_edge(rng, rows, k, dtype, bias: bool, seed: int):
    """(atoms as the kernel reads them, row scale, channel scale, bias, the float64 values)."""
    bt, info, host = _operand(rows, k, dtype, seed)
    rs, ch = (rng.random(rows) * 1e-4).astype(F32), rng.random(k).astype(F32)
    b = rng.standard_normal(k).astype(F32)
    if dtype == "fp16":
        h = (rng.standard_normal((rows, k)) * 3).astype(np.float16)
        to_layout(h, info, host)
        return bt.atoms.view(np.uint16), rs, ch, b, h.astype(np.float64)
    acc = rng.integers(-2 ** 16, 2 ** 16, (rows, k)).astype(np.int32)
    to_layout(acc, info, host)
    x = acc.astype(np.float64) * rs.astype(np.float64)[:, None] * ch.astype(np.float64)
    return bt.atoms, rs, ch, b, x + (b.astype(np.float64) if bias else 0.0)


def _act(g: np.ndarray, act: int) -> np.ndarray:
    if act == ACT_SILU:
        return g / (1.0 + np.exp(-g))
    return 0.5 * g * (1.0 + np.tanh(GELU_C * (g + GELU_K * g ** 3)))


def assert_int8_codes(out_bt, scale, y, rows: int, stored: int, k: int) -> None:
    """An int8 out edge against float64 values y [rows, k]: scales within 1e-5 relative,
    codes within 1 of the reference's, at most 0.5 % off; the padding rows zeroed."""
    want_scale = np.abs(y).max(axis=1) / 127.0
    np.testing.assert_allclose(scale, want_scale, rtol=1e-5)
    codes = np.asarray(out_bt.atoms.transpose(1, 0, 2).reshape(stored, -1)[:, :k], np.int32)
    want_codes = np.clip(np.rint(y / want_scale[:, None]), -127, 127)
    off = np.abs(codes[:rows] - want_codes)
    assert off.max() <= 1 and (off > 0).mean() <= 0.005
    assert not codes[rows:].any()  # padding rows zeroed


@pytest.mark.parametrize("rows", [16, 37, 80])
# C21 (x) H64; H1024 and 3 x H512: int8 codes of whole rows by chunks of 256 channels (ffn_tiles' `low`)
# int32 in with a factor: the atoms' own order (prefill_rows._ffn_rotated_rows), blocks of 16 (H84 (x) H16) to 256
@pytest.mark.parametrize("k,kind", [(640, "kron"), (256, "block"), (896, "kron"), (1344, "auto"), (1024, "auto"),
                                    (1536, "block"), (1344, "kron"), (3328, "auto")])
@pytest.mark.parametrize("edges", [("int32", "int8"), ("fp16", "fp16"), ("fp16", "int8"), ("int32", "fp16")])
@pytest.mark.parametrize("act", [ACT_SILU, ACT_GELU_TANH])
def test_ffn_tiles_match_a_float64_reference(rows, k, kind, edges, act):
    rng = np.random.default_rng(rows * k + act)
    bias = edges[0] == "int32" and rows != 37
    g_src, g_rs, g_ch, g_b, g = _in_edge(rng, rows, k, edges[0], bias, 1)
    u_src, u_rs, u_ch, u_b, u = _in_edge(rng, rows, k, edges[0], bias, 2)
    want = _act(g, act) * u
    out_bt, _, out_host = _operand(rows, k, edges[1], 3)
    rot = make_rotation(k, kind)
    form = compiled_form(rot, k)
    scale = np.full(rows, np.nan, F32)
    rotated = np.full((k // form.block, rows * form.block), np.nan, F32)  # by blocks
    if edges[1] == "fp16":
        out_kind, dst = pf.OUT_HALF, out_bt.atoms.view(np.uint16)
    else:
        out_kind, dst = (pf.OUT_QUANT if form.factor is None else pf.OUT_ROTATED), out_bt.atoms
    in_kind = pf.IN_HALF if edges[0] == "fp16" else pf.IN_DEQUANT
    consts = (in_kind, g_src, NO_PARTIAL, g_rs, g_ch, g_b, bias, u_src, NO_PARTIAL, u_rs, u_ch, u_b, bias, act, rows,
              k, out_kind, dst, form.signs, form.block, form.norm, scale, rotated)
    over_ranges(lambda lo, hi: pf.ffn_tiles(*consts, lo, hi), -(-rows // LANES))  # tiles shared by the threads
    stored = out_bt.atoms.shape[1]
    if edges[1] == "fp16":
        got = BoTensor(out_bt.info, out_host).reader(np.float32)()
        ref = want.astype(np.float16)
        ulps = np.abs(got.astype(np.float16).view(np.int16).astype(np.int32) - ref.view(np.int16).astype(np.int32))
        # a subnormal half's step (6e-8) is finer than float32's error on a value 1e5 below its row's largest:
        # there the float32 tolerance applies
        near = np.abs(got - want) <= 4e-6 * np.abs(want).max(axis=1, keepdims=True)
        assert np.all((ulps <= 1) | near)
        return
    y = rotate(want, rot)  # float64: the rotation's own reference
    if out_kind == pf.OUT_ROTATED:  # the caller's factor product (fused_rows), then the codes
        before = rotate(want, Rotation(rot.signs, rot.block))  # the blocks before F mixes them
        got = rotated.reshape(k // form.block, rows, form.block).transpose(1, 0, 2).reshape(rows, k)
        assert np.all(np.abs(got - before) <= 4e-6 * np.abs(before).max(axis=1, keepdims=True))
        pf.quantize_blocks_into_atoms(form.factor @ rotated, form.block, dst, scale, 0, rows)
    assert_int8_codes(out_bt, scale, y, rows, stored, k)


@pytest.mark.parametrize("act", [ACT_SILU, ACT_GELU_TANH])
def test_ffn_rotated_rows_by_slabs(act):
    """int32 in, a factor's rotated rows out, at block 1024 (C3 (x) H1024): each
    thread's 75 rows go by slabs of 64 rows and a partial one."""
    assert prefill_rows._SLAB_VALUES // 1024 == 64
    test_ffn_tiles_match_a_float64_reference(150, 3072, "hartley", ("int32", "int8"), act)
