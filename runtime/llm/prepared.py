"""Prepared forms of the LLM CPU kernels (runtime/llm/kernels.py) for the
load-time plans (runtime/plan.py): what a step's attributes and constant
inputs fix is worked out once at load, and each call does only the per-token
arithmetic, in the order the plain kernel does it (the plans' logits are the
interpreter's, bit for bit: tests/llm/test_plan.py).

A binder takes (step, constant inputs by position or None, generation state)
and returns a function of the input list that returns the output list. Ops
without a binder here run their plain kernel."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.program import Step
from rkc.runtime.constants import constant_bytes
from rkc.runtime.kernels.hadamard import RowRotation, unrotate
from rkc.runtime.llm.kernels import packed_view, rotation_of

Prepared = Callable[[list], list]
_GELU_C = np.float32(np.sqrt(2.0 / np.pi))
_GELU_K = np.float32(0.044715)
F32 = np.float32


def _dense(w):
    return w.dense() if hasattr(w, "dense") else w


def rms_norm(step: Step, consts: list, state) -> Prepared | None:
    """As kernels.rms_norm, with np.mean's own steps called directly (its
    float32 sum over the last axis, then a true divide by the count as an
    intp, as numpy's _mean does): the same bits without its Python layers."""
    weight = consts[1]
    if weight is None:
        return None
    w = _dense(weight)
    eps = F32(step.attrs["epsilon"])
    add_reduce, divide, sqrt, multiply, empty_like = np.add.reduce, np.true_divide, np.sqrt, np.multiply, np.empty_like
    count = np.intp(w.shape[-1])

    def run(inputs):
        x = inputs[0].astype(F32, copy=False)
        sq = multiply(x, x, order="C")  # C order, as kernels.rms_norm: the sum's order is the layout's
        ms = add_reduce(sq, axis=-1, dtype=F32, keepdims=True)
        divide(ms, count, out=ms, casting="unsafe")
        ms += eps
        sqrt(ms, out=ms)
        out = empty_like(x)  # in x's memory order, as the plain kernel's result: later sums follow it
        divide(x, ms, out=out)
        multiply(out, w, out=out)
        return [out]
    return run


class _RopeTables:
    """cos/sin of one RoPE form at the positions of the current run, shared
    by every layer's q and k (recomputed when the positions change)."""

    def __init__(self, theta: np.ndarray, scale: float) -> None:
        self.theta, self.scale = theta, scale
        self.key: bytes | None = None
        self.cos = self.sin = None

    def at(self, pos: np.ndarray):
        key = pos.tobytes()
        if key != self.key:
            ang = (pos.astype(np.float64) * self.scale)[:, None] * self.theta[None, :]
            self.cos = np.cos(ang).astype(F32)[:, None, :]
            self.sin = np.sin(ang).astype(F32)[:, None, :]
            self.key = key
        return self.cos, self.sin


def rope(step: Step, consts: list, state) -> Prepared | None:
    a = step.attrs
    d = int(a["dims"])
    if len(consts) > 2 and consts[2] is None:
        return None  # frequency factors computed at run time: the plain kernel
    theta = np.float64(a["base"]) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if len(consts) > 2:
        theta = theta / _dense(consts[2]).astype(np.float64)
    forms = state.__dict__.setdefault("_rope_tables", {})
    key = (theta.tobytes(), float(a["scale"]))
    tables = forms.get(key)
    if tables is None:
        tables = forms[key] = _RopeTables(theta, float(a["scale"]))
    neox = a["mode"] == "neox"
    h = d // 2

    def run(inputs):
        x, pos = inputs[0], np.asarray(inputs[1])
        cos, sin = tables.at(pos)
        out = x.astype(F32, copy=True)
        if neox:
            x1, x2 = x[..., :h], x[..., h:d]
            out[..., :h] = x1 * cos - x2 * sin
            out[..., h:d] = x1 * sin + x2 * cos
        else:
            x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
            out[..., 0:d:2] = x1 * cos - x2 * sin
            out[..., 1:d:2] = x1 * sin + x2 * cos
        return [out]
    return run


def attention(step: Step, consts: list, state) -> Prepared:
    """As kernels.attention, reading the KV cache in place (no copy of the
    cache per call) and skipping the mask when every cached key is visible.
    The contractions are the plain kernel's einsums, called the same way (with
    `optimize`, numpy turns them into batched matmuls of its own choosing:
    any other formulation rounds differently)."""
    a = step.attrs
    layer, window, scale = int(a["layer"]), int(a["window"]), F32(a["scale"])
    einsum, exp, where = np.einsum, np.exp, np.where

    def run(inputs):
        q, k, v, pos = inputs
        rows = len(q)
        n = state.valid
        q, k, v, pos = q[:n], k[:n], v[:n], np.asarray(pos)[:n]
        keys, values, kpos = state.cache.store_and_view(layer, k, v, pos)
        T, H, hd = q.shape
        Hkv = keys.shape[1]
        qg = q.astype(F32, order="C").reshape(T, Hkv, H // Hkv, hd)  # as kernels._attend
        scores = einsum("tkgd,pkd->kgtp", qg, keys, optimize=True) * scale
        lo, hi, first = kpos.min(), kpos.max(), pos.min()
        if not (hi <= first and (not window or pos.max() - lo < window)):  # else every key is allowed
            allowed = kpos[None, :] <= pos[:, None]
            if window:
                allowed &= (pos[:, None] - kpos[None, :]) < window
            scores = where(allowed[None, None], scores, -np.inf)
        scores = exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        out = einsum("kgtp,pkd->tkgd", probs, values, optimize=True)
        full = np.zeros((rows, H * values.shape[-1]), F32)
        full[:n] = out.reshape(T, H * values.shape[-1])
        return [full]
    return run


def gather_packed(step: Step, consts: list, state) -> Prepared | None:
    """Embedding rows straight from the stored packed head (a constant region):
    the packed view is made once."""
    a = step.attrs
    if any(c is None for c in consts[1:]):
        return None  # a constant known only at run time: the general kernel
    rot = rotation_of(a, consts[2:])  # a rotated head's rows are rotated back
    model = state.model
    raw = constant_bytes(model, model.tensors[a["packed"]])
    if raw is None or (len(consts) > 1 and consts[1] is None):
        return None
    cols = int(a["cols"])
    try:
        view, kg, cp = packed_view(raw, int(a["rows"]), cols, np.dtype(a["dtype"]))  # made once
    except FormatError:
        return None  # the general kernel reports it
    row_scale = consts[1] if len(consts) > 1 else None

    def run(inputs):
        ids = np.asarray(inputs[0], np.int64)
        out = view[ids // kg, :, ids % kg, :].reshape(len(ids), cp)[:, :cols].astype(F32)
        if row_scale is not None:
            out *= row_scale[ids][:, None]
        return [out if rot is None else unrotate(out, rot)]
    return run


def dequantize_rows(step: Step, consts: list, state) -> Prepared | None:
    """As kernels.dequantize_rows, the float64 products done in one reused
    buffer (int32 -> float64 inside the first multiply: the same values)."""
    if int(step.attrs.get("partials", 1)) != 1:
        return None  # K split into partial sums: the general kernel (kernels.dequantize_rows) adds them
    ch = consts[2]
    if ch is None or (len(consts) > 3 and consts[3] is None):
        return None
    ch64 = ch.astype(np.float64)[None, :]
    bias = consts[3] if len(consts) > 3 else None
    f64, mul, empty_like = np.float64, np.multiply, np.empty_like
    wide: dict = {}  # (accumulator shape, strides) -> its float64 buffer, in its memory order

    def run(inputs):
        acc, row_scale = inputs[0], inputs[1]
        key = (acc.shape, acc.strides)
        y = wide.get(key)
        if y is None:
            y = wide[key] = empty_like(acc, f64)
        mul(acc, row_scale.astype(f64)[:, None], out=y)
        mul(y, ch64, out=y)
        if bias is not None:
            y += bias
        out = empty_like(acc, F32)  # a new array (it may be the program's output), in acc's order
        out[...] = y
        return [out]
    return run


def quantize_rows(step: Step, consts: list, state) -> Prepared | None:
    """As kernels.quantize_rows_kernel (weights.quantize_rows): the rotation
    through a RowRotation and the rounding in buffers made once per row count."""
    if any(c is None for c in consts[1:]):
        return None
    rot = rotation_of(step.attrs, consts[1:])
    prepared: dict = {}  # rows -> (rotation or None, float32 work buffer)
    absolute, divide, rint, clip, where, empty = np.abs, np.divide, np.rint, np.clip, np.where, np.empty

    def run(inputs):
        x = np.asarray(inputs[0], F32)
        p = prepared.get(x.shape)
        if p is None:
            p = prepared[x.shape] = (None if rot is None else RowRotation(rot, len(x)), empty(x.shape, F32))
        rotation, t = p
        if rotation is not None:
            x = rotation(x)
        amax = absolute(x, out=t).max(axis=-1)
        scale = where(amax > 0, amax / 127.0, 1.0).astype(F32)
        divide(x, scale[:, None], out=t)
        rint(t, out=t)
        clip(t, -127, 127, out=t)
        q = empty(x.shape, np.int8)
        q[...] = t
        return [q, scale]
    return run


def _elementwise(fn) -> Callable[[Step, list, Any], Prepared]:
    def bind(step: Step, consts: list, state) -> Prepared:
        return fn(step)
    return bind


def _gelu(step):
    def run(inputs):
        x = inputs[0]
        return [(0.5 * x * (1.0 + np.tanh(_GELU_C * (x + _GELU_K * x * x * x)))).astype(F32, copy=False)]
    return run


def _silu(step):
    def run(inputs):
        x = inputs[0]
        return [(x / (1.0 + np.exp(-x))).astype(F32, copy=False)]
    return run


def _scale(step):
    factor = F32(step.attrs["factor"])

    def run(inputs):
        return [(inputs[0] * factor).astype(F32, copy=False)]
    return run


BINDERS: dict[str, Callable[[Step, list, Any], Prepared | None]] = {
    "RMSNorm": rms_norm, "RoPE": rope, "Attention": attention, "GatherPacked": gather_packed,
    "DequantizeRows": dequantize_rows, "QuantizeRows": quantize_rows, "GeluTanh": _elementwise(_gelu), "SiLU": _elementwise(_silu),
    "Scale": _elementwise(_scale),
}
