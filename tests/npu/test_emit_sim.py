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
from npu.emit_cases import (SWEEP, conv_reference, fp16_data, int8_data, needs_fp16_depthwise_writer, run_sim,  # noqa: E402
                            sim_reads, sim_takes_fp16_depthwise)

rng = np.random.default_rng(12345)


# -- GEMM -----------------------------------------------------------------------------
def _gemm(m, k, n, dtype, out, seed, epi=api.NO_EPILOGUE, aq=None, bq=None, cq=None, **opts):
    a = int8_data((m, k), seed) if dtype == "int8" else fp16_data((m, k), seed)
    b = int8_data((k, n), seed + 1) if dtype == "int8" else fp16_data((k, n), seed + 1, 1 / np.sqrt(k))
    A = api.Feature.gemm("A", 0, m, k, dtype, aq)
    C = api.Feature.gemm("C", 0, m, n, out, cq)
    r = emit(api.Gemm(A, b, C, m, bq, epi, "g"), api.EmitOptions(**opts))
    rows = api.gemm_rows(m)
    apad = np.zeros((rows, k), a.dtype)
    apad[:m] = a
    got = run_sim(r, {"A": (A, apad.T[:, :, None])}).feature(C)[:, :m, 0].T
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
    a = fp16_data((64, 512), 1)
    b = fp16_data((512, 1024), 2, 0.05)
    A, C = api.Feature.gemm("A", 0, 64, 512, "fp16"), api.Feature.gemm("C", 0, 64, 1024, "fp16")
    r = emit(api.Gemm(A, b, C, 64), api.EmitOptions(n_tile_max=128))
    assert max(len(j.tasks) for j in r.jobs) > 1
    stock = run_sim(r, {"A": (A, a.T[:, :, None])}).feature(C)
    chained = run_sim(r, {"A": (A, a.T[:, :, None])}, chained=True).feature(C)
    np.testing.assert_array_equal(stock, chained)


# -- convolution ----------------------------------------------------------------------
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
    wt = int8_data((k, k, c) if dw else (o, k, k, c), seed + 1)
    bias = np.random.default_rng(seed).integers(-2000, 2000, o)
    epi = api.Epilogue(bias=bias, activation=act, slope=0.1 if act == "leaky_relu" else None)
    r = emit(api.Conv2D(X, wt, Y, (s, s), pad, dw, wq, epi, "c"))
    event(f"{len(r.tasks)} task(s)")
    x = int8_data((c, h, w), seed)
    got = run_sim(r, {"x": (X, x)}).feature(Y)
    acc = conv_reference(x, wt.astype(np.int64) - zw, (s, s), pad, dw, zx)  # the DPU's accumulator
    sums = (wt.astype(np.int64) - zw).sum(axis=(0, 1) if dw else (1, 2, 3))
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, sums, epi, depthwise=dw))
    np.testing.assert_array_equal(got, plan.apply(acc))
    real = (conv_reference(x.astype(np.int64) - zx, wt.astype(np.int64) - zw, (s, s), pad, dw, 0)
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
    wt = int8_data((7, 7, c), 11)
    r = emit(api.Conv2D(X, wt, Y, (1, 1), (0, 3, 0, 0), True, wq, api.NO_EPILOGUE, "gap"))
    assert len(r.tasks) == 2, r.notes  # two channel tiles (a 7x7 kernel of 640 channels fills a CBUF bank)
    x = int8_data((c, 7, 7), 12)
    got = run_sim(r, {"x": (X, x)}).feature(Y)
    acc = conv_reference(x, wt.astype(np.int64), (1, 1), (0, 3, 0, 0), True, zx)
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, c, xq, wq, wt.astype(np.int64).sum(axis=(0, 1)),
                                             api.NO_EPILOGUE, depthwise=True))
    np.testing.assert_array_equal(got, plan.apply(acc))


@SWEEP
@given(shape=conv_shapes(), seed=st.integers(0, 999), bias=st.booleans(),
       act=st.sampled_from([None, "relu", "leaky_relu"]), out=st.sampled_from(["fp16", "fp32"]))
def test_conv_fp16(shape, seed, bias, act, out):
    c, h, w, o, k, s, pad, dw = shape
    if dw and not sim_takes_fp16_depthwise():
        event("depthwise drawn but not run: the simulator's Q4 reading rejects the fp16 depthwise writer")
        dw = False
    if dw:
        o = c  # any count: the emitter pads to whole 32-channel groups
        out = "fp16"
    oh, ow = (h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1
    X = api.Feature("x", 0, c, h, w, "fp16")
    Y = api.Feature("y", 0, o, oh, ow, out)
    wt = fp16_data((k, k, c) if dw else (o, k, k, c), seed + 1, 1 / k)
    b = np.random.default_rng(seed).standard_normal(o).astype(np.float32) if bias else None
    slope = 0.1 if act == "leaky_relu" else None
    r = emit(api.Conv2D(X, wt, Y, (s, s), pad, dw, None, api.Epilogue(bias=b, activation=act, slope=slope), "c"))
    x = fp16_data((c, h, w), seed)
    got = run_sim(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = conv_reference(x, wt, (s, s), pad, dw, 0)
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
    wt = int8_data((c, 1, 1, c), 5) if dtype == "int8" else fp16_data((c, 1, 1, c), 5, 0.2)
    epi = api.Epilogue(bias=np.arange(c) * (10 if dtype == "int8" else 0.01), activation="relu",
                       residual=api.Residual(R, "add"))
    op = api.Conv2D(X, wt, Y, weight_quant=q(0.02, 0), epilogue=epi)
    r = emit(op)
    x = int8_data((c, h, w), 1) if dtype == "int8" else fp16_data((c, h, w), 1)
    res = int8_data((c, h, w), 2) if dtype == "int8" else fp16_data((c, h, w), 2)
    got = run_sim(r, {"x": (X, x), "r": (R, res)}).feature(Y)
    if dtype == "int8":
        acc = conv_reference(x, wt, (1, 1), (0, 0, 0, 0), False, 2)
        plan = epilogue.plan(epilogue.DpuRequest("int8", Y, c, X.quant, op.weight_quant,
                                                 wt.astype(np.int64).sum(axis=(1, 2, 3)), epi))
        np.testing.assert_array_equal(got, plan.apply(acc, res))
        real = np.maximum((conv_reference(x.astype(np.int64) - 2, wt, (1, 1), (0,) * 4, False, 0)
                           + epi.bias[:, None, None]) * 0.001 + 0.1 * (res.astype(np.float64) - 6), 0)
        assert np.abs(got - np.clip(np.rint(real / 0.2) - 4, -128, 127)).max() <= 1
    else:
        ref = np.maximum(conv_reference(x, wt, (1, 1), (0,) * 4, False, 0) + epi.bias[:, None, None] + res, 0)
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
    gen = int8_data if dtype == "int8" else fp16_data
    a, b = gen((c, h, w), seed), gen((c, h, w), seed + 1)
    got = run_sim(r, {"a": (A, a), "b": (B, b)}).feature(O)
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
    gen = int8_data if dtype == "int8" else (lambda shape, seed: fp16_data(shape, seed, 3.0))
    a, b = gen((c, h, w), seed), gen((c, h, w), seed + 1)
    got = run_sim(r, {"a": (A, a), "b": (B, b)}).feature(O)
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
    got = run_sim(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = plan.function(x.astype(np.float64))
    assert np.abs(got - ref).max() <= plan.tolerance(), (function, np.abs(got - ref).max())


def test_a_chained_kick_fetches_tasks_of_any_length():
    """A chain links a conv (130-odd entries) to a LUT activation whose table
    upload makes it ~1100 entries long: every tail must fetch the whole next task
    (Mesa's ALIGN((n-4)/2, 2) falls short for such counts)."""
    from rkc.compiler.npu import lut

    c, h, w = 16, 4, 8
    X, M, Y = (api.Feature(n, 0, c, h, w, "fp16") for n in ("x", "m", "y"))
    conv = emit(api.Conv2D(X, fp16_data((c, 1, 1, c), 5, 0.3), M))
    act = emit(api.Activation(M, Y, "tanh"))
    counts = [len(t.regcmd) for r in (conv, act) for t in r.tasks]
    assert any(n % 4 != 2 for n in counts), counts  # a count where Mesa's rule under-fetches
    x = fp16_data((c, h, w), 6)
    stock = run_sim([conv, act], {"x": (X, x)}, merge_jobs=True).feature(Y)
    chained = run_sim([conv, act], {"x": (X, x)}, merge_jobs=True, chained=True).feature(Y)
    np.testing.assert_array_equal(stock, chained)
    ref = lut.plan("tanh").function(conv_reference(x, fp16_data((c, 1, 1, c), 5, 0.3), (1, 1), (0,) * 4, False, 0))
    assert np.abs(chained.astype(np.float64) - ref).max() <= lut.plan("tanh").tolerance()


def test_conv_with_fused_lut_epilogue():
    from rkc.compiler.npu import lut

    c, h, w, o = 16, 8, 8, 32
    X, Y = api.Feature("x", 0, c, h, w, "fp16"), api.Feature("y", 0, o, h, w, "fp16")
    wt = fp16_data((o, 1, 1, c), 3, 0.5)
    r = emit(api.Conv2D(X, wt, Y, epilogue=api.Epilogue(activation="sigmoid")))
    x = fp16_data((c, h, w), 4)
    got = run_sim(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    ref = lut.plan("sigmoid").function(conv_reference(x, wt, (1, 1), (0,) * 4, False, 0))
    assert np.abs(got - ref).max() <= lut.plan("sigmoid").tolerance()


@pytest.mark.parametrize("method, k, s, pad", [("max", 2, 2, (0, 0, 0, 0)), ("max", 3, 1, (1, 1, 1, 1)),
                                                ("max", 3, 2, (0, 1, 0, 1)), ("avg", 2, 2, (0, 0, 0, 0)),
                                                ("avg", 3, 1, (0, 0, 0, 0)), ("avg", None, 1, (0, 0, 0, 0))])
def test_ppu_pooling(method, k, s, pad):
    from rkc.runtime.sim import Quirks

    if not sim_reads("Q18"):
        pytest.skip("this simulator does not model the PPU yet")

    c, h, w = 24, 9, 10 if k is None else 11
    if k is None:
        h, w = 8, 12  # global: windows 8x12
    x = fp16_data((c, h, w), 9, 4.0)
    kh = kw = k if k else None
    oh, ow = ((h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1) if k else (1, 1)
    X, Y = api.Feature("x", 0, c, h, w, "fp16"), api.Feature("y", 0, c, oh, ow, "fp16")
    r = emit(api.Pool(X, Y, method, (kh, kw) if k else None, (s, s), pad), api.EmitOptions(ppu_completes=True))
    dev = sim.SimDevice(quirks=Quirks(completion_blocks=("DPU", "PPU")))  # a kernel completing PPU tasks
    got = run_sim(r, {"x": (X, x)}, device=dev).feature(Y).astype(np.float64)
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
        needs_fp16_depthwise_writer()
    c, h, w = 32, 12, 10
    q = (lambda s, z: api.Quant(s, z)) if dtype == "int8" else (lambda s, z: None)
    X = api.Feature("x", 0, c, h, w, dtype, q(0.1, 5))
    Y = api.Feature("y", 0, c, 6, 5, dtype, q(0.1, 5))
    r = emit(api.Pool(X, Y, "avg", (2, 2), (2, 2)))
    x = int8_data((c, h, w), 3) if dtype == "int8" else fp16_data((c, h, w), 3)
    got = run_sim(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    wins = x.astype(np.float64).reshape(c, 6, 2, 5, 2)
    if dtype == "int8":
        ideal = np.clip(np.rint((wins - 5).mean(axis=(2, 4))) + 5, -128, 127)
        assert np.abs(got - ideal).max() <= 1
    else:
        np.testing.assert_allclose(got, wins.mean(axis=(2, 4)), rtol=3e-3, atol=3e-3)




def _average_reference(x, k, s, pads, out_hw, count_padding):
    """ONNX AveragePool in float64 over [C, H, W]: window sums over the zero-padded
    map (ceil-mode overhang included) over the counted positions (the map, plus the
    explicit padding when it counts, never the overhang)."""
    (pt, pb, pl, pr), (oh, ow) = pads, out_hw
    h, w = x.shape[1:]
    extra_h, extra_w = max(0, (oh - 1) * s + k - h - pt - pb), max(0, (ow - 1) * s + k - w - pl - pr)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb + extra_h), (pl, pr + extra_w)))
    counted = np.pad(np.ones((1, h, w)), ((0, 0), (pt, pb), (pl, pr)), constant_values=float(count_padding))
    counted = np.pad(counted, ((0, 0), (0, extra_h), (0, extra_w)))

    def sums(a):
        return sum(a[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s] for i in range(k) for j in range(k))

    return sums(xp) / sums(counted)


# (channels, h, w, kernel, stride, pads, ceil mode, count_include_pad): ShuffleNet's 3x3/2 and
# Inception v2's 3x3/1 pad-excluding pools, odd maps, channels off the atom, ceil-mode overhang
# (counted or not), asymmetric and absent padding
PAD_EXCLUDING = [(24, 28, 28, 3, 2, (1, 1, 1, 1), 0, 0), (40, 14, 14, 3, 1, (1, 1, 1, 1), 0, 0),
                 (21, 9, 13, 3, 2, (1, 1, 1, 1), 0, 0), (70, 7, 7, 3, 1, (1, 1, 1, 1), 0, 0),
                 (19, 11, 12, 3, 2, (0, 0, 0, 0), 1, 0), (33, 10, 9, 3, 2, (1, 0, 0, 1), 1, 1),
                 (16, 8, 10, 2, 2, (1, 1, 1, 1), 0, 0), (48, 12, 15, 3, 2, (1, 1, 1, 1), 1, 1)]


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
@pytest.mark.parametrize("c, h, w, k, s, pads, ceil, count_padding", PAD_EXCLUDING)
def test_average_pool_with_per_position_divisors(dtype, c, h, w, k, s, pads, ceil, count_padding):
    """An average whose divisor varies by position (padding excluded, ceil-mode windows
    overhanging the padding) as window sums times a constant map of 1/count: on the
    simulator against numpy's float64 average (fp16 within its rounding, int8 within
    one output step of the ideal requantization)."""
    from rkc.compiler.npu.pool import divisors
    from rkc.compiler.ops.rules import spatial_out

    if dtype == "fp16":
        needs_fp16_depthwise_writer()
    oh, ow = spatial_out((h, w), (k, k), (s, s), (1, 1), list(pads[::2]) + list(pads[1::2]), "NOTSET", ceil)
    q = (lambda sc, z: api.Quant(sc, z)) if dtype == "int8" else (lambda sc, z: None)
    X = api.Feature("x", 0, c, h, w, dtype, q(0.05, 3))
    Y = api.Feature("y", 0, c, oh, ow, dtype, q(0.04, -6))
    pool = api.Pool(X, Y, "avg", (k, k), (s, s), pads, count_padding=bool(count_padding))
    assert divisors(pool) is not None  # every case needs the map
    r = emit(pool, api.EmitOptions(cores=3))
    seed = c * h + w
    x = int8_data((c, h, w), seed) if dtype == "int8" else fp16_data((c, h, w), seed)
    got = run_sim(r, {"x": (X, x)}).feature(Y).astype(np.float64)
    if dtype == "int8":
        mean = _average_reference(x.astype(np.float64) - 3, k, s, pads, (oh, ow), count_padding)
        ideal = np.clip(np.rint(mean * 0.05 / 0.04) - 6, -128, 127)
        assert np.abs(got - ideal).max() <= 1
    else:
        ref = _average_reference(x, k, s, pads, (oh, ow), count_padding)
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)


def test_int8_divisors_without_an_exact_common_scale_are_refused():
    """5x5 windows clipped by padding count 9..25 positions: no int8 multiple of every
    1/count, so the int8 lowering refuses rather than round the divisors."""
    q = api.Quant(0.1, 0)
    X, Y = api.Feature("x", 0, 16, 12, 12, "int8", q), api.Feature("y", 0, 16, 12, 12, "int8", q)
    with pytest.raises(UnsupportedError, match="common int8 scale"):
        emit(api.Pool(X, Y, "avg", (5, 5), (1, 1), (2, 2, 2, 2), count_padding=False))


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
@pytest.mark.parametrize("c, h, w", [(24, 30, 30), (96, 60, 60), (40, 64, 36), (70, 36, 56), (128, 120, 120)])
def test_global_average_over_a_large_map_as_two_averages(dtype, c, h, w):
    """A global average whose window one convolution cannot take (over the CNA's 31, or a
    kernel bigger than a CBUF bank: PP-OCR det's squeeze-excite pools over 30x30 to
    120x120) runs as a by b means at stride (a, b) and their mean, writing the 4 rows of
    a GEMM input (3 of bottom padding) as the compiler's global pool does; against numpy."""
    if dtype == "fp16":
        needs_fp16_depthwise_writer()
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
    x = int8_data((c, h, w), c + h) if dtype == "int8" else fp16_data((c, h, w), c + h)
    got = run_sim(r, {"x": (X, x)}).feature(Y)[:, 0, 0].astype(np.float64)
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
    wt = int8_data((k, k, c) if dw else (o, k, k, c), seed + 1)
    bias = np.random.default_rng(seed + 2).integers(-2000, 2000, o)
    epi = api.Epilogue(bias=bias, activation=act, slope=0.1 if act == "leaky_relu" else None)
    r = emit(api.Conv2D(X, wt, Y, (s, s), pad, dw, wq, epi, "c"))
    x = int8_data((c, h, w), seed)
    got = run_sim(r, {"x": (X, x)}).feature(Y)
    acc = conv_reference(x, wt.astype(np.int64), (s, s), pad, dw, zx)
    sums = wt.astype(np.int64).sum(axis=(0, 1) if dw else (1, 2, 3))
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, sums, epi, depthwise=dw))
    assert plan.bs_groups
    np.testing.assert_array_equal(got, plan.apply(acc))
    real = (conv_reference(x.astype(np.int64) - zx, wt.astype(np.int64), (s, s), pad, dw, 0)
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
    conv = api.Conv2D(X, int8_data((o, 1, 1, c), 1), Y, weight_quant=api.Quant(tuple(scales)),
                      epilogue=api.Epilogue(bias=np.full(o, 5000)))
    with pytest.raises(UnsupportedError, match="per-channel weight scales span"):
        emit(conv)
    scales[3] = 0.01 / epilogue.PER_CHANNEL_RANGE  # at the edge: accepted
    emit(api.Conv2D(X, int8_data((o, 1, 1, c), 1), Y, weight_quant=api.Quant(tuple(scales))))


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
    wt = int8_data((o, 1, 1, c), seed + 1)
    bias = rng.integers(-2000, 2000, o)
    epi = api.Epilogue(bias=bias, activation=act, residual=api.Residual(R, "add") if residual else None)
    r = emit(api.Conv2D(X, wt, Y, weight_quant=wq, epilogue=epi))
    x, res = int8_data((c, h, w), seed), int8_data((o, h, w), seed + 2)
    inputs = {"x": (X, x)}
    if residual:
        inputs["r"] = (R, res)
    got = run_sim(r, inputs).feature(Y)
    acc = conv_reference(x, wt.astype(np.int64), (1, 1), (0,) * 4, False, zx)
    plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, wt.astype(np.int64).sum(axis=(1, 2, 3)), epi))
    np.testing.assert_array_equal(got, plan.apply(acc, res if residual else None))
    real = (conv_reference(x.astype(np.int64) - zx, wt.astype(np.int64), (1, 1), (0,) * 4, False, 0)
            + bias[:, None, None]) * 0.05 * scales[:, None, None]
    if residual:
        real = real + (res.astype(np.float64) - rq.zero_point) * rq.scale
    if act:
        real = np.maximum(real, 0)
    ideal = np.clip(np.rint(real / yq.scale) + yq.zero_point, -128, 127)
    assert np.abs(got.astype(np.int64) - ideal).max() <= 1
