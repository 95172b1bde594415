"""Elementwise ops: activations (NPU: DPU LUT or ALU stages), binary
arithmetic (NPU: DPU EW stage), variadic Sum/Max/Min, and the CPU-only
glue (Cast, Identity, Dropout, Where)."""

from __future__ import annotations


from rkc.compiler.npu import api
from rkc.compiler.ops import NpuLowering, OpSpec
from rkc.compiler.ops.constraints import BASIC, cpu_only
from rkc.compiler.ops.rules import broadcast, broadcast_shapes, need, same, with_dtype
from rkc.ir.types import DType, TensorType


def second_operand_fits(ctx) -> bool:
    """the DPU's second operand must have the first's shape, or be per-channel or a scalar"""
    a, b = ctx.type(0), ctx.type(1)
    out = ctx.out_type()
    if a is None or b is None:
        return False
    if tuple(a.shape) == tuple(b.shape) == tuple(out.shape):
        return True
    small = b if tuple(a.shape) == tuple(out.shape) else a
    dims = (1,) * (len(out.shape) - len(small.shape)) + tuple(small.shape)
    channel = 1 if len(out.shape) == 4 else len(out.shape) - 1
    return all(d == 1 for i, d in enumerate(dims) if i != channel)


def inference_dropout(ctx) -> bool:
    """Dropout in training mode (random masks) is not supported: rkc compiles for inference"""
    mode = ctx.const(2)
    return not ctx.has(2) or (mode is not None and not bool(mode.reshape(-1)[0]))


def dropout_shape(ctx):
    t = need(ctx)
    out = [TensorType(t.dtype, t.shape)]
    if len(ctx.op.outputs) > 1:
        out.append(with_dtype(DType.BOOL, t.shape))
    return out


def cast_shape(ctx):
    return [with_dtype(DType(ctx.attr("to")), need(ctx).shape)]


def where_shape(ctx):
    shapes = [need(ctx, i).shape for i in range(3)]
    return [TensorType(need(ctx, 1).dtype, broadcast_shapes(shapes, f"op {ctx.op.describe()}"))]


def compare_shape(ctx):
    return [with_dtype(DType.BOOL, broadcast(ctx)[0].shape)]


def _unary(name: str, summary: str, npu=BASIC, lower: NpuLowering | None = None) -> OpSpec:
    return OpSpec(name, same, npu=npu, lower=lower, summary=summary)


def _binary(name: str, summary: str, lower: NpuLowering | None = None) -> OpSpec:
    return OpSpec(name, broadcast, npu=(*BASIC, second_operand_fits), lower=lower, summary=summary)


def gelu_exact(op) -> bool:
    """the table is GELU's erf form; approximate="tanh" is another function"""
    return op.attrs.get("approximate", "none") == "none"


def hardsigmoid_exact(op) -> bool:
    """the table is x/6 + 1/2; ONNX's default slope 0.2 is another function"""
    return abs(float(op.attrs.get("alpha", 0.2)) - 1 / 6) < 1e-6 and float(op.attrs.get("beta", 0.5)) == 0.5


def swish_exact(op) -> bool:
    """the table is SiLU, x * sigmoid(x): Swish's alpha must be 1"""
    return float(op.attrs.get("alpha", 1.0)) == 1.0


def _lut(function: str, exact=None) -> NpuLowering:
    """A standalone DPU lookup-table task, or a stage of the epilogue before it."""
    return NpuLowering(api.Activation, function, exact)


def _eltwise(function: str) -> NpuLowering:
    return NpuLowering(api.Elementwise, function)


NO_LUT = cpu_only("the DPU has no lookup table or ALU stage for this function")
GLUE = cpu_only("host-side glue: no arithmetic worth an NPU task")

SPECS = [
    _unary("Relu", "max(x, 0)", lower=NpuLowering(None, "relu")),
    _unary("LeakyRelu", "x if x >= 0 else alpha * x (NPU: in the epilogue of the Conv before it, BN's "
                        "multiplier on negative values)", lower=NpuLowering(None, "leaky_relu")),
    _unary("Clip", "clamp to [min, max]", lower=NpuLowering(None, "clip")),
    _unary("Sigmoid", "1 / (1 + exp(-x)) (DPU LUT)", lower=_lut("sigmoid")),
    _unary("HardSigmoid", "clamp(alpha * x + beta, 0, 1) (NPU: scale, shift and clip as a 1x1 depthwise conv or folded into the Conv before it)", lower=_lut("hardsigmoid", hardsigmoid_exact)),
    _unary("HardSwish", "x * hardsigmoid(x)", lower=_lut("hardswish")),
    _unary("Swish", "x * sigmoid(alpha * x): SiLU at alpha 1 (DPU LUT; fused from Sigmoid and Mul)",
           lower=_lut("silu", swish_exact)),
    _unary("Tanh", "tanh (DPU LUT)", lower=_lut("tanh")),
    _unary("Gelu", "GELU, erf or tanh form (DPU LUT)", lower=_lut("gelu", gelu_exact)),
    _unary("Erf", "erf (CPU; fused into GELU where the pattern matches)", npu=(NO_LUT,)),
    _unary("Exp", "exp", npu=(NO_LUT,)),
    _unary("Log", "log", npu=(NO_LUT,)),
    _unary("Sqrt", "square root", npu=(NO_LUT,)),
    _unary("Reciprocal", "1 / x", npu=(NO_LUT,)),
    _unary("Neg", "-x", npu=(NO_LUT,)),
    _unary("Abs", "|x|", npu=(NO_LUT,)),
    _unary("Elu", "ELU", npu=(NO_LUT,)),
    _unary("Softplus", "log(1 + exp(x))", npu=(NO_LUT,)),
    _unary("Floor", "floor", npu=(NO_LUT,)),
    _unary("Ceil", "ceil", npu=(NO_LUT,)),
    _binary("Add", "a + b (broadcasting; on the NPU a bias, a residual or two same-shaped tensors)",
            lower=_eltwise("add")),
    _binary("Sub", "a - b (broadcasting; a per-channel or scalar constant: a 1x1 depthwise conv on the NPU)"),
    _binary("Mul", "a * b (broadcasting; on the NPU two same-shaped tensors, or a per-channel or scalar constant as a 1x1 "
            "depthwise conv)", lower=_eltwise("mul")),
    _binary("Div", "a / b (NPU when b is a per-channel or scalar constant: a 1x1 depthwise conv by 1/b)"),
    OpSpec("Pow", broadcast, npu=(cpu_only("the NPU has no general power function"),), summary="a ** b"),
    OpSpec("Sum", broadcast, npu=BASIC, lower=_eltwise("add"), summary="sum of N tensors (NPU: two)"),
    OpSpec("Max", broadcast, npu=BASIC, lower=_eltwise("max"), summary="elementwise max of N tensors (NPU: two)"),
    OpSpec("Min", broadcast, npu=BASIC, lower=_eltwise("min"), summary="elementwise min of N tensors (NPU: two)"),
    OpSpec("Where", where_shape, npu=(GLUE,), summary="select by condition"),
    OpSpec("Identity", same, npu=(GLUE,), summary="pass-through (removed by canonicalize)"),
    OpSpec("Dropout", dropout_shape, npu=(GLUE,), cpu=(inference_dropout,),
           summary="identity at inference (removed by canonicalize)"),
    OpSpec("Cast", cast_shape, npu=(GLUE,), summary="element type conversion"),
]
