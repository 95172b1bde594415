"""Resize (nearest by an integer factor on the NPU; nearest, linear, cubic on the CPU)."""

from __future__ import annotations

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.ops import NpuLowering, OpSpec
from rkc.compiler.ops.constraints import BASIC
from rkc.compiler.ops.rules import need, runtime_value
from rkc.ir.errors import VerifyError
from rkc.ir.types import TensorType
from rkc.runtime.kernels import nn


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


def nearest_factor(ctx) -> int | None:
    """k when the Resize is nearest upsampling by an integer k >= 2 in height and width
    that samples pixel y for outputs k*y .. k*y + k - 1 (the ONNX source indices,
    worked out by the CPU kernel's own rule, are y // k), else None."""
    x, y = need(ctx).shape, ctx.out_type().shape
    if (len(x) != 4 or ctx.attr("mode", "nearest") != "nearest" or ctx.attr("axes")
            or not all(isinstance(d, int) for d in (*x, *y)) or tuple(y[:2]) != tuple(x[:2])):
        return None
    k = y[2] // x[2]
    if k < 2 or tuple(y[2:]) != (k * x[2], k * x[3]):
        return None
    if ctx.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        return None
    scales, sizes = ctx.const(2), ctx.const(3)
    if all(v is None or not np.size(v) for v in (scales, sizes)):  # run-time scales: nothing to check here
        return None
    picks = nn.nearest_picks(x, ctx.const(1), scales, sizes, **ctx.op.attrs)
    blocks = {axis: np.arange(k * x[axis]) // k for axis in (2, 3)}
    if set(picks) != {2, 3} or any(not np.array_equal(picks[a], blocks[a]) for a in (2, 3)):
        return None
    return k


def nearest_by_integer_factor(ctx) -> bool:
    """the NPU upsamples by an integer factor k in height and width, nearest, sampling pixel y for outputs
    k*y .. k*y + k - 1 (asymmetric + floor, or half_pixel + round_prefer_*; x2 also asymmetric +
    round_prefer_floor); other resizes run on the feature map in place on the CPU"""
    return nearest_factor(ctx) is not None


SPECS = [OpSpec("Resize", resize_shape, npu=(*BASIC, nearest_by_integer_factor), lower=NpuLowering(api.Upsample),
                cpu=(no_antialias,), summary="resize: nearest by an integer factor (NPU: convolutions of ones); nearest, "
                                             "linear, cubic (CPU)")]
