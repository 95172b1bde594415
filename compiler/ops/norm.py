"""Normalisations and softmax. BatchNormalization is folded into the
preceding convolution (passes/fold_batchnorm) or becomes a per-channel
multiply-add; LayerNormalization and Softmax reduce across channels, which
the NPU cannot do, so they are hard boundaries."""

from __future__ import annotations

from rkc.compiler.ops import OpSpec
from rkc.compiler.ops.constraints import BASIC, cpu_only
from rkc.compiler.ops.rules import need, norm_axis, same
from rkc.ir.types import DType, TensorType


def layer_norm_shape(ctx):
    x = need(ctx)
    out = [TensorType(x.dtype, x.shape)]
    axis = norm_axis(int(ctx.attr("axis", -1)), len(x.shape), f"op {ctx.op.describe()}")
    stat = tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis)
    out += [TensorType(DType.FP32, stat)] * (len(ctx.op.outputs) - 1)
    return out


def softmax_shape(ctx):
    x = need(ctx)
    norm_axis(int(ctx.attr("axis", -1)), len(x.shape), f"op {ctx.op.describe()}")
    return [TensorType(x.dtype, x.shape)]


REDUCES_CHANNELS = cpu_only("normalises across a whole axis (exp/sum or mean/variance): the NPU has no such reduction")

def inference_batchnorm(ctx) -> bool:
    """BatchNormalization in training mode (batch statistics) is not supported: rkc compiles for inference"""
    return not ctx.attr("training_mode", 0) and len(ctx.op.outputs) == 1


SPECS = [
    OpSpec("BatchNormalization", lambda ctx: same(ctx) if len(ctx.op.outputs) == 1 else None, npu=BASIC, cpu=(inference_batchnorm,),
           summary="folded into the preceding Conv; else a per-channel scale and shift (a 1x1 depthwise conv)"),
    OpSpec("LayerNormalization", layer_norm_shape, npu=(REDUCES_CHANNELS,), summary="layer normalisation"),
    OpSpec("InstanceNormalization", same, npu=(REDUCES_CHANNELS,), summary="instance normalisation"),
    OpSpec("Softmax", softmax_shape, npu=(REDUCES_CHANNELS,), summary="softmax along an axis"),
    OpSpec("LogSoftmax", softmax_shape, npu=(REDUCES_CHANNELS,), summary="log softmax along an axis"),
]
