"""Shape-rule building blocks shared by the op families. A rule maps an
OpContext to the output TensorTypes; unknown dimensions stay symbolic."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rkc.ir.errors import VerifyError
from rkc.ir.npu.geometry import pads_for
from rkc.ir.types import Dim, DType, TensorType

UNKNOWN = "unk"


def need(ctx, i: int = 0) -> TensorType:
    t = ctx.type(i)
    if t is None:
        raise VerifyError(f"op {ctx.op.describe()}: input {i} is required")
    return t


def broadcast_shapes(shapes: Sequence[Sequence[Dim]], what: str) -> tuple[Dim, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for dims in zip(*[(1,) * (rank - len(s)) + tuple(s) for s in shapes]):
        ints = {d for d in dims if isinstance(d, int) and d != 1}
        syms = sorted({d for d in dims if isinstance(d, str)})
        if len(ints) > 1:
            raise VerifyError(f"{what}: shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(ints.pop() if ints else (syms[0] if syms else 1))
    return tuple(out)


def same(ctx) -> list[TensorType]:
    t = need(ctx)
    return [TensorType(t.dtype, t.shape)]


def same_n(ctx) -> list[TensorType]:
    """One output per op output, all like input 0."""
    t = need(ctx)
    return [TensorType(t.dtype, t.shape)] * len(ctx.op.outputs)


def broadcast(ctx) -> list[TensorType]:
    types = [t for t in (ctx.type(i) for i in range(ctx.n_inputs)) if t is not None]
    return [TensorType(types[0].dtype, broadcast_shapes([t.shape for t in types], f"op {ctx.op.describe()}"))]


def with_dtype(dtype: DType, shape: Sequence[Dim]) -> TensorType:
    return TensorType(dtype, tuple(shape))


def ints(v) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def const_or_attr(ctx, index: int, attr: str) -> list[int] | None:
    """An int list given either as constant input `index` or attribute `attr`."""
    value = ctx.const(index)
    if value is not None:
        return ints(value)
    if ctx.has(index):
        return None  # a runtime value: not known at compile time
    a = ctx.attr(attr)
    return None if a is None else [int(x) for x in a]


def runtime_value(ctx, *indices: int) -> bool:
    """True when one of these inputs is given but is not a constant: the rule
    cannot know the output shape, and the ONNX-declared type stands."""
    return any(ctx.has(i) and ctx.const(i) is None for i in indices)


def norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise VerifyError(f"{what}: axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def spatial_out(in_sizes: Sequence[Dim], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                pads, auto_pad: str, ceil_mode: int = 0) -> list[Dim]:
    """Output spatial sizes of a convolution or pooling window."""
    if any(isinstance(d, str) for d in in_sizes):
        return [UNKNOWN] * len(in_sizes)
    begin, end = pads_for(auto_pad, in_sizes, kernel, strides, dilations, pads)
    out: list[Dim] = []
    for i, k, s, d, b, e in zip(in_sizes, kernel, strides, dilations, begin, end):
        span = i + b + e - ((k - 1) * d + 1)
        if span < 0:
            raise VerifyError(f"window {kernel} does not fit input {list(in_sizes)}")
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= i + b:
            o -= 1
        out.append(o)
    return out


MAX_WINDOW = 1 << 16  # kernel, stride, dilation and pad values past this describe no real model


def window_params(ctx, kernel: Sequence[int]) -> tuple[list[int], list[int]]:
    """(strides, dilations), with the kernel, strides, dilations and pads checked:
    one value per spatial axis, kernels/strides/dilations in 1..MAX_WINDOW, pads
    in 0..MAX_WINDOW."""
    n = len(kernel)
    strides = [int(s) for s in ctx.attr("strides", [1] * n)]
    dilations = [int(d) for d in ctx.attr("dilations", [1] * n)]
    pads = [int(p) for p in ctx.attr("pads", [0] * 2 * n)]
    what = f"op {ctx.op.describe()}"
    for name, values, count, lo in (("kernel_shape", kernel, n, 1), ("strides", strides, n, 1),
                                    ("dilations", dilations, n, 1), ("pads", pads, 2 * n, 0)):
        if len(values) != count:
            raise VerifyError(f"{what}: {name} {list(values)} has {len(values)} values, the window needs {count}")
        if any(not lo <= v <= MAX_WINDOW for v in values):
            raise VerifyError(f"{what}: {name} {list(values)} outside {lo}..{MAX_WINDOW}")
    return strides, dilations
