"""Reductions (CPU; a ReduceMean over H and W is a global average pool and is
rewritten to one by canonicalize)."""

from __future__ import annotations

from rkc.compiler.ops import OpSpec
from rkc.compiler.ops.constraints import cpu_only
from rkc.compiler.ops.rules import const_or_attr, need, norm_axis, runtime_value
from rkc.ir.types import TensorType


def reduce_shape(ctx):
    x = need(ctx)
    rank = len(x.shape)
    axes = const_or_attr(ctx, 1, "axes")
    keep = bool(ctx.attr("keepdims", 1))
    if runtime_value(ctx, 1):
        return None
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return [TensorType(x.dtype, x.shape)]
        axes = list(range(rank))
    axes = {norm_axis(a, rank, f"op {ctx.op.describe()}") for a in axes}
    shape = [1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes]
    return [TensorType(x.dtype, tuple(shape))]


REDUCTION = cpu_only("reductions other than a global average pool run on the CPU")

SPECS = [OpSpec(name, reduce_shape, npu=(REDUCTION,), summary=f"{name[6:].lower()} over axes")
         for name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
                      "ReduceSumSquare", "ReduceL1")]
