"""Prepared forms of the LLM CPU kernels (runtime/llm/kernels.py) for the
load-time plans (runtime/plan.py): what a step's attributes and constant
inputs fix is worked out once at load, and each call does only the per-token
arithmetic, in the order the plain kernel does it (the plans' logits are the
interpreter's, bit for bit: tests/llm/test_plan.py). Where one step would be
several numpy calls it is one compiled call (runtime/llm/jit.py); numba does
not check bounds, so inputs of other shapes than a kernel indexes (what a
crafted module could declare) go to the plain kernel, which broadcasts or
fails as numpy does.

A binder takes (step, constant inputs by position or None, generation state)
and returns a function of the input list that returns the output list. Ops
without a binder here run their plain kernel."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.program import Step
from rkc.runtime.constants import constant_bytes
from rkc.runtime.kernels.hadamard import compiled_form, unrotate
from rkc.runtime.llm import jit
from rkc.runtime.llm import prefill_kernels as many
from rkc.runtime.llm import prefill_attention
from rkc.runtime.llm import prefill_channels as channels
from rkc.runtime.llm.decode_attention import attend_row
from rkc.runtime.llm import kernels as plain
from rkc.runtime.llm.threads import over_ranges, threads_for
from rkc.runtime.llm.kernels import attend, packed_view, rotation_of

Prepared = Callable[[list], list]
GELU_C = np.float32(np.sqrt(2.0 / np.pi))  # GeluTanh's constants (kernels.gelu_tanh), float32
GELU_K = np.float32(0.044715)
F32 = np.float32


def _dense(w):
    return w.dense() if hasattr(w, "dense") else w


def rms_norm(step: Step, consts: list, state) -> Prepared | None:
    """As kernels.rms_norm, in one compiled call: a chunk's rows or heads
    with the tokens innermost in memory (an NPU output read in its layout,
    and what the per-step kernels make of it) by prefill_channels.rms_norm
    (the squares summed in float64, vector loops over the tokens), other
    rows by jit.rms_norm or prefill_kernels.rms_norm (numpy's pairwise
    order); the output in x's memory order, as the plain kernel's result."""
    weight = consts[1]
    if weight is None:
        return None
    w = np.ascontiguousarray(_dense(weight), F32)
    eps = F32(step.attrs["epsilon"])
    norm, empty_like, attrs = jit.rms_norm, np.empty_like, step.attrs
    norm_many, prog = many.rms_norm, many.pairwise_program(w.size)
    norm_channels, channel_major = channels.rms_norm, channels.channel_major

    def run(inputs):
        x = inputs[0].astype(F32, copy=False)
        if x.ndim == 0 or w.shape != x.shape[-1:]:  # a weight that broadcasts otherwise: the plain kernel's case
            return plain.rms_norm(inputs, attrs, state)
        out = empty_like(x)
        if x.ndim >= 2 and len(x) >= many.LANES:  # a chunk's rows or heads in the NPU's layout (tokens innermost)
            xc = channel_major(x)
            oc = None if xc is None else channel_major(out)
            if oc is not None:
                norm_channels(xc, w, eps, oc)
                return [out]
        x2, out2 = _rows(x), _rows(out)
        if len(x2) >= many.LANES and not x2.flags.c_contiguous:  # a prefill chunk's strided rows: by tiles
            norm_many(x2, w, eps, prog, out2)
        else:
            norm(x2, w, eps, out2)
        if not np.shares_memory(out2, out):
            out[...] = out2.reshape(out.shape)
        return [out]
    return run


def _rows(a: np.ndarray) -> np.ndarray:
    """a [..., K] as rows [N, K], a view where a's memory order allows (the
    rows in any order: each row is normalised alone)."""
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    return a.reshape(-1, a.shape[-1], order=order)


class _RopeTables:
    """cos/sin of one RoPE form at the positions of the current run, shared
    by every layer's q and k (recomputed when the positions change)."""

    def __init__(self, theta: np.ndarray, scale: float) -> None:
        self.theta, self.scale = theta, scale
        self.key: bytes | None = None
        self.cos = self.sin = None
        self.transposed: tuple | None = None

    def at(self, pos: np.ndarray):
        key = pos.tobytes()
        if key != self.key:
            ang = (pos.astype(np.float64) * self.scale)[:, None] * self.theta[None, :]
            self.cos = np.cos(ang).astype(F32)
            self.sin = np.sin(ang).astype(F32)
            self.key, self.transposed = key, None
        return self.cos, self.sin

    def at_transposed(self, pos: np.ndarray):
        """cos, sin as [dims / 2, T] (C order), for tokens-innermost tensors."""
        self.at(pos)
        if self.transposed is None:
            self.transposed = np.ascontiguousarray(self.cos.T), np.ascontiguousarray(self.sin.T)
        return self.transposed


def rope_tables(step: Step, consts: list, state) -> _RopeTables | None:
    """The cos/sin tables of a RoPE step's form, shared by every step of that
    form (None: frequency factors known only at run time)."""
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
    return tables


def rope(step: Step, consts: list, state) -> Prepared | None:
    a = step.attrs
    d = int(a["dims"])
    tables = rope_tables(step, consts, state)
    if tables is None:
        return None
    neox = a["mode"] == "neox"
    kernel, kernel_many, empty_like = jit.rope, many.rope, np.empty_like
    kernel_channels, channel_major = channels.rope, channels.channel_major

    def run(inputs):
        x, pos = inputs[0].astype(F32, copy=False), np.asarray(inputs[1])
        if x.ndim < 2 or pos.shape != x.shape[:1] or d > x.shape[-1]:  # the plain kernel's broadcasting (or its error)
            return plain.rope(inputs, a, state)
        if len(x) >= many.LANES:  # a prefill chunk read in the NPU's layout: tokens innermost
            out = empty_like(x)
            xc = channel_major(x)
            oc = None if xc is None else channel_major(out)
            if oc is not None:
                cos_t, sin_t = tables.at_transposed(pos)
                kernel_channels(xc, cos_t, sin_t, d, neox, oc)
                return [out]
        cos, sin = tables.at(pos)
        x3 = x if x.ndim == 3 else x.reshape(len(x), -1, x.shape[-1])  # [T, heads, D]
        out = empty_like(x3)  # in x's memory order, as the plain kernel's copy
        (kernel_many if len(x3) >= many.LANES else kernel)(x3, cos, sin, d, neox, out)
        return [out.reshape(x.shape)]
    return run


def attention(step: Step, consts: list, state) -> Prepared:
    """As kernels.attention, reading the KV cache in place (no copy of the
    cache per call); one query row (decode) through decode_attention.attend_row,
    a prefill chunk through _attend_chunk."""
    attrs, layer, blocks = step.attrs, int(step.attrs["layer"]), _prefill_work(state)

    def run(inputs):
        q, k, v, pos = inputs
        n = state.valid
        q, k, v, pos = q[:n], k[:n], v[:n], np.asarray(pos)[:n]
        keys, values, kpos = state.cache.store_and_view(layer, k, v, pos)
        return [attend_row(q, keys, values, kpos, pos, attrs, len(inputs[0])) if n == 1
                else _attend_chunk(q, keys, values, kpos, pos, attrs, len(inputs[0]), blocks)]
    return run


def attention_shared(step: Step, consts: list, state) -> Prepared:
    """As kernels.attention_shared; one query row through attend_row."""
    attrs, source, blocks = step.attrs, int(step.attrs["source"]), _prefill_work(state)

    def run(inputs):
        q, pos = inputs
        n = state.valid
        q, pos = q[:n], np.asarray(pos)[:n]
        keys, values, kpos = state.cache.shared(source)
        return [attend_row(q, keys, values, kpos, pos, attrs, len(inputs[0])) if n == 1
                else _attend_chunk(q, keys, values, kpos, pos, attrs, len(inputs[0]), blocks)]
    return run


def _attend_chunk(q, keys, values, kpos, pos, attrs, rows: int, blocks) -> np.ndarray:
    """kernels.attend for a prefill chunk (by blocks of query rows, its softmax compiled and threaded)."""
    return attend(q, keys, values, kpos, pos, attrs, rows, blocks)


def _prefill_work(state) -> prefill_attention.Workspace:
    """The engine's prefill score buffers (one per generation state: its
    plans' steps run one at a time), made at load."""
    return state.__dict__.setdefault("_prefill_work", prefill_attention.Workspace())


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
    form = compiled_form(rot, cols)  # unrotate's arithmetic in compiled calls around its factor product
    if form is not None:
        blocks, unhadamard, matmul = (cols // form.block, form.block), jit.unhadamard_rows, np.matmul

    def run(inputs):
        ids = np.asarray(inputs[0], np.int64)
        out = view[ids // kg, :, ids % kg, :].reshape(len(ids), cp)[:, :cols].astype(F32)
        if row_scale is not None:
            out *= row_scale[ids][:, None]
        if rot is None:
            return [out]
        if form is None:
            return [unrotate(out, rot)]
        y = out if form.factor_t is None else matmul(form.factor_t, out.reshape(len(out), *blocks)).reshape(out.shape)
        rows = np.empty(out.shape, F32)
        unhadamard(y, form.signs, form.block, form.norm, rows)
        return [rows]
    return run


def dequantize_rows(step: Step, consts: list, state) -> Prepared | None:
    """As kernels.dequantize_rows in one compiled call (jit.dequantize_rows:
    the same float64 products, rounded once), the output in acc's memory order."""
    if int(step.attrs.get("partials", 1)) != 1 or int(step.attrs.get("terms", 1)) != 1:
        return None  # K split into partial sums, or activation terms: the general kernel adds them
    ch = consts[2]
    if ch is None or (len(consts) > 3 and consts[3] is None):
        return None
    ch = np.ascontiguousarray(ch, F32)
    has_bias = len(consts) > 3
    bias = np.ascontiguousarray(consts[3], F32) if has_bias else ch  # (unread without a bias)
    kernel, kernel_many, empty_like = jit.dequantize_rows, many.dequantize_rows, np.empty_like

    attrs = step.attrs

    def run(inputs):
        acc, row_scale = inputs[0], inputs[1]
        if acc.ndim != 2 or row_scale.shape != acc.shape[:1] or ch.shape != acc.shape[1:] or bias.shape != ch.shape:
            return plain.dequantize_rows(inputs, attrs, state)  # broadcasting (or its error) as numpy's
        out = empty_like(acc, F32)  # a new array (it may be the program's output), in acc's order
        column_major = len(acc) > 1 and acc.strides[0] < acc.strides[1]  # an NPU output read in its layout
        (kernel_many if column_major else kernel)(acc, row_scale, ch, bias, has_bias, out)
        return [out]
    return run


def quantize_rows(step: Step, consts: list, state) -> Prepared | None:
    """As kernels.quantize_rows_kernel (weights.quantize_rows) in compiled
    calls: the rotation's signs and butterflies (jit.hadamard_rows), its
    block-mixing factor as the plain kernel's matmul, the rounding
    (jit.quantize_rows); work buffers made once per row count."""
    if any(c is None for c in consts[1:]) or int(step.attrs.get("terms", 1)) != 1:
        return None  # activation terms (a residual row): the general kernel
    rot = rotation_of(step.attrs, consts[1:])
    form = None if rot is None else compiled_form(rot, rot.size)
    if rot is not None and form is None:
        return None  # a rotation the compiled calls cannot apply: the general kernel
    if form is not None:
        signs, block, norm, factor = form.signs, form.block, form.norm, form.factor
    buffers: dict = {}  # x shape -> (rotated rows, mixed rows or None)
    hadamard, quantize, matmul, empty = jit.hadamard_rows, jit.quantize_rows, np.matmul, np.empty
    hadamard_many, rotate_quantize_many, lanes = many.hadamard_rows, many.rotate_quantize_rows, many.LANES

    attrs = step.attrs

    def run(inputs):
        x = np.asarray(inputs[0], F32)
        if x.ndim != 2 or (rot is not None and signs.shape != x.shape[1:]):
            return plain.quantize_rows_kernel(inputs, attrs, state)  # numpy's error, as before
        if rot is not None and factor is None and len(x) >= lanes:  # a prefill chunk: by tiles, in one pass
            q, scale = empty(x.shape, np.int8), empty(len(x), F32)
            n = many.live_rows(state, len(x))  # pad rows: zeros (never read)

            def tiles(lo: int, hi: int) -> None:  # rows are independent: tiles shared among the threads
                a, b = lo * lanes, min(n, hi * lanes)
                rotate_quantize_many(x[a:b], signs, block, norm, q[a:b], scale[a:b])
            over_ranges(tiles, -(-n // lanes), threads_for(n * x.shape[1]))
            q[n:], scale[n:] = 0, 0
            return [q, scale]
        if rot is not None:
            b = buffers.get(x.shape)
            if b is None:
                rows, k = x.shape
                b = buffers[x.shape] = (empty(x.shape, F32),
                                        None if factor is None else empty((rows, k // block, block), F32))
            (hadamard_many if len(x) >= lanes else hadamard)(x, signs, block, norm, b[0])
            x = b[0]
            if factor is not None:  # F mixes the blocks
                matmul(factor, x.reshape(b[1].shape), out=b[1])
                x = b[1].reshape(x.shape)
        q, scale = empty(x.shape, np.int8), empty(len(x), F32)
        quantize(x, q, scale)
        return [q, scale]
    return run


def _elementwise(fn) -> Callable[[Step, list, Any], Prepared]:
    def bind(step: Step, consts: list, state) -> Prepared:
        return fn(step)
    return bind


def _gelu(step):
    work: dict = {}  # (shape, strides) -> a buffer for the inner terms, reused
    multiply, add, tanh = np.multiply, np.add, np.tanh

    def run(inputs):
        x = inputs[0]
        if x.dtype != F32:
            return [(0.5 * x * (1.0 + np.tanh(GELU_C * (x + GELU_K * x * x * x)))).astype(F32, copy=False)]
        # 0.5 * x * (1 + tanh(C * (x + K * x * x * x))), each product and sum as that
        # expression rounds it (operands swapped only where IEEE arithmetic commutes)
        key = (x.shape, x.strides)
        t = work.get(key)
        if t is None:
            t = work[key] = np.empty_like(x)
        multiply(x, GELU_K, out=t)
        multiply(t, x, out=t)
        multiply(t, x, out=t)
        add(x, t, out=t)
        multiply(t, GELU_C, out=t)
        tanh(t, out=t)
        add(t, F32(1.0), out=t)
        out = multiply(x, F32(0.5))  # a new array: the step's output
        multiply(out, t, out=out)
        return [out]
    return run


def _silu(step):
    def run(inputs):
        return [plain.silu_values(inputs[0]).astype(F32, copy=False)]
    return run


def _scale(step):
    factor = F32(step.attrs["factor"])

    def run(inputs):
        return [(inputs[0] * factor).astype(F32, copy=False)]
    return run


BINDERS: dict[str, Callable[[Step, list, Any], Prepared | None]] = {
    "RMSNorm": rms_norm, "RoPE": rope, "Attention": attention, "AttentionShared": attention_shared,
    "GatherPacked": gather_packed,
    "DequantizeRows": dequantize_rows, "QuantizeRows": quantize_rows, "GeluTanh": _elementwise(_gelu), "SiLU": _elementwise(_silu),
    "Scale": _elementwise(_scale),
}
