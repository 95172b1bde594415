"""Data-movement kernels: reshape, transpose, concat, split, slice, pad, gather...
Where an ONNX opset moved an attribute to an input, both forms are accepted
(input first, attribute as keyword)."""

from __future__ import annotations

import math

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.types import DType


def _ints(v) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def reshape(data, shape_input=None, *, allowzero=0, shape=None):
    want = _ints(shape_input if shape_input is not None else shape)
    if not allowzero:
        want = [data.shape[i] if d == 0 else d for i, d in enumerate(want)]
    return data.reshape(want)


def flatten(x, *, axis=1):
    axis = axis + x.ndim if axis < 0 else axis
    # math.prod over the shape's ints: np.prod cost ~4 us a call, most of a classifier's
    # logits Flatten step (PP-OCR cls: 0.017 ms)
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def transpose(x, *, perm=None):
    return np.transpose(x, perm)


def squeeze(data, axes_input=None, *, axes=None):
    chosen = axes_input if axes_input is not None else axes
    if chosen is None:
        return np.squeeze(data)
    return np.squeeze(data, axis=tuple(a % data.ndim for a in _ints(chosen)))


def unsqueeze(data, axes_input=None, *, axes=None):
    chosen = _ints(axes_input if axes_input is not None else axes)
    rank = data.ndim + len(chosen)
    out = data
    for a in sorted(a % rank for a in chosen):
        out = np.expand_dims(out, a)
    return out


def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


def split(x, split_input=None, *, axis=0, split=None, num_outputs=None):
    sizes = split_input if split_input is not None else split
    axis = axis % x.ndim
    if sizes is None or np.size(sizes) == 0:
        n = int(num_outputs)
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    bounds = np.cumsum(_ints(sizes))[:-1]
    return tuple(np.split(x, bounds, axis=axis))


def slice_(data, starts, ends, axes=None, steps=None):
    """Opset >= 10 form (the frontend turns older attributes into inputs)."""
    starts = _ints(starts)
    ends = _ints(ends)
    ax = _ints(axes) if axes is not None else list(range(len(starts)))
    st = _ints(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for s, e, a, k in zip(starts, ends, ax, st):
        index[a % data.ndim] = slice(*slice(s, e, k).indices(data.shape[a % data.ndim]))
    return data[tuple(index)]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad(data, pads_input=None, constant_value=None, axes_input=None, *, mode="constant", pads=None, value=0.0):
    p = _ints(pads_input if pads_input is not None else pads)
    axes = _ints(axes_input) if axes_input is not None else list(range(data.ndim))
    n = len(axes)
    widths = [(0, 0)] * data.ndim
    for i, a in enumerate(axes):
        widths[a % data.ndim] = (p[i], p[n + i])
    # negative pads crop
    crop = tuple(slice(max(-b, 0), data.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    data = data[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        fill = value if constant_value is None or np.size(constant_value) == 0 else np.asarray(constant_value).item()
        return np.pad(data, widths, mode="constant", constant_values=np.asarray(fill).astype(data.dtype))
    return np.pad(data, widths, mode=_PAD_MODES[mode])


def gather(data, indices, *, axis=0):
    n = data.shape[axis]
    if indices.size and (int(indices.min()) < -n or int(indices.max()) >= n):
        bad = int(indices.max()) if int(indices.max()) >= n else int(indices.min())
        raise RkcError(f"Gather: index {bad} is out of range for axis {axis} of size {n}")
    idx = np.where(indices < 0, indices + n, indices)
    return np.take(data, idx, axis=axis)


def shape(data, *, start=0, end=None):
    return np.array(data.shape[slice(start, end)], dtype=np.int64)


def size(data):
    return np.array(data.size, dtype=np.int64)


def constant_of_shape(shape_input, *, value=0.0, dtype="fp32"):
    return np.full(_ints(shape_input), value, dtype=DType(dtype).numpy)


def expand(x, shape_input):
    want = _ints(shape_input)
    target = np.broadcast_shapes(x.shape, tuple(want))
    return np.broadcast_to(x, target).copy()


def tile(x, repeats):
    return np.tile(x, _ints(repeats))


def depth_to_space(x, *, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def space_to_depth(x, *, blocksize):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


def relayout(*inputs, scale=1.0):
    """Elements of the sources (their row-major elements one after the other) at an
    index map of the result's shape, times `scale` where it is not 1: the data
    movement between NPU buffers that compiler/relayout.py composes into one map.
    Several results of one step: `scale` is a list of one factor per result, and the
    last len(scale) inputs are their index maps."""
    several = isinstance(scale, (list, tuple))
    scales = scale if several else [scale]
    sources, indexes = inputs[:-len(scales)], inputs[-len(scales):]
    flat = np.concatenate([np.asarray(s).reshape(-1) for s in sources])
    outs = []
    for index, factor in zip(indexes, scales):
        out = flat[np.asarray(index, np.int64)]
        outs.append(out if factor == 1.0 else (out.astype(np.float32) * np.float32(factor)).astype(out.dtype))
    return tuple(outs) if several else outs[0]


KERNELS = {
    "Reshape": reshape, "Flatten": flatten, "Transpose": transpose, "Squeeze": squeeze, "Unsqueeze": unsqueeze,
    "Concat": concat, "Split": split, "Slice": slice_, "Pad": pad, "Gather": gather, "Shape": shape,
    "Size": size, "ConstantOfShape": constant_of_shape, "Expand": expand, "Tile": tile,
    "DepthToSpace": depth_to_space, "SpaceToDepth": space_to_depth, "Relayout": relayout,
}
