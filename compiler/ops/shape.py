"""Data movement: reshape-like views, transpose, concat, split, slice, pad,
gather and shape computation. Most of these are value-dependent shape rules
(they read constant inputs)."""

from __future__ import annotations

import numpy as np

from rkc.compiler.ops import OpSpec
from rkc.compiler.ops.constraints import cpu_only
from rkc.compiler.ops.rules import UNKNOWN, broadcast_shapes, const_or_attr, ints, need, norm_axis, runtime_value
from rkc.ir.errors import VerifyError
from rkc.ir.types import DType, TensorType

MOVES_DATA = cpu_only("rearranges data in memory: rkc moves data on the CPU (the NPU has no data-movement unit rkc drives yet)")


def _static_numel(shape) -> int | None:
    return int(np.prod(shape, dtype=np.int64)) if all(isinstance(d, int) for d in shape) else None


def reshape_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1):
        return None
    want = const_or_attr(ctx, 1, "shape")
    if want is None:
        raise VerifyError(f"op {ctx.op.describe()}: the target shape must be a constant")
    if not ctx.attr("allowzero", 0):
        want = [x.shape[i] if d == 0 else d for i, d in enumerate(want)]
    if -1 in want:
        total = _static_numel(x.shape)
        rest = _static_numel([d for d in want if d != -1])
        if total is None or rest is None:
            return [TensorType(x.dtype, tuple(UNKNOWN if d == -1 else d for d in want))]
        want = [total // rest if d == -1 and rest else d for d in want]
    total = _static_numel(x.shape)
    if total is not None and _static_numel(want) is not None and total != _static_numel(want):
        raise VerifyError(f"op {ctx.op.describe()}: cannot reshape {list(x.shape)} to {want}")
    return [TensorType(x.dtype, tuple(want))]


def flatten_shape(ctx):
    x = need(ctx)
    rank = len(x.shape)
    axis = int(ctx.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise VerifyError(f"op {ctx.op.describe()}: axis {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    lead, tail = _static_numel(x.shape[:axis]), _static_numel(x.shape[axis:])
    return [TensorType(x.dtype, (UNKNOWN if lead is None else lead, UNKNOWN if tail is None else tail))]


def transpose_shape(ctx):
    x = need(ctx)
    perm = [int(p) for p in ctx.attr("perm", list(range(len(x.shape)))[::-1])]
    if sorted(perm) != list(range(len(x.shape))):
        raise VerifyError(f"op {ctx.op.describe()}: perm {perm} does not fit rank {len(x.shape)}")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


def squeeze_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1):
        return None
    axes = const_or_attr(ctx, 1, "axes")
    if axes is None:
        if ctx.has(1):
            raise VerifyError(f"op {ctx.op.describe()}: axes must be a constant")
        return [TensorType(x.dtype, tuple(d for d in x.shape if d != 1))]
    axes = {norm_axis(a, len(x.shape), f"op {ctx.op.describe()}") for a in axes}
    wide = [a for a in sorted(axes) if isinstance(x.shape[a], int) and x.shape[a] != 1]
    if wide:
        raise VerifyError(f"op {ctx.op.describe()}: cannot squeeze axis {wide[0]} of size {x.shape[wide[0]]}")
    return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def unsqueeze_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1):
        return None
    axes = const_or_attr(ctx, 1, "axes")
    if axes is None:
        raise VerifyError(f"op {ctx.op.describe()}: axes must be a constant")
    rank = len(x.shape) + len(axes)
    axes = sorted(norm_axis(a, rank, f"op {ctx.op.describe()}") for a in axes)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return [TensorType(x.dtype, tuple(dims))]


def concat_shape(ctx):
    types = [need(ctx, i) for i in range(ctx.n_inputs)]
    rank = len(types[0].shape)
    axis = norm_axis(int(ctx.attr("axis")), rank, f"op {ctx.op.describe()}")
    for t in types[1:]:
        if len(t.shape) != rank or any(isinstance(a, int) and isinstance(b, int) and a != b
                                       for i, (a, b) in enumerate(zip(t.shape, types[0].shape)) if i != axis):
            raise VerifyError(f"op {ctx.op.describe()}: cannot concatenate {list(types[0].shape)} and "
                              f"{list(t.shape)} along axis {axis}")
    sizes = [t.shape[axis] for t in types]
    total = sum(sizes) if all(isinstance(s, int) for s in sizes) else UNKNOWN
    shape = list(types[0].shape)
    shape[axis] = total
    return [TensorType(types[0].dtype, tuple(shape))]


def split_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1):
        return None
    what = f"op {ctx.op.describe()}"
    axis = norm_axis(int(ctx.attr("axis", 0)), len(x.shape), what)
    sizes = const_or_attr(ctx, 1, "split")
    n = len(ctx.op.outputs)
    dim = x.shape[axis]
    if sizes is None or (not sizes and not ctx.has(1)):  # an equal split (a split input, even empty, is sizes)
        parts = int(ctx.attr("num_outputs", n))
        if parts != n:
            raise VerifyError(f"{what}: num_outputs {parts}, but the op has {n} outputs")
        if not isinstance(dim, int):
            sizes = [UNKNOWN] * n
        else:
            chunk = -(-dim // n)
            sizes = [min(chunk, dim - i * chunk) for i in range(n)]
            if sizes[-1] <= 0:
                raise VerifyError(f"{what}: axis {axis} of size {dim} cannot be split into {n} parts")
    else:
        check_split(sizes, n, dim, axis, what)
    out = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        out.append(TensorType(x.dtype, tuple(shape)))
    return out


def check_split(sizes: list[int], n: int, dim, axis: int, what: str) -> None:
    """Split sizes that cut the axis into exactly the op's outputs."""
    if len(sizes) != n:
        raise VerifyError(f"{what}: {len(sizes)} split sizes for {n} outputs")
    if any(s < 0 for s in sizes):
        raise VerifyError(f"{what}: split sizes {sizes} include a negative size")
    if isinstance(dim, int) and sum(sizes) != dim:
        raise VerifyError(f"{what}: split sizes {sizes} sum to {sum(sizes)}, but axis {axis} has size {dim}")


def check_indices(indices: np.ndarray, dim, axis: int, what: str) -> None:
    """Constant indices inside [-dim, dim) of the axis they index (ONNX's range: negatives count from the end)."""
    if not isinstance(dim, int) or indices.size == 0:
        return
    lo, hi = int(indices.min()), int(indices.max())
    if lo < -dim or hi >= dim:
        bad = hi if hi >= dim else lo
        raise VerifyError(f"{what}: index {bad} is out of range for axis {axis} of size {dim}")


def slice_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1, 2, 3, 4):
        return None
    starts, ends = ctx.const(1), ctx.const(2)
    if starts is None or ends is None or (ctx.has(3) and ctx.const(3) is None) or (ctx.has(4) and ctx.const(4) is None):
        raise VerifyError(f"op {ctx.op.describe()}: starts, ends, axes and steps must be constants")
    starts, ends = [int(v) for v in starts.reshape(-1)], [int(v) for v in ends.reshape(-1)]
    axes = [int(v) for v in ctx.const(3).reshape(-1)] if ctx.has(3) else list(range(len(starts)))
    steps = [int(v) for v in ctx.const(4).reshape(-1)] if ctx.has(4) else [1] * len(starts)
    what = f"op {ctx.op.describe()}"
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise VerifyError(f"{what}: starts, ends, axes and steps have {len(starts)}, {len(ends)}, {len(axes)} and "
                          f"{len(steps)} entries (one each per sliced axis)")
    if len({norm_axis(a, len(x.shape), what) for a in axes}) != len(axes):
        raise VerifyError(f"{what}: axes {axes} name an axis twice")
    shape = list(x.shape)
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = norm_axis(a, len(shape), what)
        if k == 0:
            raise VerifyError(f"op {ctx.op.describe()}: slice step 0")
        shape[a] = len(range(*slice(s, e, k).indices(shape[a]))) if isinstance(shape[a], int) else UNKNOWN
    return [TensorType(x.dtype, tuple(shape))]


def pad_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1, 3):
        return None
    pads = const_or_attr(ctx, 1, "pads")
    if pads is None:
        raise VerifyError(f"op {ctx.op.describe()}: pads must be a constant")
    rank = len(x.shape)
    axes = [norm_axis(int(a), rank, "Pad") for a in ctx.const(3).reshape(-1)] if ctx.has(3) else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise VerifyError(f"op {ctx.op.describe()}: {len(pads)} pads for {len(axes)} axes (two each)")
    shape = list(x.shape)
    for i, a in enumerate(axes):
        if isinstance(shape[a], int):
            size = shape[a] + pads[i] + pads[len(axes) + i]
            if size < 0:
                raise VerifyError(f"op {ctx.op.describe()}: pads {pads} crop axis {a} of size {shape[a]} to {size}")
            shape[a] = size
    return [TensorType(x.dtype, tuple(shape))]


def gather_shape(ctx):
    x, idx = need(ctx, 0), need(ctx, 1)
    axis = norm_axis(int(ctx.attr("axis", 0)), len(x.shape), f"op {ctx.op.describe()}")
    indices = ctx.const(1)
    if indices is not None:  # a runtime index is checked when the kernel runs (runtime/kernels/shape.py)
        check_indices(np.asarray(indices), x.shape[axis], axis, f"op {ctx.op.describe()}")
    return [TensorType(x.dtype, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]))]


def shape_shape(ctx):
    rank = len(need(ctx).shape)
    start, end = int(ctx.attr("start", 0)), ctx.attr("end")
    return [TensorType(DType.INT64, (len(range(rank)[slice(start, None if end is None else int(end))]),))]


def constant_of_shape_shape(ctx):
    dims = ctx.const(0)
    dtype = DType(ctx.attr("dtype", "fp32"))
    if dims is None:
        return [TensorType(dtype, tuple([UNKNOWN] * (need(ctx).shape[0] if need(ctx).shape else 0)))]
    return [TensorType(dtype, tuple(int(d) for d in dims.reshape(-1)))]


def expand_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1):
        return None
    want = ctx.const(1)
    if want is None:
        raise VerifyError(f"op {ctx.op.describe()}: the target shape must be a constant")
    return [TensorType(x.dtype, broadcast_shapes([x.shape, [int(d) for d in want.reshape(-1)]],
                                                 f"op {ctx.op.describe()}"))]


def tile_shape(ctx):
    x = need(ctx)
    if runtime_value(ctx, 1):
        return None
    reps = ctx.const(1)
    if reps is None:
        raise VerifyError(f"op {ctx.op.describe()}: repeats must be a constant")
    if reps.size != len(x.shape) or (reps < 0).any():
        raise VerifyError(f"op {ctx.op.describe()}: repeats {ints(reps)} must be {len(x.shape)} counts >= 0 "
                          f"(one per axis)")
    return [TensorType(x.dtype, tuple(d * int(r) if isinstance(d, int) else UNKNOWN
                                      for d, r in zip(x.shape, reps.reshape(-1))))]


def _blocks(ctx, dims: dict[str, object]) -> int:
    """blocksize >= 1 dividing each named dimension (DepthToSpace: C by b^2; SpaceToDepth: H and W by b)."""
    b = int(ctx.attr("blocksize"))
    if b < 1:
        raise VerifyError(f"op {ctx.op.describe()}: blocksize {b} must be >= 1")
    for name, (d, by) in dims.items():
        if isinstance(d, int) and d % by(b):
            raise VerifyError(f"op {ctx.op.describe()}: blocksize {b} does not fit {name} {d}")
    return b


def depth_to_space_shape(ctx):
    x = need(ctx)
    if len(x.shape) != 4:
        raise VerifyError(f"op {ctx.op.describe()}: the input must be 4-D (NCHW), not {list(x.shape)}")
    n, c, h, w = x.shape
    b = _blocks(ctx, {"channels": (c, lambda b: b * b)})
    return [TensorType(x.dtype, (n, c // (b * b), h * b, w * b))]


def space_to_depth_shape(ctx):
    x = need(ctx)
    if len(x.shape) != 4:
        raise VerifyError(f"op {ctx.op.describe()}: the input must be 4-D (NCHW), not {list(x.shape)}")
    n, c, h, w = x.shape
    b = _blocks(ctx, {"height": (h, lambda b: b), "width": (w, lambda b: b)})
    return [TensorType(x.dtype, (n, c * b * b, h // b, w // b))]


SPECS = [
    OpSpec("Reshape", reshape_shape, npu=(MOVES_DATA,), summary="reshape (shape from a constant)"),
    OpSpec("Flatten", flatten_shape, npu=(MOVES_DATA,), summary="flatten to 2-D"),
    OpSpec("Squeeze", squeeze_shape, npu=(MOVES_DATA,), summary="drop size-1 axes"),
    OpSpec("Unsqueeze", unsqueeze_shape, npu=(MOVES_DATA,), summary="insert size-1 axes"),
    OpSpec("Transpose", transpose_shape, npu=(MOVES_DATA,), summary="permute axes"),
    OpSpec("Concat", concat_shape, npu=(MOVES_DATA,), summary="concatenate along an axis"),
    OpSpec("Split", split_shape, npu=(MOVES_DATA,), summary="split along an axis"),
    OpSpec("Slice", slice_shape, npu=(MOVES_DATA,), summary="strided slice (constant bounds)"),
    OpSpec("Pad", pad_shape, npu=(MOVES_DATA,), summary="pad (constant, reflect, edge, wrap)"),
    OpSpec("Gather", gather_shape, npu=(MOVES_DATA,), summary="gather along an axis"),
    OpSpec("Shape", shape_shape, npu=(MOVES_DATA,), summary="shape as a tensor (folded when static)"),
    OpSpec("Size", lambda ctx: [TensorType(DType.INT64, ())], npu=(MOVES_DATA,), summary="element count"),
    OpSpec("ConstantOfShape", constant_of_shape_shape, npu=(MOVES_DATA,), summary="filled tensor (folded)"),
    OpSpec("Expand", expand_shape, npu=(MOVES_DATA,), summary="broadcast to a shape"),
    OpSpec("Tile", tile_shape, npu=(MOVES_DATA,), summary="repeat along axes"),
    OpSpec("DepthToSpace", depth_to_space_shape, npu=(MOVES_DATA,), summary="depth to space"),
    OpSpec("SpaceToDepth", space_to_depth_shape, npu=(MOVES_DATA,), summary="space to depth"),
]
