"""Every emitter op run on the NPU simulator against numpy, over hypothesis sweeps.

Integer outputs are compared bit for bit with the integer arithmetic the op
promises (the DPU plan's requantization model, epilogue.DpuPlan.apply, applied to
an accumulator numpy computes independently) and checked to be within one step
of the ideal real-valued result; float outputs to fp16-level tolerance.
Sweep sizes are listed in docs/npu-emitters.md.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

from rkc.compiler.npu import api, eltwise, epilogue
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.conv_core import kernel_group
from rkc.compiler.npu.quant import requantize, rne_shift
from rkc.ir.errors import UnsupportedError

sim = pytest.importorskip("rkc.runtime.sim", reason="the NPU simulator (issue 3) is not in this tree yet")
from npu_runner import run  # noqa: E402

SWEEP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
rng = np.random.default_rng(12345)


def _run(results, inputs, device=None, **kw):
    """Run on the simulator; a program the simulator declares it does not model
    (its UnsupportedError) skips the test with the simulator's own words."""
    from rkc.runtime.sim.errors import UnsupportedError as NotModelled

    try:
        return run(results if isinstance(results, list) else [results], device or sim.SimDevice(), inputs, **kw)
    except NotModelled as exc:
        if "not modelled" not in str(exc):
            raise
        pytest.skip(f"simulator: {exc}")


def _sim_reads(question: str) -> bool:
    """Whether the simulator's table of hardware readings has `question`."""
    from rkc.runtime.sim.quirks import QUESTIONS

    return any(q.id == question for q in QUESTIONS)


def _sim_takes_fp16_depthwise() -> bool:
    """rocket-userspace's HW-validated fp16 depthwise program writes 16 channels per
    pass (size_e 3); a simulator reading 8 rejects it (its Q4)."""
    from rkc.runtime.sim.quirks import DEFAULT

    return DEFAULT.dpu_channels_per_pass.get(("depthwise", 2)) == 16


def _needs_fp16_depthwise_writer():
    if not _sim_takes_fp16_depthwise():
        pytest.skip("this simulator reads fp16 depthwise writes as 8-channel passes (Q4), against "
                    "rocket-userspace's HW-validated size_e 3")


def _int8(shape, seed):
    return np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)


def _fp16(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float16)


# -- GEMM -----------------------------------------------------------------------------
def _gemm(m, k, n, dtype, out, seed, epi=api.NO_EPILOGUE, aq=None, bq=None, cq=None, **opts):
    a = _int8((m, k), seed) if dtype == "int8" else _fp16((m, k), seed)
    b = _int8((k, n), seed + 1) if dtype == "int8" else _fp16((k, n), seed + 1, 1 / np.sqrt(k))
    A = api.Feature.gemm("A", 0, m, k, dtype, aq)
    C = api.Feature.gemm("C", 0, m, n, out, cq)
    r = emit(api.Gemm(A, b, C, m, bq, epi, "g"), api.EmitOptions(**opts))
    rows = api.gemm_rows(m)
    apad = np.zeros((rows, k), a.dtype)
    apad[:m] = a
    got = _run(r, {"A": (A, apad.T[:, :, None])}).feature(C)[:, :m, 0].T
    return a, b, got, r


@SWEEP
@given(m=st.integers(1, 70), k=st.integers(1, 300), n=st.integers(1, 200), seed=st.integers(0, 999))
def test_gemm_int8_to_int32_is_exact(m, k, n, seed):
    a, b, got, _ = _gemm(m, k, n, "int8", "int32", seed)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


@SWEEP
@given(m=st.integers(1, 40), k=st.integers(1, 300), n=st.integers(1, 100), seed=st.integers(0, 999),
       act=st.sampled_from([None, "relu", "relu6"]), za=st.integers(-20, 20))
def test_gemm_int8_requantized_to_int8(m, k, n, seed, act, za):
    aq, bq = api.Quant(0.05, za), api.Quant(0.01)
    cq = api.Quant(0.05 * 0.01 * np.sqrt(k) * 40, -3)
    bias = np.random.default_rng(seed).integers(-3000, 3000, n)
    epi = api.Epilogue(bias=bias, activation=act)
    a, b, got, r = _gemm(m, k, n, "int8", "int8", seed, epi, aq, bq, cq)
    acc = a.astype(np.int64) @ b.astype(np.int64)  # the stored values; zero points are the DPU's job
    plan = epilogue.plan(epilogue.DpuRequest("int8", api.Feature.gemm("C", 0, m, n, "int8", cq), n, aq, bq,
                                             b.astype(np.int64).sum(0), epi))
    np.testing.assert_array_equal(got, plan.apply(acc.T).T)
    real = ((a.astype(np.float64) - za) @ b.astype(np.float64) + bias) * 0.05 * 0.01
    if act:
        real = np.clip(real, 0, 6 if act == "relu6" else np.inf)
    ideal = np.clip(np.rint(real / cq.scale) + cq.zero_point, -128, 127)
    assert np.abs(got.astype(np.int64) - ideal).max() <= 1


@SWEEP
@given(m=st.integers(1, 40), k=st.integers(1, 200), n=st.integers(1, 100), seed=st.integers(0, 999))
def test_gemm_int8_to_fp32_is_the_exact_sum(m, k, n, seed):
    a, b, got, _ = _gemm(m, k, n, "int8", "fp32", seed)
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.float32))


@SWEEP
@given(m=st.integers(1, 70), k=st.integers(1, 300), n=st.integers(1, 200), seed=st.integers(0, 999),
       out=st.sampled_from(["fp32", "fp16"]))
def test_gemm_fp16(m, k, n, seed, out):
    a, b, got, _ = _gemm(m, k, n, "fp16", out, seed)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-5 if out == "fp32" else 2e-3
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("m, k, n, dtype, out", [
    (1, 64, 8200, "int8", "int32"),  # N > 8192: split over tasks and cores
    (4, 8300, 40, "int8", "int32"),  # K > 8192: int8 partials summed on the CPU
    (1, 8300, 32, "fp16", "fp32"),  # K > 8192 at decode M: fp32 partials on the CPU
    (48, 8300, 48, "fp16", "fp16"),  # K > 8192: fp16 accumulated on the NPU in fp32
    (300, 1000, 70, "int8", "int32"),  # several M tiles with resident weights
])
def test_gemm_edge_sizes(m, k, n, dtype, out):
    a, b, got, r = _gemm(m, k, n, dtype, out, 7)
    if dtype == "int8":
        np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    else:
        ref = a.astype(np.float64) @ b.astype(np.float64)
        tol = 1e-4 if out == "fp32" else 3e-3
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_gemm_fp16_runs_identically_as_one_chained_kick_per_job():
    a = _fp16((64, 512), 1)
    b = _fp16((512, 1024), 2, 0.05)
    A, C = api.Feature.gemm("A", 0, 64, 512, "fp16"), api.Feature.gemm("C", 0, 64, 1024, "fp16")
    r = emit(api.Gemm(A, b, C, 64), api.EmitOptions(n_tile_max=128))
    assert max(len(j.tasks) for j in r.jobs) > 1
    stock = _run(r, {"A": (A, a.T[:, :, None])}).feature(C)
    chained = _run(r, {"A": (A, a.T[:, :, None])}, chained=True).feature(C)
    np.testing.assert_array_equal(stock, chained)


# -- convolution ----------------------------------------------------------------------
def _conv_acc(x, w, stride, pad, depthwise, pad_value):
    """Direct numpy convolution over the stored values, padded with `pad_value`."""
    xp = np.pad(x.astype(np.float64 if x.dtype == np.float16 else np.int64),
                ((0, 0), (pad[0], pad[1]), (pad[2], pad[3])), constant_values=pad_value)
    kh, kw = w.shape[:2] if depthwise else w.shape[1:3]
    sy, sx = stride
    oh = (xp.shape[1] - kh) // sy + 1
    ow = (xp.shape[2] - kw) // sx + 1
    wv = w.astype(xp.dtype)
    out = np.zeros(((x.shape[0] if depthwise else w.shape[0]), oh, ow), xp.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i:i + sy * (oh - 1) + 1:sy, j:j + sx * (ow - 1) + 1:sx]
            out += patch * wv[i, j][:, None, None] if depthwise else np.einsum("chw,oc->ohw", patch, wv[:, i, j, :])
    return out


@st.composite
def conv_shapes(draw):
    """(C, H, W, O, k, stride, (top, bottom, left, right), depthwise): kernels 1-5,
    strides 1-2, pads below the kernel on each side independently (asymmetric,
    one-sided), maps from 4 rows and 1 column, Cin from 1."""
    k = draw(st.sampled_from([1, 2, 3, 5]))
    pad = tuple(draw(st.integers(0, min(2, k - 1))) for _ in range(4))
    h = draw(st.integers(max(4, k - pad[0] - pad[1]), 19))
    w = draw(st.integers(max(1, k - pad[2] - pad[3]), 19))
    return (draw(st.integers(1, 40)), h, w, draw(st.integers(1, 40)), k, draw(st.sampled_from([1, 2])), pad,
            draw(st.booleans()))


@SWEEP
@given(shape=conv_shapes(), seed=st.integers(0, 999), act=st.sampled_from([None, "relu", "relu6", "leaky_relu"]),
       zx=st.integers(-10, 10), zw=st.sampled_from([0, 0, 5]))
def test_conv_int8(shape, seed, act, zx, zw):
    c, h, w, o, k, s, pad, dw = shape
    o = c if dw else o
    if dw:
        zw = 0
    xq, wq = api.Quant(0.05, zx), api.Quant(0.02, zw)
    yq = api.Quant(0.05 * 0.02 * np.sqrt(k * k * (1 if dw else c)) * 30, 4)
    oh, ow = (h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1
    X = api.Feature("x", 0, c, h, w, "int8", xq)
    Y = api.Feature("y", 0, o, oh, ow, "int8", yq)
    wt = _int8((k, k, c) if dw else (o, k, k, c), seed + 1)
    bias = np.random.default_rng(seed).integers(-2000, 2000, o)
    epi = api.Epilogue(bias=bias, activation=act, slope=0.1 if act == "leaky_relu" else None)
    r = emit(api.Conv2D(X, wt, Y, (s, s), pad, dw, wq, epi, "c"))
    event(f"{len(r.tasks)} task(s)")
    x = _int8((c, h, w), seed)
    got = _run(r, {"x": (X, x)}).feature(Y)
    acc = _conv_acc(x, wt.astype(np.int64) - zw, (s, s), pad, dw, zx)  # the DPU's accumulator
    sums = (wt.astype(np.int64) - zw).sum(axis=(0, 1) if dw else (1, 2, 3))
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, sums, epi, depthwise=dw))
    np.testing.assert_array_equal(got, plan.apply(acc))
    real = (_conv_acc(x.astype(np.int64) - zx, wt.astype(np.int64) - zw, (s, s), pad, dw, 0)
            + bias[:, None, None]) * 0.05 * 0.02
    if act == "leaky_relu":
        real = np.where(real < 0, real * 0.1, real)
    elif act:
        real = np.clip(real, 0, 6 if act == "relu6" else np.inf)
    ideal = np.clip(np.rint(real / yq.scale) + yq.zero_point, -128, 127)
    assert np.abs(got.astype(np.int64) - ideal).max() <= 1


def test_a_map_that_fits_is_one_row_tile_whatever_the_padding():
    """A global average's window as a depthwise convolution writing the 4 rows of a GEMM
    input (MobileNetV2's 7x7 pool: 3 rows of bottom padding): every output row reads
    the same 7 rows, so one row tile per channel tile (it was one task per output row,
    each re-reading the map)."""
    c, zx = 1280, 3
    xq, wq, yq = api.Quant(0.05, zx), api.Quant(0.02), api.Quant(0.05 * 0.02 * 10, -2)
    X = api.Feature("x", 0, c, 7, 7, "int8", xq)
    Y = api.Feature("y", 0, c, 4, 1, "int8", yq)
    wt = _int8((7, 7, c), 11)
    r = emit(api.Conv2D(X, wt, Y, (1, 1), (0, 3, 0, 0), True, wq, api.NO_EPILOGUE, "gap"))
    assert len(r.tasks) == 2, r.notes  # two channel tiles (a 7x7 kernel of 640 channels fills a CBUF bank)
    x = _int8((c, 7, 7), 12)
    got = _run(r, {"x": (X, x)}).feature(Y)
    acc = _conv_acc(x, wt.astype(np.int64), (1, 1), (0, 3, 0, 0), True, zx)
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, c, xq, wq, wt.astype(np.int64).sum(axis=(0, 1)),
                                             api.NO_EPILOGUE, depthwise=True))
    np.testing.assert_array_equal(got, plan.apply(acc))


@SWEEP
@given(shape=conv_shapes(), seed=st.integers(0, 999), bias=st.booleans(),
       act=st.sampled_from([None, "relu", "leaky_relu"]), out=st.sampled_from(["fp16", "fp32"]))
def test_conv_fp16(shape, seed, bias, act, out):
    c, h, w, o, k, s, pad, dw = shape
    if dw and not _sim_takes_fp16_depthwise():
        event("depthwise drawn but not run: the simulator's Q4 reading rejects the fp16 depthwise writer")
        dw = False
    if dw:
        o = c  # any count: the emitter pads to whole 32-channel groups
        out = "fp16"
    oh, ow = (h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1
    X = api.Feature("x", 0, c, h, w, "fp16")
    Y = api.Feature("y", 0, o, oh, ow, out)
    wt = _fp16((k, k, c) if dw else (o, k, k, c), seed + 1, 1 / k)
    b = np.random.default_rng(seed).standard_normal(o).astype(np.float32) if bias else None
    slope = 0.1 if act == "leaky_relu" else None
    r = emit(api.Conv2D(X, wt, Y, (s, s), pad, dw, None, api.Epilogue(bias=b, activation=act, slope=slope), "c"))
    x = _fp16((c, h, w), seed)
    got = _run(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = _conv_acc(x, wt, (s, s), pad, dw, 0)
    if b is not None:
        ref = ref + b[:, None, None]
    if slope:
        ref = np.where(ref < 0, ref * float(np.float16(slope)), ref)
    elif act:
        ref = np.maximum(ref, 0)
    np.testing.assert_allclose(got, ref, rtol=3e-3, atol=3e-3 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_conv_with_fused_residual_add_and_relu(dtype):
    c, h, w = 32, 16, 12
    q = (lambda s, z: api.Quant(s, z)) if dtype == "int8" else (lambda s, z: None)
    X = api.Feature("x", 0, c, h, w, dtype, q(0.05, 2))
    Y = api.Feature("y", 0, c, h, w, dtype, q(0.2, -4))
    R = api.Feature("r", 0, c, h, w, dtype, q(0.1, 6))
    wt = _int8((c, 1, 1, c), 5) if dtype == "int8" else _fp16((c, 1, 1, c), 5, 0.2)
    epi = api.Epilogue(bias=np.arange(c) * (10 if dtype == "int8" else 0.01), activation="relu",
                       residual=api.Residual(R, "add"))
    op = api.Conv2D(X, wt, Y, weight_quant=q(0.02, 0), epilogue=epi)
    r = emit(op)
    x = _int8((c, h, w), 1) if dtype == "int8" else _fp16((c, h, w), 1)
    res = _int8((c, h, w), 2) if dtype == "int8" else _fp16((c, h, w), 2)
    got = _run(r, {"x": (X, x), "r": (R, res)}).feature(Y)
    if dtype == "int8":
        acc = _conv_acc(x, wt, (1, 1), (0, 0, 0, 0), False, 2)
        plan = epilogue.plan(epilogue.DpuRequest("int8", Y, c, X.quant, op.weight_quant,
                                                 wt.astype(np.int64).sum(axis=(1, 2, 3)), epi))
        np.testing.assert_array_equal(got, plan.apply(acc, res))
        real = np.maximum((_conv_acc(x.astype(np.int64) - 2, wt, (1, 1), (0,) * 4, False, 0)
                           + epi.bias[:, None, None]) * 0.001 + 0.1 * (res.astype(np.float64) - 6), 0)
        assert np.abs(got - np.clip(np.rint(real / 0.2) - 4, -128, 127)).max() <= 1
    else:
        ref = np.maximum(_conv_acc(x, wt, (1, 1), (0,) * 4, False, 0) + epi.bias[:, None, None] + res, 0)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=3e-3, atol=3e-3 * np.abs(ref).max())


# -- element-wise -----------------------------------------------------------------------
@SWEEP
@given(c=st.integers(1, 70), h=st.integers(1, 20), w=st.integers(3, 24), op=st.sampled_from(api.ELEMENTWISE_OPS),
       dtype=st.sampled_from(["int8", "fp16"]), seed=st.integers(0, 999))
def test_elementwise(c, h, w, op, dtype, seed):
    q = (lambda s, z: api.Quant(s, z)) if dtype == "int8" else (lambda s, z: None)
    A = api.Feature("a", 0, c, h, w, dtype, q(0.05, 3))
    B = api.Feature("b", 0, c, h, w, dtype, q(0.08, -7))
    O = api.Feature("o", 0, c, h, w, dtype, q(0.2 if op == "mul" else 0.1, 2))
    try:
        r = emit(api.Elementwise(A, B, O, op, "e"))
    except UnsupportedError as exc:
        assert "atoms" in str(exc)  # odd or tiny atom counts only
        event("refused: odd or tiny atom count")
        return
    gen = _int8 if dtype == "int8" else _fp16
    a, b = gen((c, h, w), seed), gen((c, h, w), seed + 1)
    got = _run(r, {"a": (A, a), "b": (B, b)}).feature(O)
    f = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    if dtype == "fp16":
        np.testing.assert_array_equal(got, f(a.astype(np.float32), b.astype(np.float32)).astype(np.float16))
        return
    gain = eltwise.INT8_GAIN
    plan = epilogue.plan(epilogue.DpuRequest("int8", O, 32, A.quant, api.Quant(1.0 / gain),
                                             np.full(32, gain, np.int64), api.Epilogue(residual=api.Residual(B, op))))
    # the integer model: v = (a - za) * gain (the identity weight); the operand b - zb
    # scaled to v's units (or taken as is for mul, whose scale goes to the output
    # conversion); then requantize
    v = (a.astype(np.int64) - 3) * gain
    rb = b.astype(np.int64) + 7
    if op != "mul":
        rb = rne_shift(rb * plan.ew_mul, plan.ew_shift)
    np.testing.assert_array_equal(got, requantize(f(v, rb), plan.out_mul, plan.out_shift, 2))
    real = f(0.05 * (a - 3.0), 0.08 * (b + 7.0)) / O.quant.scale
    ideal = np.clip(np.rint(real) + 2, -128, 127)
    assert np.abs(got - ideal).max() <= 1
    # one rounding, not two: off by a step only where the real value is within the
    # multipliers' 2^-15 precision of a tie
    near_tie = np.abs(np.abs(real - np.floor(real)) - 0.5) < 2e-3
    assert np.all((got == ideal) | near_tie)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 70), h=st.integers(1, 12), w=st.integers(3, 24), op=st.sampled_from(["add", "max", "min"]),
       activation=st.sampled_from(["relu", "relu6", "clip"]), dtype=st.sampled_from(["int8", "fp16"]),
       seed=st.integers(0, 999))
def test_elementwise_then_relu(c, h, w, op, activation, dtype, seed):
    """The EW stage's ReLU / ReLU-X after the combination (a residual block's Add and
    ReLU as one task): numpy's act(a OP b), the int8 path within one output step."""
    q = (lambda s, z: api.Quant(s, z)) if dtype == "int8" else (lambda s, z: None)
    A = api.Feature("a", 0, c, h, w, dtype, q(0.05, 3))
    B = api.Feature("b", 0, c, h, w, dtype, q(0.08, -7))
    O = api.Feature("o", 0, c, h, w, dtype, q(0.04, -128))
    clip = (0.0, 2.5) if activation == "clip" else None
    hi = {"relu": np.inf, "relu6": 6.0, "clip": 2.5}[activation]
    try:
        r = emit(api.Elementwise(A, B, O, op, "e", activation=activation, clip=clip))
    except UnsupportedError as exc:
        assert "atoms" in str(exc)  # odd or tiny atom counts only
        return
    gen = _int8 if dtype == "int8" else (lambda shape, seed: _fp16(shape, seed, 3.0))
    a, b = gen((c, h, w), seed), gen((c, h, w), seed + 1)
    got = _run(r, {"a": (A, a), "b": (B, b)}).feature(O)
    f = {"add": np.add, "max": np.maximum, "min": np.minimum}[op]
    if dtype == "fp16":
        want = np.clip(f(a.astype(np.float32), b.astype(np.float32)), 0, hi).astype(np.float16)
        np.testing.assert_array_equal(got, want)
        return
    real = np.clip(f(0.05 * (a - 3.0), 0.08 * (b + 7.0)), 0, hi) / O.quant.scale
    ideal = np.clip(np.rint(real) - 128, -128, 127)
    assert np.abs(got.astype(np.int64) - ideal).max() <= 1
    assert got.min() >= -128 and (got[real == 0] == -128).all()  # ReLU's zero is the output's zero point


# -- LUT activations and pooling (need the simulator's LUT and PPU models) ----------------
@pytest.mark.parametrize("function", ["sigmoid", "tanh", "silu", "gelu", "gelu_tanh", "hardsigmoid", "hardswish", "exp"])
def test_standalone_lut_activation(function):
    from rkc.compiler.npu import lut

    c, h, w = 16, 6, 40
    X, Y = api.Feature("x", 0, c, h, w, "fp16"), api.Feature("y", 0, c, h, w, "fp16")
    r = emit(api.Activation(X, Y, function))
    plan = lut.plan(function)
    lim = plan.spec.x_max * 0.98
    x = np.linspace(-lim if function != "exp" else -lim, lim if function != "exp" else 0, c * h * w)
    x = np.random.default_rng(1).permutation(x).reshape(c, h, w).astype(np.float16)
    got = _run(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = plan.function(x.astype(np.float64))
    assert np.abs(got - ref).max() <= plan.tolerance(), (function, np.abs(got - ref).max())


def test_a_chained_kick_fetches_tasks_of_any_length():
    """A chain links a conv (130-odd entries) to a LUT activation whose table
    upload makes it ~1100 entries long: every tail must fetch the whole next task
    (Mesa's ALIGN((n-4)/2, 2) falls short for such counts)."""
    from rkc.compiler.npu import lut

    c, h, w = 16, 4, 8
    X, M, Y = (api.Feature(n, 0, c, h, w, "fp16") for n in ("x", "m", "y"))
    conv = emit(api.Conv2D(X, _fp16((c, 1, 1, c), 5, 0.3), M))
    act = emit(api.Activation(M, Y, "tanh"))
    counts = [len(t.regcmd) for r in (conv, act) for t in r.tasks]
    assert any(n % 4 != 2 for n in counts), counts  # a count where Mesa's rule under-fetches
    x = _fp16((c, h, w), 6)
    stock = _run([conv, act], {"x": (X, x)}, merge_jobs=True).feature(Y)
    chained = _run([conv, act], {"x": (X, x)}, merge_jobs=True, chained=True).feature(Y)
    np.testing.assert_array_equal(stock, chained)
    ref = lut.plan("tanh").function(_conv_acc(x, _fp16((c, 1, 1, c), 5, 0.3), (1, 1), (0,) * 4, False, 0))
    assert np.abs(chained.astype(np.float64) - ref).max() <= lut.plan("tanh").tolerance()


def test_conv_with_fused_lut_epilogue():
    from rkc.compiler.npu import lut

    c, h, w, o = 16, 8, 8, 32
    X, Y = api.Feature("x", 0, c, h, w, "fp16"), api.Feature("y", 0, o, h, w, "fp16")
    wt = _fp16((o, 1, 1, c), 3, 0.5)
    r = emit(api.Conv2D(X, wt, Y, epilogue=api.Epilogue(activation="sigmoid")))
    x = _fp16((c, h, w), 4)
    got = _run(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = lut.plan("sigmoid").function(_conv_acc(x, wt, (1, 1), (0,) * 4, False, 0))
    assert np.abs(got - ref).max() <= lut.plan("sigmoid").tolerance()


@pytest.mark.parametrize("method, k, s, pad", [("max", 2, 2, (0, 0, 0, 0)), ("max", 3, 1, (1, 1, 1, 1)),
                                                ("max", 3, 2, (0, 1, 0, 1)), ("avg", 2, 2, (0, 0, 0, 0)),
                                                ("avg", 3, 1, (0, 0, 0, 0)), ("avg", None, 1, (0, 0, 0, 0))])
def test_ppu_pooling(method, k, s, pad):
    from rkc.runtime.sim import Quirks

    if not _sim_reads("Q18"):
        pytest.skip("this simulator does not model the PPU yet")

    c, h, w = 24, 9, 10 if k is None else 11
    if k is None:
        h, w = 8, 12  # global: windows 8x12
    x = _fp16((c, h, w), 9, 4.0)
    kh = kw = k if k else None
    oh, ow = ((h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1) if k else (1, 1)
    X, Y = api.Feature("x", 0, c, h, w, "fp16"), api.Feature("y", 0, c, oh, ow, "fp16")
    r = emit(api.Pool(X, Y, method, (kh, kw) if k else None, (s, s), pad), api.EmitOptions(ppu_completes=True))
    dev = sim.SimDevice(quirks=Quirks(completion_blocks=("DPU", "PPU")))  # a kernel completing PPU tasks
    got = _run(r, {"x": (X, x)}, device=dev).feature(Y).astype(np.float64)
    kh, kw = (k, k) if k else (h, w)
    fill = -np.inf if method == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad[0], pad[1]), (pad[2], pad[3])), constant_values=fill)
    wins = np.stack([xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s] for i in range(kh) for j in range(kw)])
    if method == "max":
        np.testing.assert_array_equal(got, wins.max(0))
    else:
        ref = wins.sum(0) / (kh * kw)
        assert np.abs(got - ref).max() <= 3e-3 * np.abs(ref).max() + 2e-3


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_average_pool_as_depthwise_convolution(dtype):
    if dtype == "fp16":
        _needs_fp16_depthwise_writer()
    c, h, w = 32, 12, 10
    q = (lambda s, z: api.Quant(s, z)) if dtype == "int8" else (lambda s, z: None)
    X = api.Feature("x", 0, c, h, w, dtype, q(0.1, 5))
    Y = api.Feature("y", 0, c, 6, 5, dtype, q(0.1, 5))
    r = emit(api.Pool(X, Y, "avg", (2, 2), (2, 2)))
    x = _int8((c, h, w), 3) if dtype == "int8" else _fp16((c, h, w), 3)
    got = _run(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    wins = x.astype(np.float64).reshape(c, 6, 2, 5, 2)
    if dtype == "int8":
        ideal = np.clip(np.rint((wins - 5).mean(axis=(2, 4))) + 5, -128, 127)
        assert np.abs(got - ideal).max() <= 1
    else:
        np.testing.assert_allclose(got, wins.mean(axis=(2, 4)), rtol=3e-3, atol=3e-3)



@pytest.mark.parametrize("dtype", ["int8", "fp16"])
@pytest.mark.parametrize("c, h, w", [(24, 30, 30), (96, 60, 60), (40, 64, 36), (70, 36, 56), (128, 120, 120)])
def test_global_average_over_a_large_map_as_two_averages(dtype, c, h, w):
    """A global average whose window one convolution cannot take (over the CNA's 31, or a
    kernel bigger than a CBUF bank: PP-OCR det's squeeze-excite pools over 30x30 to
    120x120) runs as a by b means at stride (a, b) and their mean, writing the 4 rows of
    a GEMM input (3 of bottom padding) as the compiler's global pool does; against numpy."""
    if dtype == "fp16":
        _needs_fp16_depthwise_writer()
    q = api.Quant(0.1, 5) if dtype == "int8" else None
    X = api.Feature("x", 0, c, h, w, dtype, q)
    Y = api.Feature("y", 0, c, 4, 1, dtype, q)
    with pytest.raises(UnsupportedError):  # one convolution cannot
        emit(api.Conv2D(X, np.ones((h, w, c), np.int8 if dtype == "int8" else np.float16), Y, (1, 1), (0, 3, 0, 0),
                        True, api.Quant(1.0 / (h * w)) if dtype == "int8" else None))
    r = emit(api.Pool(X, Y, "avg", (h, w), (1, 1), (0, 3, 0, 0)), api.EmitOptions(cores=3))
    group = 64 if dtype == "int8" else 32
    assert len(r.jobs) == (min(3, c // group) if c % group == 0 else 1)  # bands of whole channel groups
    assert all(r.extents()[s.name] <= s.size for s in r.scratch)
    x = _int8((c, h, w), c + h) if dtype == "int8" else _fp16((c, h, w), c + h)
    got = _run(r, {"x": (X, x)}).feature(Y)[:, 0, 0].astype(np.float64)
    mean = x.astype(np.float64).reshape(c, -1).mean(axis=1)
    if dtype == "int8":  # two roundings to the scale: within one step of the ideal
        assert np.abs(got - np.clip(np.rint(mean - 5) + 5, -128, 127)).max() <= 1
    else:
        np.testing.assert_allclose(got, mean, rtol=3e-3, atol=3e-3)

@pytest.mark.parametrize("out", ["int32", "int8"])
def test_gemm_with_per_channel_weights(out):
    m, k, n = 20, 96, 70
    scales = tuple(float(s) for s in np.random.default_rng(0).uniform(0.002, 0.03, n))
    bq, aq = api.Quant(scales), api.Quant(0.05, 4)
    cq = api.Quant(0.05 * 0.03 * 40, -6) if out == "int8" else None
    bias = np.random.default_rng(1).integers(-2000, 2000, n)
    epi = api.Epilogue(bias=bias, activation="relu")
    a, b, got, r = _gemm(m, k, n, "int8", out, 5, epi, aq, bq, cq)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    plan = epilogue.plan(epilogue.DpuRequest("int8", api.Feature.gemm("C", 0, m, n, out, cq), n, aq, bq,
                                             b.astype(np.int64).sum(0), epi))
    np.testing.assert_array_equal(got, plan.apply(acc.T).T)
    real = np.maximum((a.astype(np.float64) - 4) @ b.astype(np.float64) + bias, 0)
    if out == "int32":
        np.testing.assert_array_equal(got, real.astype(np.int64))
    else:
        ideal = np.clip(np.rint(real * 0.05 * np.asarray(scales) / cq.scale) - 6, -128, 127)
        assert np.abs(got - ideal).max() <= 1


@SWEEP
@given(shape=conv_shapes(), seed=st.integers(0, 999), act=st.sampled_from([None, "relu"]), zx=st.integers(-10, 10))
def test_conv_int8_per_channel_requantized(shape, seed, act, zx):
    """Per-output-channel weight scales: the BS multiplier from the BRDMA operand
    groups (DATA_USE=7), bit-exact against the plan's integer model and within one
    step of the real result."""
    c, h, w, o, k, s, pad, dw = shape
    o = c if dw else o
    scales = np.random.default_rng(seed).uniform(0.002, 0.03, o)
    xq, wq = api.Quant(0.05, zx), api.Quant(tuple(float(v) for v in scales))
    yq = api.Quant(0.05 * 0.03 * np.sqrt(k * k * (1 if dw else c)) * 30, 4)
    oh, ow = (h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1
    X = api.Feature("x", 0, c, h, w, "int8", xq)
    Y = api.Feature("y", 0, o, oh, ow, "int8", yq)
    wt = _int8((k, k, c) if dw else (o, k, k, c), seed + 1)
    bias = np.random.default_rng(seed + 2).integers(-2000, 2000, o)
    epi = api.Epilogue(bias=bias, activation=act, slope=0.1 if act == "leaky_relu" else None)
    r = emit(api.Conv2D(X, wt, Y, (s, s), pad, dw, wq, epi, "c"))
    x = _int8((c, h, w), seed)
    got = _run(r, {"x": (X, x)}).feature(Y)
    acc = _conv_acc(x, wt.astype(np.int64), (s, s), pad, dw, zx)
    sums = wt.astype(np.int64).sum(axis=(0, 1) if dw else (1, 2, 3))
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, sums, epi, depthwise=dw))
    assert plan.bs_groups
    np.testing.assert_array_equal(got, plan.apply(acc))
    real = (_conv_acc(x.astype(np.int64) - zx, wt.astype(np.int64), (s, s), pad, dw, 0)
            + bias[:, None, None]) * 0.05 * scales[:, None, None]
    if act:
        real = np.maximum(real, 0)
    ideal = np.clip(np.rint(real / yq.scale) + yq.zero_point, -128, 127)
    assert np.abs(got.astype(np.int64) - ideal).max() <= 1


def test_per_channel_scales_beyond_the_multiplier_range_are_refused():
    """A channel whose multiplier is far below the largest (a BN-folded dead
    channel: weights ~1e-10, a bias) cannot be carried by the 16-bit BS
    multiplier: it used to round to 1 and put its bias-only output up to 128
    steps off. The emitter refuses; the quantizer floors such scales."""
    c, o = 16, 8
    scales = np.full(o, 0.01)
    scales[3] = 0.01 / (epilogue.PER_CHANNEL_RANGE * 4)
    X = api.Feature("x", 0, c, 4, 4, "int8", api.Quant(0.05))
    Y = api.Feature("y", 0, o, 4, 4, "int8", api.Quant(0.2))
    conv = api.Conv2D(X, _int8((o, 1, 1, c), 1), Y, weight_quant=api.Quant(tuple(scales)),
                      epilogue=api.Epilogue(bias=np.full(o, 5000)))
    with pytest.raises(UnsupportedError, match="per-channel weight scales span"):
        emit(conv)
    scales[3] = 0.01 / epilogue.PER_CHANNEL_RANGE  # at the edge: accepted
    emit(api.Conv2D(X, _int8((o, 1, 1, c), 1), Y, weight_quant=api.Quant(tuple(scales))))


@SWEEP
@given(seed=st.integers(0, 999), span=st.sampled_from([1.5, 20.0, 120.0]), mmax=st.sampled_from([0.003, 0.3, 3.0]),
       act=st.sampled_from([None, "relu"]), residual=st.booleans(), zx=st.integers(-10, 10))
def test_conv_int8_per_channel_wide_spans_large_multipliers_and_residuals(seed, span, mmax, act, residual, zx):
    """Per-channel multipliers spanning up to PER_CHANNEL_RANGE, a largest one from
    3e-3 to 3 (the BS shift adapts so its result stays finer than an output step),
    and a residual add after the per-channel multiplier: bit-exact against the
    plan's integer model and within one step of the real result."""
    c, h, w, o = 24, 6, 7, 20
    rng = np.random.default_rng(seed)
    scales = np.exp(rng.uniform(0, np.log(span), o)) * 0.002
    scales[0] = 0.002
    xq, wq = api.Quant(0.05, zx), api.Quant(tuple(float(v) for v in scales))
    yq = api.Quant(0.05 * scales.max() / mmax, -3)
    rq = api.Quant(yq.scale * 1.7, 6)
    X = api.Feature("x", 0, c, h, w, "int8", xq)
    Y = api.Feature("y", 0, o, h, w, "int8", yq)
    R = api.Feature("r", 0, o, h, w, "int8", rq)
    wt = _int8((o, 1, 1, c), seed + 1)
    bias = rng.integers(-2000, 2000, o)
    epi = api.Epilogue(bias=bias, activation=act, residual=api.Residual(R, "add") if residual else None)
    r = emit(api.Conv2D(X, wt, Y, weight_quant=wq, epilogue=epi))
    x, res = _int8((c, h, w), seed), _int8((o, h, w), seed + 2)
    inputs = {"x": (X, x)}
    if residual:
        inputs["r"] = (R, res)
    got = _run(r, inputs).feature(Y)
    acc = _conv_acc(x, wt.astype(np.int64), (1, 1), (0,) * 4, False, zx)
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, wt.astype(np.int64).sum(axis=(1, 2, 3)), epi))
    np.testing.assert_array_equal(got, plan.apply(acc, res if residual else None))
    real = (_conv_acc(x.astype(np.int64) - zx, wt.astype(np.int64), (1, 1), (0,) * 4, False, 0)
            + bias[:, None, None]) * 0.05 * scales[:, None, None]
    if residual:
        real = real + (res.astype(np.float64) - rq.zero_point) * rq.scale
    if act:
        real = np.maximum(real, 0)
    ideal = np.clip(np.rint(real / yq.scale) + yq.zero_point, -128, 127)
    assert np.abs(got.astype(np.int64) - ideal).max() <= 1


# -- nearest x2 upsampling ------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(["int8", "fp16"]), k=st.integers(2, 8), atoms=st.integers(1, 9), h=st.integers(4, 16),
       w=st.integers(1, 12), slice_at=st.integers(0, 1), seed=st.integers(0, 999), cores=st.sampled_from([1, 3]))
@example("fp16", 8, 3, 15, 15, 1, 0, 3)  # PP-OCRv4 det's x8 of 24 channels into its Concat slice
@example("int8", 4, 3, 8, 6, 1, 1, 3)  # 48 int8 channels: a 32-channel copy and an overlapping one
def test_upsample(dtype, k, atoms, h, w, slice_at, seed, cores):
    """Nearest xk as a 1 x k window and k copies a line apart (compiler/npu/upsample.py),
    exact against numpy (maps of 4+ rows: the row copies read the map, Q2), over channel
    counts that fill the depthwise writer's groups and counts that do not (identity
    copies, the last overlapping its predecessor); its output a channel slice of a wider
    map (a Concat's piece) or a map of its own; the surfaces around the slice stay untouched."""
    c2 = 16 if dtype == "int8" else 8
    c = atoms * c2
    if c < kernel_group(dtype) and c % (64 if dtype == "int8" else 32):
        with pytest.raises(UnsupportedError, match="channels"):  # one direct task would write past C
            emit(api.Upsample(api.Feature("x", 0, c, h, w, dtype, api.Quant(0.1) if dtype == "int8" else None),
                              api.Feature("y", 0, c, k * h, k * w, dtype,
                                          api.Quant(0.1) if dtype == "int8" else None), "up", k))
        return
    q = api.Quant(0.1, int(np.random.default_rng(seed).integers(-20, 20))) if dtype == "int8" else None
    x = _int8((c, h, w), seed) if dtype == "int8" else _fp16((c, h, w), seed)
    X = api.Feature("x", 0, c, h, w, dtype, q)
    wide = api.Feature("y", 0, c + 2 * c2, k * h, k * w, dtype, q)  # one surface either side of the slice
    Y = wide.view(channel0=c2, channels=c) if slice_at else api.Feature("y", 0, c, k * h, k * w, dtype, q)
    fill = np.full(wide.shape, 7, x.dtype)
    r = emit(api.Upsample(X, Y, "up", k), api.EmitOptions(cores=cores))
    event(f"{len(r.jobs)} band(s), {len(r.tasks)} task(s)")
    assert len(r.jobs) == min(cores, h // 4) and len({j.lane for j in r.jobs}) == len(r.jobs)
    assert r.extents().get("y", 0) <= (Y.offset + Y.nbytes if slice_at else Y.nbytes)  # nothing past its channels
    # a band's job reads only what it writes itself: fp16 runs it as one chained kick per core
    out = _run(r, {"x": (X, x), **({"y": (wide, fill)} if slice_at else {})}, chained=dtype == "fp16")
    np.testing.assert_array_equal(out.feature(Y), x.repeat(k, axis=1).repeat(k, axis=2))
    if slice_at:
        around = out.feature(wide)
        np.testing.assert_array_equal(around[:c2], fill[:c2])
        np.testing.assert_array_equal(around[c2 + c:], fill[c2 + c:])


def test_upsample_refusals():
    x8 = api.Feature("x", 0, 16, 4, 4, "int8", api.Quant(0.1))
    with pytest.raises(UnsupportedError, match="32\\+ channels"):  # the writer's extra channels
        emit(api.Upsample(x8, api.Feature("y", 0, 16, 8, 8, "int8", api.Quant(0.1))))
    with pytest.raises(UnsupportedError, match="over the CNA's 15"):  # the window's padding
        emit(api.Upsample(x8, api.Feature("y", 0, 16, 68, 68, "int8", api.Quant(0.1)), "up", 17))
    x = api.Feature("x", 0, 64, 4, 4, "int8", api.Quant(0.1))
    with pytest.raises(UnsupportedError, match="at least 4"):  # the row copies read a 2-row map (Q2)
        emit(api.Upsample(api.Feature("x", 0, 64, 2, 8, "int8", api.Quant(0.1)),
                          api.Feature("y", 0, 64, 4, 16, "int8", api.Quant(0.1))))
    with pytest.raises(UnsupportedError, match="one quantization"):
        emit(api.Upsample(x, api.Feature("y", 0, 64, 8, 8, "int8", api.Quant(0.2))))
    with pytest.raises(UnsupportedError, match="is \\(64, 8, 8\\)"):
        emit(api.Upsample(x, api.Feature("y", 0, 64, 8, 9, "int8", api.Quant(0.1))))
    with pytest.raises(UnsupportedError, match="dense rows"):  # only a DPU destination has a line stride
        emit(api.Conv2D(api.Feature("x", 0, 16, 4, 4, "fp16", line_stride=128), np.ones((16, 1, 1, 16), np.float16),
                        api.Feature("y", 0, 16, 4, 4, "fp16")))
    with pytest.raises(UnsupportedError, match="line stride"):
        api.Feature("x", 0, 16, 4, 4, "fp16", line_stride=48)


# -- transposed convolution, stride = kernel ------------------------------------------------
def _conv_transpose_ref(x, wt, k):
    """out[o, k*y + i, k*x + j] = sum_c wt[o, i, j, c] x[c, y, x], in float64 / int64."""
    c, h, w = x.shape
    acc = np.einsum("oijc,cyx->oyixj", wt, x)
    return acc.reshape(wt.shape[0], k * h, k * w)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(["int8", "fp16"]), k=st.sampled_from([2, 2, 3]), c=st.integers(1, 40),
       o=st.integers(1, 40), h=st.integers(4, 14), w=st.integers(1, 14), act=st.sampled_from([None, "relu"]),
       slice_at=st.integers(0, 1), seed=st.integers(0, 999), cores=st.sampled_from([1, 3]))
def test_conv_transpose_stride_equals_kernel(dtype, k, c, o, h, w, act, slice_at, seed, cores):
    """A k x k / k transposed convolution as per-row-tap 1 x k windows over the one-pixel
    rows and copies k lines apart (compiler/npu/conv_transpose.py), against numpy:
    fp16 to fp16 tolerance, int8 bit for bit against the DPU's requantization of the
    accumulator numpy computes (and within a step of the real result); its output a
    channel slice of a wider map or a map of its own, the surfaces around the slice
    untouched."""
    if dtype == "fp16":
        x, wt, xq, wq, yq = _fp16((c, h, w), seed), _fp16((o, k, k, c), seed + 1, 1 / np.sqrt(c)), None, None, None
        bias = np.random.default_rng(seed).standard_normal(o).astype(np.float32)
        group = 8
    else:
        zx = int(np.random.default_rng(seed).integers(-10, 10))
        x, wt = _int8((c, h, w), seed), _int8((o, k, k, c), seed + 1)
        xq, wq, yq = api.Quant(0.05, zx), api.Quant(0.02), api.Quant(0.05 * 0.02 * np.sqrt(c) * 30, 3)
        bias = np.random.default_rng(seed).integers(-2000, 2000, o).astype(np.int32)
        group = 16
    X = api.Feature("x", 0, c, h, w, dtype, xq)
    written = -(-o // kernel_group(dtype)) * kernel_group(dtype)  # a direct convolution's whole kernel groups
    wide = api.Feature("y", 0, group + written + group, k * h, k * w, dtype, yq)
    Y = wide.view(channel0=group, channels=o) if slice_at else api.Feature("y", 0, o, k * h, k * w, dtype, yq)
    fill = np.full(wide.shape, 7, x.dtype)
    epi = api.Epilogue(bias=bias, activation=act)
    r = emit(api.ConvTranspose2D(X, wt, Y, wq, epi, "ct"), api.EmitOptions(cores=cores))
    event(f"{len(r.jobs)} band(s), {len(r.tasks)} task(s)")
    assert len(r.jobs) == min(cores, h // 4) and len({j.lane for j in r.jobs}) == len(r.jobs)
    touched = r.extents()
    assert all(touched[s.name] <= s.size for s in r.scratch)  # the row maps hold what the convolutions write
    out = _run(r, {"x": (X, x), **({"y": (wide, fill)} if slice_at else {})}, chained=dtype == "fp16")
    got = out.feature(Y)
    if dtype == "fp16":
        ref = _conv_transpose_ref(x.astype(np.float64), wt.astype(np.float64), k) + bias[:, None, None]
        if act:
            ref = np.maximum(ref, 0)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=3e-3, atol=3e-3 * max(1.0, np.abs(ref).max()))
    else:
        acc = _conv_transpose_ref(x.astype(np.int64) - zx, wt.astype(np.int64), k)
        # the DPU's plan takes the raw accumulator, which holds zx times its weight sums (the
        # padding reads the zero point) and removes them in its bias term, whatever the sums
        sums = wt.astype(np.int64).sum(axis=(1, 2, 3))
        plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, sums, epi))
        np.testing.assert_array_equal(got, plan.apply(acc + zx * sums[:, None, None]))
        real = (acc + bias[:, None, None]) * 0.05 * 0.02
        if act:
            real = np.maximum(real, 0)
        ideal = np.clip(np.rint(real / yq.scale) + yq.zero_point, -128, 127)
        assert np.abs(got.astype(np.int64) - ideal).max() <= 1
    if slice_at:
        around = out.feature(wide)
        np.testing.assert_array_equal(around[:group], fill[:group])
        np.testing.assert_array_equal(around[group + written:], fill[group + written:])


# -- maps of few rows stored over zero rows: the flat DPU paths skip the zero rows -------------
@pytest.mark.parametrize("kind", ["sigmoid", "add", "mul"])
@pytest.mark.parametrize("c, h, w", [(16, 3, 40), (24, 2, 13), (40, 1, 30)])
def test_flat_ops_on_maps_over_zero_rows_leave_them_alone(kind, c, h, w):
    """A LUT activation and an element-wise op over maps of h < 4 rows stored in 4-row
    surfaces (ir/npu/geometry.py): one run per surface over its h rows; the zero rows
    below stay as they were (sigmoid(0) would be 0.5). Against numpy."""
    from rkc.compiler.npu import lut

    rows = 4
    full = {n: api.Feature(n, 0, c, rows, w, "fp16") for n in ("a", "b", "y")}
    padded = {n: replace(f, height=h, surface_stride=f.dense_surface_bytes, row_padded=True) for n, f in full.items()}
    data = {n: np.zeros((c, rows, w), np.float16) for n in ("a", "b")}
    for i, n in enumerate(data):
        data[n][:, :h] = _fp16((c, h, w), c + h + i)
    canary = np.full((c, rows, w), 3, np.float16)
    if kind == "sigmoid":
        r = emit(api.Activation(padded["a"], padded["y"], kind))
        plan = lut.plan(kind)
        ref, tol = plan.function(data["a"][:, :h].astype(np.float64)), plan.tolerance()
    else:
        r = emit(api.Elementwise(padded["a"], padded["b"], padded["y"], kind, "e"))
        ref = {"add": np.add, "mul": np.multiply}[kind](*(data[n][:, :h].astype(np.float64) for n in "ab"))
        tol = 3e-3 * max(1.0, np.abs(ref).max())
    got = _run(r, {n: (full[n], v) for n, v in (*data.items(), ("y", canary))}).feature(full["y"])
    assert np.abs(got[:, :h].astype(np.float64) - ref).max() <= tol
    np.testing.assert_array_equal(got[:, h:], canary[:, h:])


# -- a depthwise convolution whose weights are written at run time ----------------------------
@pytest.mark.parametrize("c, h, w", [(24, 6, 5), (96, 12, 12), (40, 30, 30)])
def test_depthwise_weights_from_a_run_time_buffer(c, h, w):
    """x * s for a per-channel vector s the host writes at run time (a squeeze-excite
    gate): a 1x1 fp16 depthwise convolution whose weights are the buffer holding s as a
    native [C, 1, 1] map, which is byte for byte the 1x1 depthwise weight layout."""
    _needs_fp16_depthwise_writer()
    X = api.Feature("x", 0, c, h, w, "fp16")
    S = api.Feature("s", 0, c, 1, 1, "fp16")
    Y = api.Feature("y", 0, c, h, w, "fp16")
    stand_in = np.zeros((1, 1, c), np.float16)
    r = emit(api.Conv2D(X, stand_in, Y, depthwise=True, name="mul", weights_buffer="s"))
    assert not r.constants or all(k.name != "mul.weights" for k in r.constants)
    x, s = _fp16((c, h, w), c), _fp16((c, 1, 1), c + 1)
    got = _run(r, {"x": (X, x), "s": (S, s)}).feature(Y).astype(np.float64)
    np.testing.assert_allclose(got, x.astype(np.float64) * s.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_run_time_weights_are_fp16_depthwise_only():
    X = api.Feature("x", 0, 16, 4, 4, "fp16")
    with pytest.raises(UnsupportedError, match="fp16 depthwise only"):
        emit(api.Conv2D(X, np.zeros((16, 1, 1, 16), np.float16), api.Feature("y", 0, 16, 4, 4, "fp16"),
                        weights_buffer="w"))


# -- a depthwise convolution over a map of fewer than 4 rows, stored with zero rows below ------
@pytest.mark.parametrize("c, h, w, k, stride, pad", [
    (32, 3, 6, 5, (1, 1), 2), (96, 2, 12, 5, (1, 1), 2), (64, 3, 24, 5, (2, 1), 2), (32, 2, 5, 5, (2, 2), 2),
    (40, 3, 7, 3, (1, 1), 1), (24, 3, 9, 3, (2, 2), 1), (16, 1, 10, 5, (1, 1), 4), (48, 2, 6, 3, (1, 1), 2),
    (448, 2, 48, 5, (1, 1), 2)])  # 448 x 48: five rows of the map would not fit CBUF, its four do
def test_few_row_depthwise_reads_zero_rows_below_the_map(c, h, w, k, stride, pad):
    """PP-OCR cls's 5x5 depthwise convolutions over 2- and 3-row maps (pad 2), and 3x3
    ones: a task reads 4+ rows (Q2), so the map is stored in 4-row surfaces whose rows
    past h are zero, and the task reads those 4 rows with its bottom padding 4 - h rows
    smaller (a zero row and a zero-padded row are the same sum: documented behaviour
    only). Its result is written into 4-row surfaces too, the rows past it left as they
    were, so the next such convolution can read it the same way. Against numpy over
    the h rows."""
    _needs_fp16_depthwise_writer()
    rows, pads = 4, (pad, pad, pad, pad)
    x = _fp16((c, h, w), c + h)
    wt = _fp16((k, k, c), c + 1, 0.2)
    want = _conv_acc(x, wt, stride, pads, True, 0)
    oh, ow = want.shape[1:]
    stored = np.zeros((c, rows, w), np.float16)
    stored[:, :h] = x
    X = api.Feature("x", 0, c, rows, w, "fp16")
    Y4 = api.Feature("y", 0, c, max(rows, oh), ow, "fp16")  # the result's own 4-row surfaces
    Y = replace(Y4, height=oh, surface_stride=Y4.dense_surface_bytes, row_padded=True)
    op = api.Conv2D(replace(X, height=h), wt, Y, stride=stride, padding=pads, depthwise=True, name="dw")
    with pytest.raises(UnsupportedError, match="at least 4"):  # the map as it is: refused (Q2)
        emit(op)
    r = emit(replace(op, input=X, padding=(pad, pad - (rows - h), pad, pad)))
    canary = np.full(Y4.shape, 3, np.float16)
    got = _run(r, {"x": (X, stored), "y": (Y4, canary)}).feature(Y4)
    np.testing.assert_allclose(got[:, :oh].astype(np.float64), want, rtol=3e-3, atol=3e-3)
    np.testing.assert_array_equal(got[:, oh:], canary[:, oh:])  # the rows below it stay as they were
