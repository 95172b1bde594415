"""Reductions. `axes` is an attribute before opset 18 and an input from 18 on;
both are accepted."""

from __future__ import annotations

import numpy as np


def _extreme(fn, low: bool):
    """max/min with ONNX's identities for an empty reduction (-inf/+inf, the
    integer limits, False/True)."""
    def reduce(x, axis, keepdims):
        if x.dtype == np.bool_:
            initial = not low
        elif x.dtype.kind == "f":
            initial = -np.inf if low else np.inf
        else:
            initial = np.iinfo(x.dtype).min if low else np.iinfo(x.dtype).max
        return fn(x, axis=axis, keepdims=keepdims, initial=initial)
    return reduce


def _reducer(fn, float_acc: bool = True):
    def kernel(data, axes_input=None, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        chosen = axes_input if axes_input is not None else axes
        if chosen is None or np.size(chosen) == 0:
            if noop_with_empty_axes:
                return data
            chosen = range(data.ndim)
        ax = tuple(int(a) % data.ndim for a in np.asarray(chosen).reshape(-1))
        src = data.astype(np.float64) if float_acc and data.dtype.kind == "f" else data
        with np.errstate(divide="ignore"):
            return np.asarray(fn(src, axis=ax, keepdims=bool(keepdims))).astype(data.dtype)
    return kernel


def _sum_square(x, axis, keepdims):
    return np.sum(np.square(x), axis=axis, keepdims=keepdims)


def _l2(x, axis, keepdims):
    return np.sqrt(np.sum(np.square(x), axis=axis, keepdims=keepdims))


def _l1(x, axis, keepdims):
    return np.sum(np.abs(x), axis=axis, keepdims=keepdims)


KERNELS = {
    "ReduceMean": _reducer(np.mean), "ReduceSum": _reducer(np.sum), "ReduceMax": _reducer(_extreme(np.max, True), False),
    "ReduceMin": _reducer(_extreme(np.min, False), False), "ReduceProd": _reducer(np.prod),
    "ReduceSumSquare": _reducer(_sum_square), "ReduceL2": _reducer(_l2), "ReduceL1": _reducer(_l1),
}
