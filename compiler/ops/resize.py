"""Resize (nearest x2 on the NPU; nearest, linear, cubic on the CPU)."""

from __future__ import annotations

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.ops import NpuLowering, OpSpec
from rkc.compiler.ops.constraints import BASIC
from rkc.compiler.ops.rules import need, runtime_value
from rkc.ir.errors import VerifyError
from rkc.ir.types import TensorType


def resize_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 2, 3):
        return None
    rank = len(x.shape)
    axes = [int(a) % rank for a in ctx.attr("axes", list(range(rank)))]
    sizes, scales = ctx.const(3), ctx.const(2)
    shape = list(x.shape)
    if sizes is not None and sizes.size:
        sizes = [int(s) for s in sizes.reshape(-1)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(o / shape[a] for o, a in zip(sizes, axes))
            sizes = [int(np.floor(s * shape[a] + 0.5)) for a in axes]
        for a, s in zip(axes, sizes):
            shape[a] = s
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.reshape(-1)):
            shape[a] = int(np.floor(shape[a] * float(s))) if isinstance(shape[a], int) else shape[a]
    else:
        raise VerifyError(f"op {ctx.op.describe()}: scales or sizes must be constants")
    return [TensorType(x.dtype, tuple(shape))]


def no_antialias(ctx) -> bool:
    """antialiased resizing (antialias=1) is not implemented"""
    return not ctx.attr("antialias", 0)


# (coordinate_transformation_mode, nearest_mode) pairs under which output pixel 2k and 2k+1
# both sample input pixel k at a scale of exactly 2: asymmetric maps them to k and k + 0.5,
# half_pixel to k - 0.25 and k + 0.25
NEAREST_X2_MODES = {("asymmetric", "floor"), ("asymmetric", "round_prefer_floor"),
                    ("half_pixel", "round_prefer_floor"), ("half_pixel", "round_prefer_ceil"),
                    ("pytorch_half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", "round_prefer_ceil")}


def nearest_x2(ctx) -> bool:
    """the NPU upsamples by exactly 2 in height and width, nearest, sampling pixel k for outputs 2k and 2k+1
    (asymmetric + floor, or half_pixel + round_prefer_*); other resizes run on the feature map in place on the CPU"""
    x, y = need(ctx).shape, ctx.out_type().shape
    if len(x) != 4 or tuple(y) != (x[0], x[1], 2 * x[2], 2 * x[3]) or ctx.attr("mode", "nearest") != "nearest":
        return False
    modes = (ctx.attr("coordinate_transformation_mode", "half_pixel"), ctx.attr("nearest_mode", "round_prefer_floor"))
    scales = ctx.const(2)
    if scales is not None and scales.size and [float(s) for s in scales.reshape(-1)] != [1.0, 1.0, 2.0, 2.0]:
        return False  # a scale near 2 that still gives 2H rows samples other pixels
    return modes in NEAREST_X2_MODES and not ctx.attr("axes")


SPECS = [OpSpec("Resize", resize_shape, npu=(*BASIC, nearest_x2), lower=NpuLowering(api.Upsample),
                cpu=(no_antialias,), summary="resize: nearest x2 (NPU: two depthwise convolutions); nearest, "
                                             "linear, cubic (CPU)")]
