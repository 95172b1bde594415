"""Dense layers, normalisations, softmax and resizing."""

from __future__ import annotations

import math

import numpy as np


def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX names
    a = a.T if transA else a
    b = b.T if transB else b
    y = np.matmul(a, b)
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype)
    if c is not None:
        y = y + (c * np.asarray(beta, c.dtype) if beta != 1.0 else c)
    return y.astype(a.dtype, copy=False)


def matmul(a, b):
    return np.matmul(a, b)


def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    az = 0.0 if a_zero_point is None else np.asarray(a_zero_point, np.float64)
    if np.ndim(az) == 1 and a.ndim >= 2 and np.size(az) > 1:  # per-row zero points
        az = az.reshape(-1, 1)
    bz = 0.0 if b_zero_point is None else np.asarray(b_zero_point, np.float64)
    return np.matmul(a.astype(np.float64) - az, b.astype(np.float64) - bz).astype(np.int32)


def softmax(x, *, axis=-1):
    if x.dtype == np.float32 and x.ndim and axis % x.ndim == x.ndim - 1 and x.shape[-1] and x.flags.c_contiguous:
        from rkc.runtime.kernels import softmax_jit  # numba: loaded by programs with a softmax on the host

        return softmax_jit.softmax_rows(x)  # one compiled pass a row (attention's 2x400x400: 0.53 -> ~0.15 ms)
    # float32 (or float64) throughout: numpy's float32 exp is vectorised and float64's cost 6x (a
    # detector's 2x400x400 attention scores: 3.5 -> 0.6 ms); each term is <= 1, so the float32 sum
    # loses only rounding (relative error ~1e-6, tests/runtime/test_host_kernels.py)
    work = np.float64 if x.dtype == np.float64 else np.float32
    e = np.asarray(x, work) - x.max(axis=axis, keepdims=True).astype(work)
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e.astype(x.dtype, copy=False)


def scaled_softmax(x, *, scale=1.0):
    """Softmax over the last axis of scale * x: attention's probabilities P, one step where
    the compiler fuses the scale into the softmax (compiler/program_steps.py; on the NPU's
    buffers: runtime/kernels/softmax_jit.py)."""
    return softmax(x * np.asarray(scale, x.dtype), axis=-1)


def softmax_transpose(x, *, scale=1.0):
    """scaled_softmax with the last two axes swapped: P as the run-time B (P^T) of the
    product that weighs the values."""
    return np.swapaxes(scaled_softmax(x, scale=scale), -1, -2)


def log_softmax(x, *, axis=-1):
    xd = x.astype(np.float64)
    s = xd - xd.max(axis=axis, keepdims=True)
    return (s - np.log(np.exp(s).sum(axis=axis, keepdims=True))).astype(x.dtype)


def _over(v, shape: tuple, n: int) -> np.ndarray:
    """`v` broadcast over `shape` as n contiguous float64 values (np.broadcast_to costs ~10 us)."""
    v = np.asarray(v)
    if v.shape == shape:
        return v.astype(np.float64).reshape(n)
    full = np.empty(shape)
    full[...] = v  # (raises where v does not broadcast)
    return full.reshape(n)


def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Over the axes from `axis` on, in float64 (norm_jit: one compiled pass a row)."""
    from rkc.runtime.kernels.norm_jit import layer_norm_rows  # numba: loaded by programs with a host LayerNorm

    axis = axis % x.ndim
    lead, norm = x.shape[:axis], x.shape[axis:]
    n, rows = math.prod(norm), math.prod(lead)
    direct = x.dtype in (np.float32, np.float64)  # written straight; other floats rounded once from float64
    x2 = np.ascontiguousarray(x if direct else x.astype(np.float64)).reshape(rows, n)
    weights = _over(scale, norm, n)
    bias = np.zeros(n) if b is None else _over(b, norm, n)
    out = np.empty((rows, n), x2.dtype)
    mean, inv_std = np.empty(rows), np.empty(rows)
    if n:
        layer_norm_rows(x2, weights, bias, float(epsilon), out, mean, inv_std)
    else:  # an empty row's mean, as numpy's
        mean[:] = inv_std[:] = np.nan
    stats_shape = lead + (1,) * len(norm)
    y = (out if direct else out.astype(x.dtype)).reshape(x.shape)
    return y, mean.astype(np.float32).reshape(stats_shape), inv_std.astype(np.float32).reshape(stats_shape)


def batch_normalization(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, training_mode=0):
    if training_mode:
        raise ValueError("BatchNormalization in training mode")
    shape = (1, -1) + (1,) * (x.ndim - 2)
    k = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)).reshape(shape)
    y = (x - mean.reshape(shape)) * k + b.reshape(shape)
    return y.astype(x.dtype)


def instance_normalization(x, scale, b, *, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True)
    var = xd.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((xd - mean) / np.sqrt(var + epsilon) * scale.reshape(shape) + b.reshape(shape)).astype(x.dtype)


# -- Resize ---------------------------------------------------------------------
def _source_coordinate(mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """Where each output index samples the input (ONNX Resize
    coordinate_transformation_mode). The formulas use the real-valued output
    length scale * in_len; `out_len` (its integer size) only counts the samples."""
    x = np.arange(out_len, dtype=np.float64)
    out_int, out_len = out_len, scale * in_len
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_int / out_len
        offset = in_len / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_int)
    if mode == "align_corners":
        return x * (in_len - 1) / (out_len - 1) if out_len != 1 else np.zeros(out_int)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            return start * (in_len - 1) + x * (end - start) * (in_len - 1) / (out_len - 1)
        return np.full(out_int, 0.5 * (start + end) * (in_len - 1))
    raise ValueError(f"Resize coordinate_transformation_mode={mode!r}")


_NEAREST = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _taps(mode: str, src: np.ndarray, in_len: int, nearest_mode: str, cubic_a: float, exclude_outside: int):
    """(indices [out, taps], weights [out, taps]) for one axis; indices clamped to
    the input (ONNX pads with edge values)."""
    if mode == "nearest":
        idx = _NEAREST[nearest_mode](src)[:, None]
        w = np.ones_like(idx)
    elif mode == "linear":
        base = np.floor(src)
        frac = src - base
        idx = np.stack([base, base + 1], axis=1)
        w = np.stack([1 - frac, frac], axis=1)
    elif mode == "cubic":
        base = np.floor(src)
        frac = (src - base)[:, None]
        idx = base[:, None] + np.arange(-1, 3)[None, :]
        d = np.abs(frac - np.arange(-1, 3)[None, :])
        a = cubic_a
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                     np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
        if exclude_outside:
            w = np.where((idx >= 0) & (idx < in_len), w, 0.0)
            w = w / w.sum(axis=1, keepdims=True)
    else:
        raise ValueError(f"Resize mode={mode!r}")
    return np.clip(idx, 0, in_len - 1).astype(np.int64), w


# dtypes the compiled 2-D gather copies
_GATHERED = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.int32, np.float16, np.float32,
                                            np.float64))


def _geometry(shape, roi, scales, sizes, axes, keep_aspect_ratio_policy):
    """(axes, input sizes, output sizes, scales, roi as float64 or None) of a Resize."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    in_sizes = [shape[a] for a in axes]
    if sizes is not None and np.size(sizes):
        out = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            s = pick(o / i for o, i in zip(out, in_sizes))
            out = [int(np.floor(s * i + 0.5)) for i in in_sizes]
            scale = [s] * len(axes)
        else:
            scale = [o / i for o, i in zip(out, in_sizes)]
    else:
        scale = [float(s) for s in np.asarray(scales).reshape(-1)]
        out = [int(np.floor(i * s)) for i, s in zip(in_sizes, scale)]
    roi_v = None if roi is None or not np.size(roi) else np.asarray(roi, np.float64).reshape(-1)
    return axes, in_sizes, out, scale, roi_v


def nearest_picks(shape, roi=None, scales=None, sizes=None, *, axes=None, coordinate_transformation_mode="half_pixel",
                  keep_aspect_ratio_policy="stretch", nearest_mode="round_prefer_floor", **_) -> dict[int, np.ndarray]:
    """A nearest Resize (not tf_crop_and_resize) of a `shape` tensor as the input index
    each output index takes, for every axis it changes (axis -> int64 indices)."""
    axes, in_sizes, out, scale, roi_v = _geometry(shape, roi, scales, sizes, axes, keep_aspect_ratio_policy)
    picks = {}
    for k, axis in enumerate(axes):
        r = (0.0, 1.0) if roi_v is None else (roi_v[k], roi_v[len(axes) + k])
        src = _source_coordinate(coordinate_transformation_mode, out[k], in_sizes[k], scale[k], r)
        idx, _ = _taps("nearest", src, in_sizes[k], nearest_mode, -0.75, 0)
        if not np.array_equal(idx[:, 0], np.arange(shape[axis])):
            picks[axis] = idx[:, 0]
    return picks


def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
           mode="nearest", nearest_mode="round_prefer_floor"):
    if antialias:
        raise ValueError("Resize antialias=1")
    if mode == "nearest" and coordinate_transformation_mode != "tf_crop_and_resize":
        # each output is one input value: gathered as they are, in x's dtype (exact; no
        # float64 round trip, which made YOLO's and PP-OCR's upsampling a CPU hot spot)
        picks = nearest_picks(x.shape, roi, scales, sizes, axes=axes,
                              coordinate_transformation_mode=coordinate_transformation_mode,
                              keep_aspect_ratio_policy=keep_aspect_ratio_policy, nearest_mode=nearest_mode)
        if x.ndim == 4 and set(picks) <= {2, 3} and x.dtype in _GATHERED:
            from rkc.runtime.kernels import gather_jit  # numba: loaded by programs that resize on the CPU

            return gather_jit.gather_2d(x, picks.get(2, np.arange(x.shape[2])), picks.get(3, np.arange(x.shape[3])))
        y = x
        for axis, idx in picks.items():
            y = np.take(y, idx, axis=axis)
        return y
    axes, in_sizes, out, scale, roi_v = _geometry(x.shape, roi, scales, sizes, axes, keep_aspect_ratio_policy)
    y = x.astype(np.float64)
    for k, axis in enumerate(axes):
        r = (0.0, 1.0) if roi_v is None else (roi_v[k], roi_v[len(axes) + k])
        src = _source_coordinate(coordinate_transformation_mode, out[k], in_sizes[k], scale[k], r)
        idx, w = _taps(mode, src, in_sizes[k], nearest_mode, cubic_coeff_a, exclude_outside)
        taken = np.take(y, idx.reshape(-1), axis=axis)
        shape = list(y.shape)
        shape[axis:axis + 1] = [out[k], idx.shape[1]]
        taken = taken.reshape(shape)
        wshape = [1] * len(shape)
        wshape[axis:axis + 2] = list(w.shape)
        y = (taken * w.reshape(wshape)).sum(axis=axis + 1)
        if coordinate_transformation_mode == "tf_crop_and_resize":
            outside = (src < 0) | (src > in_sizes[k] - 1)
            mshape = [1] * y.ndim
            mshape[axis] = out[k]
            y = np.where(outside.reshape(mshape), extrapolation_value, y)
    if x.dtype.kind in "iu":
        y = np.clip(np.rint(y), np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
    return y.astype(x.dtype)


KERNELS = {
    "Gemm": gemm, "MatMul": matmul, "MatMulInteger": matmul_integer, "Softmax": softmax,
    "ScaledSoftmax": scaled_softmax, "SoftmaxTranspose": softmax_transpose,
    "LogSoftmax": log_softmax, "LayerNormalization": layer_normalization,
    "BatchNormalization": batch_normalization, "InstanceNormalization": instance_normalization,
    "Resize": resize,
}
