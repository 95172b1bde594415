"""The DPU's per-channel stages (runtime/sim/dpu_x.py) against numpy: BS/BN ALU
max / min / add / minus with register and per-channel operands (Q11), the
BS operand groups of DATA_USE=7 with the measured multiplier (Q21), the
per-channel CPEND operand (OW_SRC=1, Q17), and what the simulator refuses."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rkc.ir.npu import layout
from programs import Ref, Stage, conv_task, gemm_spec, operand_groups, place, read_gemm, upload
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.errors import HangError, QuirkRejection, UnsupportedError

FAST = settings(max_examples=25, deadline=None)
I32 = (-(1 << 31), (1 << 31) - 1)
NP_ALU = {0: np.maximum, 1: np.minimum, 2: np.add, 4: np.subtract}


def _gemm(a, b, spec, bs_operand=None, bn_operand=None):
    """Run C = A @ B through the DPU program `spec`; operands are raw arrays for the
    BS / BN DMAs."""
    dev = SimDevice()
    x = Ref(upload(dev, layout.pack_gemm_a(a)))
    w = Ref(upload(dev, layout.pack_gemm_b(b)))
    y = Ref(dev.create_bo(spec.out_bytes()))
    bs = Ref(upload(dev, bs_operand)) if bs_operand is not None else None
    bn = Ref(upload(dev, bn_operand)) if bn_operand is not None else None
    prog = place(dev, [conv_task(spec, x, w, y, bias=bs, bn=bn)], in_bos=[x.bo, w.bo], out_bos=[y.bo])
    dev.run([prog.job()])
    return read_gemm(dev, y, spec)


def _rne_shift(v, shift):
    if shift == 0:
        return v
    q = v >> shift
    rem = v - (q << shift)
    half = 1 << (shift - 1)
    return q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))


def _f32_bits(x) -> int:
    return int(np.array(x, np.float32).view(np.uint32))


# -- ALU max / min / add / minus (Q11) ---------------------------------------------------
@FAST
@given(m=st.integers(4, 24), k=st.integers(1, 4).map(lambda v: 16 * v), n=st.integers(1, 5).map(lambda v: 16 * v),
       stage=st.sampled_from(["BS", "BN"]), algo=st.sampled_from([0, 1, 2, 4]), from_memory=st.booleans(),
       seed=st.integers(0, 2**31))
def test_int8_alu_operations_with_register_or_per_channel_operand(m, k, n, stage, algo, from_memory, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    if from_memory:
        operand = rng.integers(-60000, 60000, n).astype(np.int32)
        st_ = Stage(alu=algo)
        expected = NP_ALU[algo](acc, operand.astype(np.int64))
    else:
        value = int(rng.integers(-60000, 60000))
        operand = None
        st_ = Stage(alu=algo, alu_operand=value)
        expected = NP_ALU[algo](acc, value)
    spec = replace(gemm_spec(m, k, n), **{stage.lower(): st_})
    got = _gemm(a, b, spec, **{f"{stage.lower()}_operand": operand})
    np.testing.assert_array_equal(got, np.clip(expected, *I32))


@FAST
@given(m=st.integers(4, 24), k=st.integers(1, 8).map(lambda v: 8 * v), n=st.integers(1, 6).map(lambda v: 8 * v),
       stage=st.sampled_from(["BS", "BN"]), algo=st.sampled_from([0, 1, 2, 4]), from_memory=st.booleans(),
       seed=st.integers(0, 2**31))
def test_fp16_alu_operations_with_register_or_per_channel_operand(m, k, n, stage, algo, from_memory, seed):
    """Small integer-valued fp16 data: every fp32 sum is exact, so the comparison is too."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-8, 9, (m, k)).astype(np.float16)
    b = rng.integers(-8, 9, (k, n)).astype(np.float16)
    acc = a.astype(np.float32) @ b.astype(np.float32)
    if from_memory:
        operand = (rng.integers(-400, 400, n) / 4).astype(np.float32)
        st_ = Stage(alu=algo)
        expected = NP_ALU[algo](acc, operand)
    else:
        value = np.float32(rng.integers(-400, 400) / 4)
        operand = None
        st_ = Stage(alu=algo, alu_operand=_f32_bits(value))
        expected = NP_ALU[algo](acc, value)
    spec = replace(gemm_spec(m, k, n, "fp16"), **{stage.lower(): st_})
    got = _gemm(a, b, spec, **{f"{stage.lower()}_operand": operand})
    np.testing.assert_array_equal(got, expected.astype(np.float32))


def test_bs_max_and_bn_min_clamp_to_a_per_channel_range():
    """max with a register floor in BS, min with a per-channel ceiling in BN."""
    rng = np.random.default_rng(11)
    a = rng.integers(-128, 128, (12, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 48)).astype(np.int8)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    ceiling = rng.integers(0, 40000, 48).astype(np.int32)
    spec = replace(gemm_spec(12, 64, 48), bs=Stage(alu=0, alu_operand=-5000), bn=Stage(alu=1))
    got = _gemm(a, b, spec, bn_operand=ceiling)
    np.testing.assert_array_equal(got, np.minimum(np.maximum(acc, -5000), ceiling.astype(np.int64)))
    assert (got == -5000).any() and (got == ceiling).any()  # both bounds were reached


# -- BS operand groups and the multiplier (Q21) ----------------------------------------
@FAST
@given(m=st.integers(4, 20), k=st.integers(1, 8).map(lambda v: 16 * v), n=st.integers(1, 70),
       shift=st.integers(0, 24), shift_neg=st.integers(0, 24), seed=st.integers(0, 2**31))
def test_per_channel_multiplier_from_operand_groups(m, k, n, shift, shift_neg, seed):
    """BRDMA_DATA_USE=7: v = sat32(rne(((acc + A) * C) >> (p >= 0 ? s : s_neg)))."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    kernels = -(-n // 16) * 16  # whole int8 passes
    bias = rng.integers(-(1 << 20), 1 << 20, kernels).astype(np.int32)
    mul = rng.integers(-32768, 32768, kernels).astype(np.int16)
    spec = replace(gemm_spec(m, k, kernels), bs=Stage(alu=2, mul=True, shift=shift, shift_neg=shift_neg))
    bp = np.zeros((k, kernels), np.int8)
    bp[:, :n] = b
    got = _gemm(a, bp, spec, bs_operand=operand_groups(bias, mul))[:, :n]
    p = (acc + bias[:n]) * mul[:n].astype(np.int64)
    expected = np.where(p >= 0, _rne_shift(p, shift), _rne_shift(p, shift_neg))
    np.testing.assert_array_equal(got, np.clip(expected, *I32))


def test_multiplier_product_is_wide_under_a_shift_and_saturates_without():
    """The out-cvt-converter.md arms: products past 2**31 are kept wide under a
    shift, and saturate at int32 with shift 0 (seen through an OUT_CVT shift of 8,
    which would bring an unsaturated product back into range)."""
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, (8, 256)).astype(np.int8)
    b = rng.integers(-128, 128, (256, 32)).astype(np.int8)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    bias = np.zeros(32, np.int32)
    mul = np.full(32, 30000, np.int16)
    assert (np.abs(acc * 30000) >= 1 << 31).mean() > 0.3
    for s in (0, 20):
        spec = replace(gemm_spec(8, 256, 32), bs=Stage(alu=2, mul=True, shift=s, shift_neg=s), out_shift=8)
        got = _gemm(a, b, spec, bs_operand=operand_groups(bias, mul))
        np.testing.assert_array_equal(got, _rne_shift(np.clip(_rne_shift(acc * 30000, s), *I32), 8))


def test_per_channel_requant_to_int8_with_a_cpend_operand():
    """The whole measured epilogue: (acc + A + B*S) * C >> s, then OUT_CVT to int8; S is
    the window sum over every input channel (OW_SRC=1)."""
    rng = np.random.default_rng(4)
    m, k, n = 16, 96, 48
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    bias = rng.integers(-20000, 20000, n).astype(np.int32)
    cpend = rng.integers(-300, 300, n).astype(np.int16)
    mul = rng.integers(2000, 32768, n).astype(np.int16)
    spec = replace(gemm_spec(m, k, n, out="int8"), bs=Stage(alu=2, mul=True, shift=15, shift_neg=15),
                   ow_src=True, out_scale=20000, out_shift=22, out_offset=-3)
    got = _gemm(a, b, spec, bs_operand=operand_groups(bias, mul, cpend))
    window = a.astype(np.int64).sum(axis=1, keepdims=True)  # 1x1 window over all K channels
    v = _rne_shift((acc + bias + cpend.astype(np.int64) * window) * mul.astype(np.int64), 15)
    expected = np.clip(_rne_shift(np.clip(v, *I32) * 20000, 22) - 3, -128, 127)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 50  # a real spread, not saturated


# -- what the simulator refuses ------------------------------------------------------------
def _refused(spec, **operands):
    a = np.ones((8, 32), np.int8)
    b = np.ones((32, 32), np.int8)
    _gemm(a, b, spec, **operands)


def test_bn_operand_groups_hang_as_measured():
    spec = replace(gemm_spec(8, 32, 32), bn=Stage(alu=2, mul=True, shift=4))
    with pytest.raises(HangError, match="hung on RK3588"):
        _refused(spec, bn_operand=operand_groups(np.zeros(32, np.int32), np.ones(32, np.int16)))


def test_operand_groups_only_as_measured():
    groups = operand_groups(np.zeros(32, np.int32), np.ones(32, np.int16))
    only_alu = replace(gemm_spec(8, 32, 32), bs=Stage(alu=2, data_use=7))
    with pytest.raises(UnsupportedError, match="measured only with the ALU and the MUL"):
        _refused(only_alu, bs_operand=groups)
    fp16 = replace(gemm_spec(8, 32, 32, "fp16"), bs=Stage(alu=2, mul=True))
    with pytest.raises(UnsupportedError, match="float datapath"):
        _gemm(np.ones((8, 32), np.float16), np.ones((32, 32), np.float16), fp16, bs_operand=groups)


def test_cpend_from_dma_needs_the_groups():
    spec = replace(gemm_spec(8, 32, 32), bs=Stage(alu=2), ow_src=True)
    with pytest.raises(HangError, match="DATA_USE=0x1"):
        _refused(spec, bs_operand=np.zeros(32, np.int32))


def test_alu_algorithm_3_is_refused():
    spec = replace(gemm_spec(8, 32, 32), bs=Stage(alu=3, alu_operand=0))
    with pytest.raises(QuirkRejection, match="ALU_ALGO=3"):
        _refused(spec)
