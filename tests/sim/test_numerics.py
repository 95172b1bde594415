"""The simulator computes what the hardware computes: GEMM and convolution
results checked against numpy across shape sweeps (hypothesis). Integer paths
are exact; fp16 products accumulated in fp32 stay within fp32 rounding of the
float64 result."""

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from rkc.ir.npu import layout
from programs import ConvSpec, Ref, conv_task, gemm_spec, place, read_gemm, run_gemm, upload
from rkc.runtime.sim import SimDevice

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _rng(seed):
    return np.random.default_rng(seed)


@FAST
@given(m=st.integers(4, 300), k=st.integers(1, 64).map(lambda v: 16 * v), n=st.integers(1, 24).map(lambda v: 16 * v),
       seed=st.integers(0, 2**31))
def test_int8_gemm_is_exact(m, k, n, seed):
    rng = _rng(seed)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    got = run_gemm(SimDevice(), a, b)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


@FAST
@given(m=st.integers(4, 200), k=st.integers(1, 64).map(lambda v: 8 * v), n=st.integers(1, 24).map(lambda v: 8 * v),
       out=st.sampled_from(["fp32", "fp16"]), seed=st.integers(0, 2**31))
def test_fp16_gemm_within_fp32_accumulation(m, k, n, out, seed):
    rng = _rng(seed)
    a = (rng.standard_normal((m, k)) * 0.5).astype(np.float16)
    b = (rng.standard_normal((k, n)) * 0.5).astype(np.float16)
    got = run_gemm(SimDevice(), a, b, out=out).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # any fp32 summation order: |err| <= K * 2^-23 * sum|a*b|; fp16 output adds half an ulp
    bound = k * 2.0**-23 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    if out == "fp16":
        bound = bound + np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(got - ref) <= bound + 1e-12)


def _ref_conv(x, w, stride, pt, pl, oh, ow, pad_value, depthwise):
    """Plain loops over the output: x [C,H,W] int64, w [K,kh,kw,C] or [kh,kw,C]."""
    c, h, wd = x.shape
    kh, kw = (w.shape[0], w.shape[1]) if depthwise else (w.shape[1], w.shape[2])
    xp = np.full((c, (oh - 1) * stride + kh, (ow - 1) * stride + kw), pad_value, np.int64)
    hh, ww = min(h, xp.shape[1] - pt), min(wd, xp.shape[2] - pl)
    xp[:, pt:pt + hh, pl:pl + ww] = x[:, :hh, :ww]
    k = c if depthwise else w.shape[0]
    out = np.zeros((k, oh, ow), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            win = xp[:, oy * stride:oy * stride + kh, ox * stride:ox * stride + kw]  # [C,kh,kw]
            if depthwise:
                out[:, oy, ox] = np.einsum("cyx,yxc->c", win, w)
            else:
                out[:, oy, ox] = np.einsum("cyx,kyxc->k", win, w)
    return out


def _round_half_even_shift(v, shift):
    if shift == 0:
        return v
    q = v >> shift
    rem = v - (q << shift)
    half = 1 << (shift - 1)
    return q + ((rem > half) | ((rem == half) & (q & 1 == 1)))


def _conv_case(spec: ConvSpec, seed: int):
    rng = _rng(seed)
    x = rng.integers(-128, 128, (spec.channels, spec.height, spec.width)).astype(np.int8)
    if spec.depthwise:
        w = rng.integers(-128, 128, (spec.kh, spec.kw, spec.channels)).astype(np.int8)
        packed = layout.pack_depthwise_weights(w)
    else:
        w = rng.integers(-128, 128, (spec.kernels, spec.kh, spec.kw, spec.channels)).astype(np.int8)
        packed = layout.pack_weights(w)
    bias = rng.integers(-5000, 5000, spec.written_channels).astype(np.int32)
    return x, w, packed, bias


def _run_conv(spec: ConvSpec, x, packed, bias, residual=None):
    dev = SimDevice()
    xb = Ref(upload(dev, layout.pack_feature(x)))
    wb = Ref(upload(dev, packed))
    bb = Ref(upload(dev, bias)) if spec.bias else None
    eb = Ref(upload(dev, residual)) if residual is not None else None
    yb = Ref(dev.create_bo(spec.out_bytes()))
    prog = place(dev, [conv_task(spec, xb, wb, yb, bias=bb, ew=eb)], in_bos=[xb.bo, wb.bo], out_bos=[yb.bo])
    dev.run([prog.job()])
    dt = {"int32": np.int32, "int8": np.int8, "fp32": np.float32, "fp16": np.float16}[spec.out]
    c2 = 16 // np.dtype(dt).itemsize
    n = -(-spec.written_channels // c2)
    raw = yb.bo.host[:n * spec.oh * spec.ow * 16].view(dt).reshape(n, spec.oh, spec.ow, c2)
    return layout.unpack_feature(raw, spec.written_channels), dev


conv_shapes = st.tuples(st.integers(1, 3).map(lambda v: 16 * v), st.integers(4, 11), st.integers(1, 11),
                        st.sampled_from([1, 2, 3]), st.sampled_from([1, 2]))


@FAST
@given(shape=conv_shapes, kernels=st.integers(1, 40), bias=st.booleans(), seed=st.integers(0, 2**31))
def test_int8_direct_convolution_is_exact(shape, kernels, bias, seed):
    c, h, w, k, stride = shape
    pad = k // 2
    spec = ConvSpec("int8", c, h, w, kernels, kh=k, kw=k, stride=stride, pad_top=pad, pad_left=pad,
                    out="int32", bias=bias)
    if spec.oh < 1 or spec.ow < 1:
        return
    x, wt, packed, b = _conv_case(spec, seed)
    got, dev = _run_conv(spec, x, packed, b)
    ref = _ref_conv(x.astype(np.int64), wt.astype(np.int64), stride, pad, pad, spec.oh, spec.ow, 0, False)
    if bias:
        ref = ref + b[:kernels, None, None]
    np.testing.assert_array_equal(got[:kernels], ref)
    np.testing.assert_array_equal(got[kernels:], 0)  # channels past ORIG_CHANNEL hold OFFSET_PEND
    assert dev.counters.macs == kernels * spec.oh * spec.ow * k * k * c


@FAST
@given(shape=conv_shapes, scale=st.integers(0x4000, 0x7FFF), shift=st.integers(8, 24),
       offset=st.integers(-20, 20), relu=st.booleans(), pad_value=st.integers(-128, 127), seed=st.integers(0, 2**31))
def test_int8_depthwise_requantised_output(shape, scale, shift, offset, relu, pad_value, seed):
    c, h, w, k, stride = shape
    pad = k // 2
    spec = ConvSpec("int8", c, h, w, c, kh=k, kw=k, stride=stride, pad_top=pad, pad_left=pad, depthwise=True,
                    out="int8", bias=True, relu=relu, out_scale=scale, out_shift=shift, out_offset=offset,
                    pad_value=pad_value)
    if spec.oh < 1 or spec.ow < 1:
        return
    x, wt, packed, b = _conv_case(spec, seed)
    got, _ = _run_conv(spec, x, packed, b)
    acc = _ref_conv(x.astype(np.int64), wt.astype(np.int64), stride, pad, pad, spec.oh, spec.ow, pad_value, True)
    acc = acc + b[:c, None, None]
    if relu:
        acc = np.maximum(acc, 0)
    ref = np.clip(_round_half_even_shift(acc * scale, shift) + offset, -128, 127)
    np.testing.assert_array_equal(got[:c], ref)


@FAST
@given(hw=st.integers(4, 9), c=st.sampled_from([16, 32]), k=st.sampled_from([16, 32]), ew_scale=st.integers(1, 0x7FFF),
       ew_shift=st.integers(0, 15), seed=st.integers(0, 2**31))
def test_int8_convolution_with_residual_add(hw, c, k, ew_scale, ew_shift, seed):
    """Mesa's fused ADD: the EW stage adds a converted int8 operand read by the
    combined MRDMA/ERDMA pair (COMB_USE=5)."""
    spec = ConvSpec("int8", c, hw, hw, k, out="int8", bias=True, out_scale=0x4000, out_shift=14,
                    residual="add", ew_scale=ew_scale, ew_shift=ew_shift, ew_offset=3)
    x, wt, packed, b = _conv_case(spec, seed)
    e = _rng(seed + 1).integers(-128, 128, (spec.written_channels, hw, hw)).astype(np.int8)
    got, _ = _run_conv(spec, x, packed, b, residual=layout.pack_feature(e))
    acc = _ref_conv(x.astype(np.int64), wt.astype(np.int64), 1, 0, 0, hw, hw, 0, False) + b[:k, None, None]
    acc = acc + _round_half_even_shift((e[:k].astype(np.int64) + 3) * ew_scale, ew_shift)
    ref = np.clip(_round_half_even_shift(acc * 0x4000, 14), -128, 127)
    np.testing.assert_array_equal(got[:k], ref)


@FAST
@given(shape=conv_shapes, kernels=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_fp16_direct_convolution(shape, kernels, seed):
    c, h, w, k, stride = shape
    pad = k // 2
    spec = ConvSpec("fp16", c, h, w, kernels, kh=k, kw=k, stride=stride, pad_top=pad, pad_left=pad, out="fp32")
    rng = _rng(seed)
    x = rng.standard_normal((c, h, w)).astype(np.float16)
    wt = rng.standard_normal((kernels, k, k, c)).astype(np.float16)
    got, _ = _run_conv(spec, x, layout.pack_weights(wt), None)
    xs = x.astype(np.float64)
    ref = np.zeros((kernels, spec.oh, spec.ow))
    mag = np.zeros_like(ref)
    xp = np.zeros((c, (spec.oh - 1) * stride + k, (spec.ow - 1) * stride + k))
    hh, ww = min(h, xp.shape[1] - pad), min(w, xp.shape[2] - pad)
    xp[:, pad:pad + hh, pad:pad + ww] = xs[:, :hh, :ww]
    for oy in range(spec.oh):
        for ox in range(spec.ow):
            win = xp[:, oy * stride:oy * stride + k, ox * stride:ox * stride + k]
            ref[:, oy, ox] = np.einsum("cyx,kyxc->k", win, wt.astype(np.float64))
            mag[:, oy, ox] = np.einsum("cyx,kyxc->k", np.abs(win), np.abs(wt.astype(np.float64)))
    assert np.all(np.abs(got[:kernels] - ref) <= c * k * k * 2.0**-23 * mag + 1e-12)


def test_chained_and_stock_submission_agree():
    """The same two fp16 GEMM tasks, one kick each or one hardware chain."""
    rng = _rng(7)
    a = rng.standard_normal((16, 64)).astype(np.float16)
    b = rng.standard_normal((64, 32)).astype(np.float16)
    outs = []
    for chained in (False, True):
        dev = SimDevice()
        spec = gemm_spec(16, 64, 32, "fp16")
        x, w = Ref(upload(dev, layout.pack_gemm_a(a))), Ref(upload(dev, layout.pack_gemm_b(b)))
        y1, y2 = Ref(dev.create_bo(spec.out_bytes())), Ref(dev.create_bo(spec.out_bytes()))
        prog = place(dev, [conv_task(spec, x, w, y1), conv_task(spec, x, w, y2)], chain=chained)
        dev.run([prog.job()], chained=chained)
        outs.append((read_gemm(dev, y1, spec), read_gemm(dev, y2, spec)))
        assert dev.counters.kicks == (1 if chained else 2) and dev.counters.tasks == 2
    np.testing.assert_array_equal(outs[0][0], outs[1][1])


def test_bf16_gemm_to_fp32():
    """bf16 runs the fp16 program with precision 3 (precision-field.md): exact
    bf16 products, fp32 accumulation."""
    from programs import PREC, gemm_spec
    rng = _rng(11)
    a32 = rng.standard_normal((8, 64)).astype(np.float32)
    b32 = rng.standard_normal((64, 16)).astype(np.float32)
    to_bf16 = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16 value
    a, b = to_bf16(a32), to_bf16(b32)
    af = (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    bf = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    dev = SimDevice()
    spec = gemm_spec(8, 64, 16, "fp16", "fp32")
    spec.prec = "bf16"
    x, w = Ref(upload(dev, layout.pack_gemm_a(a))), Ref(upload(dev, layout.pack_gemm_b(b)))
    y = Ref(dev.create_bo(spec.out_bytes()))
    dev.run([place(dev, [conv_task(spec, x, w, y)]).job()])
    got = read_gemm(dev, y, spec).astype(np.float64)
    ref = af @ bf
    assert PREC["bf16"] == 3 and np.all(np.abs(got - ref) <= 64 * 2.0**-23 * (np.abs(af) @ np.abs(bf)) + 1e-12)


def test_data_reuse_reads_the_feature_once():
    from rkc.ir.npu.regcmd import write_entry
    rng = _rng(12)
    a = rng.integers(-128, 128, (16, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 32)).astype(np.int8)
    dev = SimDevice()
    spec = gemm_spec(16, 64, 32)
    x, w = Ref(upload(dev, layout.pack_gemm_a(a))), Ref(upload(dev, layout.pack_gemm_b(b)))
    y1, y2 = Ref(dev.create_bo(spec.out_bytes())), Ref(dev.create_bo(spec.out_bytes()))
    first, second = conv_task(spec, x, w, y1), conv_task(spec, x, w, y2)
    for j, e in enumerate(second.entries):
        if (e & 0xFFFF) == 0x1040 and (e >> 48) == 0x0201:
            second.entries[j] = write_entry("CNA_CBUF_CON0", e >> 16 & 0xFFFF | 1 << 12)  # DATA_REUSE
    dev.run([place(dev, [first, second]).job()])
    assert dev.counters.dma_read["CNA_FEATURE"] == 16 * 64
    np.testing.assert_array_equal(read_gemm(dev, y2, spec), a.astype(np.int64) @ b)
    from rkc.runtime.sim.errors import CbufError
    import pytest
    with pytest.raises(CbufError, match="DATA_REUSE"):
        dev.run([place(dev, [second]).job()])


@FAST
@given(hw=st.integers(4, 8), k=st.sampled_from([16, 32, 48]), relux=st.integers(0, 4000), shift=st.integers(0, 12),
       seed=st.integers(0, 2**31))
def test_bias_relux_and_per_channel_bn_multiplier(hw, k, relux, shift, seed):
    """BS: bias from BRDMA, ReLU clamped at RELUX; BN: per-channel int16 multiplier
    from NRDMA, shifted (ties to even, Q21); OUT_CVT to int32."""
    spec = ConvSpec("int8", 16, hw, hw, k, out="int32", bias=True, relux=relux, bn_mul_shift=shift)
    x, wt, packed, b = _conv_case(spec, seed)
    m = _rng(seed + 2).integers(-300, 300, spec.written_channels).astype(np.int16)
    dev = SimDevice()
    refs = [Ref(upload(dev, a)) for a in (layout.pack_feature(x), packed, b, m)]
    yb = Ref(dev.create_bo(spec.out_bytes()))
    dev.run([place(dev, [conv_task(spec, refs[0], refs[1], yb, bias=refs[2], bn=refs[3])]).job()])
    n = -(-spec.written_channels // 4)
    got = layout.unpack_feature(yb.bo.host[:n * hw * hw * 16].view(np.int32).reshape(n, hw, hw, 4), k)
    acc = _ref_conv(x.astype(np.int64), wt.astype(np.int64), 1, 0, 0, hw, hw, 0, False) + b[:k, None, None]
    acc = np.clip(acc, 0, relux) * m[:k, None, None].astype(np.int64)
    ref = _round_half_even_shift(acc, shift)
    np.testing.assert_array_equal(got, ref)
