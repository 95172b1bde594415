"""Resize (nearest, linear, cubic on the CPU)."""

from __future__ import annotations

import numpy as np

from rkc.compiler.ops import OpSpec
from rkc.compiler.ops.constraints import cpu_only
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


SPECS = [OpSpec("Resize", resize_shape, npu=(cpu_only("no documented NPU upsampling (hardware question Q24): "
                                                        "nearest runs on the feature map in place on the CPU"),),
                cpu=(no_antialias,), summary="resize: nearest, linear, cubic")]
