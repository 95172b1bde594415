"""numpy CPU kernels for the LLM ops of compiler/frontend/gguf.py and the
conversions of compiler/llm/program_builder.py, by op name.

These are the reference: the step interpreter (LlmEngine.run_interpreted)
and the tests run them. The load-time plans run compiled forms of some
(runtime/llm/prepared.py over runtime/llm/jit.py: RMSNorm, QuantizeRows
with its rotation, DequantizeRows, RoPE), which give these kernels' bits
(tests/llm/test_plan.py), and fused float32 stretches of many rows
(runtime/llm/fused_rows.py, threaded) held to float64 references within
float32 tolerances instead (issue 37). Attention is one kernel for both:
decode_attention's for one query row, prefill_attention.attend_blocks for a
chunk. A plan falls back to a
kernel here only for shapes the compiled code cannot bound.

A kernel takes (inputs, attrs, state) and returns the outputs. `state` is the
generation state: the KV cache (Attention) and the loaded model (GatherPacked
reads rows of the packed NPU weights). Standard ops (Cast, ...) come from
runtime/kernels. Linear (a CPU-placed product) takes its weight in a compiled
form (runtime/llm/weights.py) and computes what the NPU computes for it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.npu import layout
from rkc.runtime.constants import constant_bytes
from rkc.runtime.llm.kvcache import KVCache
from rkc.runtime.llm import int4_rows
from rkc.runtime.llm.decode_attention import attend_row
from rkc.runtime.llm.prefill_attention import SCORES, VALUES, attend_blocks, contract
from rkc.runtime.kernels.hadamard import Rotation, unrotate
from rkc.runtime.llm.weights import Int8Weight, dequantize, quantize_rows

Kernel = Callable[[list[Any], dict[str, Any], Any], list[np.ndarray]]

_GELU_C = math.sqrt(2.0 / math.pi)


def gather(inputs, attrs, state):
    table, ids = inputs
    return [table.rows(np.asarray(ids, dtype=np.int64))]


def rotation_of(attrs, consts: list) -> Rotation | None:
    """The rotation a step's attrs name ("rotation": "hadamard", "block": n),
    from its constant inputs: the signs [K], then the factor [m, m] if any."""
    if attrs.get("rotation") != "hadamard":
        return None
    return Rotation(np.asarray(consts[0]), int(attrs["block"]), np.asarray(consts[1]) if len(consts) > 1 else None)


def gather_rows(inputs, attrs, state):
    """Rows of a host table (fp16, or int8 with a scale per row; rotated back
    if the table's columns are rotated)."""
    table, ids = inputs[0], np.asarray(inputs[1], np.int64)
    rows = table[ids].astype(np.float32)
    if len(inputs) > 2:
        rows *= inputs[2][ids][:, None]
    rot = rotation_of(attrs, inputs[3:])
    return [rows if rot is None else unrotate(rows, rot)]


def packed_view(raw: np.ndarray, rows: int, cols: int, dtype) -> tuple[np.ndarray, int, int]:
    """A [rows, cols] matrix stored as 1x1 NPU weights (kernels = rows, channels =
    cols; ir/npu/layout.pack_weights) viewed as [group, tile, kernel, channel] with
    no copy: per group of kg kernels, 32-channel tiles of [kernel][channel].
    Returns the view, kg and the padded column count."""
    item = np.dtype(dtype).itemsize
    kg = layout.kernel_group_for(item)
    cp = layout.align(cols, layout.c2_for(item))
    tile = layout.CHANNEL_GROUP
    if cp % tile:
        raise FormatError(f"packed {rows}x{cols} weights: rows cannot be gathered ({cols} columns)")
    groups = layout.align(rows, kg) // kg
    return raw[: groups * kg * cp * item].view(dtype).reshape(groups, cp // tile, kg, tile), kg, cp


def packed_rows(raw: np.ndarray, ids: np.ndarray, rows: int, cols: int, dtype) -> np.ndarray:
    """Rows `ids` of a packed [rows, cols] matrix (packed_view), without unpacking the rest."""
    view, kg, cp = packed_view(raw, rows, cols, dtype)
    return view[ids // kg, :, ids % kg, :].reshape(len(ids), cp)[:, :cols]


def gather_packed(inputs, attrs, state):
    """Embedding rows read from the output head's packed NPU weights (tied head)."""
    ids = np.asarray(inputs[0], np.int64)
    model = state.model
    info = model.tensors[attrs["packed"]]
    raw = constant_bytes(model, info)  # the stored weights: only the rows' pages are read
    if raw is not None:
        rows = packed_rows(raw, ids, attrs["rows"], attrs["cols"], np.dtype(attrs["dtype"])).astype(np.float32)
    else:
        bo = model.bos[info.region]
        model.device.prepare_cpu_access(bo)
        try:
            raw = bo.host[info.offset:info.offset + info.nbytes]
            rows = packed_rows(raw, ids, attrs["rows"], attrs["cols"], np.dtype(attrs["dtype"])).astype(np.float32)
        finally:
            model.device.finish_cpu_access(bo)
    if len(inputs) > 1:
        rows *= inputs[1][ids][:, None]
    rot = rotation_of(attrs, inputs[2:])
    return [rows if rot is None else unrotate(rows, rot)]


def quantize_rows_kernel(inputs, attrs, state):
    """fp32 [M, K] -> int8 [M, K] and one scale per row (symmetric, W8A8's A8),
    the rows rotated first when attrs name a rotation (inputs: x, its constants);
    attrs["terms"] = T: T int8 rows per row, [T * M, K] (weights.quantize_rows)."""
    q, scale = quantize_rows(np.asarray(inputs[0], np.float32), rotation_of(attrs, inputs[1:]),
                             int(attrs.get("terms", 1)))
    return [q, scale]


def dequantize_rows(inputs, attrs, state):
    """int32 accumulators [M, N] -> fp32: x row scale x weight channel scale (+ bias).
    attrs["partials"] = P: the first P inputs are int32 partial sums over K
    ranges, added exactly (int64) first; attrs["terms"] = T: the rows are T
    activation terms of each row [T * M, N], summed (weights.dequantize)."""
    p = int(attrs.get("partials", 1))
    acc = np.sum([np.asarray(a, np.int64) for a in inputs[:p]], axis=0) if p > 1 else inputs[0]
    row_scale, ch_scale = inputs[p], inputs[p + 1]
    bias = inputs[p + 2] if len(inputs) > p + 2 else None
    return [dequantize(acc, row_scale, ch_scale, bias, int(attrs.get("terms", 1)))]


def quantize_nibbles(inputs, attrs, state):
    """fp32 [M, K] -> the int4 operand [2M, K] as packed bytes [2M, K / 2] (int8) and
    one scale per row: int8 per row in two signed nibble rows (int4_rows.py), the
    rows rotated first when attrs name a rotation."""
    rows, scale = int4_rows.npu_rows(inputs[0], rotation_of(attrs, inputs[1:]))
    if attrs.get("pair_group"):  # one token, two K groups per NPU segment (int4_rows.pair_rows)
        rows = int4_rows.pair_rows(rows, int(attrs["pair_group"]))
    return [int4_rows.packed_rows(rows), scale]


def combine_int4(inputs, attrs, state):
    """int16 partials [2M, G * Np] -> fp32 [M, N]: per K group scaled and summed,
    times the row scale (+ bias) (int4_rows.combine)."""
    return [int4_rows.combine(inputs[0], inputs[1], inputs[2], inputs[3] if len(inputs) > 3 else None,
                              bool(attrs.get("pair_group")))]


def sum_partials(inputs, attrs, state):
    """fp32 partial products over K ranges [M, N] -> their sum (fp32)."""
    return [np.sum([np.asarray(a, np.float64) for a in inputs], axis=0).astype(np.float32)]


def scale(inputs, attrs, state):
    return [(inputs[0] * np.float32(attrs["factor"])).astype(np.float32)]


def _dense(w):
    return w.dense() if hasattr(w, "dense") else w


def rms_norm(inputs, attrs, state):
    x, w = inputs
    x = x.astype(np.float32)
    # squares in C order whatever x's layout: numpy sums a contiguous last axis
    # pairwise and a strided one in sequence, so an NPU output read in its own
    # layout (column-major) would otherwise round its mean differently from
    # the CPU emulation's row-major array, and that ulp can move a later int8
    # activation a whole step (docs/llm.md, the drift)
    ms = np.mean(np.multiply(x, x, order="C"), axis=-1, keepdims=True, dtype=np.float32)
    return [(x / np.sqrt(ms + np.float32(attrs["epsilon"])) * _dense(w)).astype(np.float32)]


def linear(inputs, attrs, state):
    x, w = inputs[0], inputs[1]
    if len(inputs) > 2 and isinstance(w, Int8Weight):  # the bias added before the one rounding to fp32
        return [w.matmul(x, _dense(inputs[2]))]
    y = w.matmul(x)
    if len(inputs) > 2:
        y = y + _dense(inputs[2])
    return [y.astype(np.float32, copy=False)]


def reshape(inputs, attrs, state):
    return [inputs[0].reshape([int(d) for d in attrs["shape"]])]


def rope(inputs, attrs, state):
    x, pos = inputs[0], np.asarray(inputs[1])
    d = int(attrs["dims"])
    theta = np.float64(attrs["base"]) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if len(inputs) > 2:
        theta = theta / _dense(inputs[2]).astype(np.float64)
    ang = (pos.astype(np.float64) * float(attrs["scale"]))[:, None] * theta[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    out = x.astype(np.float32, copy=True)
    if attrs["mode"] == "neox":
        a, b = x[..., : d // 2], x[..., d // 2: d]
        out[..., : d // 2] = a * cos - b * sin
        out[..., d // 2: d] = a * sin + b * cos
    else:
        a, b = x[..., 0:d:2], x[..., 1:d:2]
        out[..., 0:d:2] = a * cos - b * sin
        out[..., 1:d:2] = a * sin + b * cos
    return [out]


def attention(inputs, attrs, state):
    """Causal attention of the new rows over the cached ones and themselves;
    with a window, a query at p sees keys at p - window < k <= p."""
    q, k, v, pos = inputs
    n = getattr(state, "valid", len(pos))  # pad rows of a short chunk stay out of the cache
    q, k, v, pos = q[:n], k[:n], v[:n], np.asarray(pos)[:n]
    layer = int(attrs["layer"])
    cache: KVCache = state.cache
    keys, values, kpos = cache.context(layer, k, v, pos)
    out = attend(q, keys, values, kpos, pos, attrs, len(inputs[0]))
    cache.append(layer, k, v, pos)
    return [out]


def attend(q, keys, values, kpos, pos, attrs, rows: int, blocks=None) -> np.ndarray:
    """Softmax attention of q [T, H, hd] over keys/values [P, Hkv, hd] at kpos,
    causal (and windowed), into [rows, H * hd_v] (rows past T stay zero).

    One query row (a decode step) is runtime/llm/decode_attention.py's
    compiled float32 kernel, the plans' too (keys cut among the host threads
    at long positions). A prefill chunk (two rows or more, keys in position
    order) runs by blocks of query rows over the keys each sees
    (runtime/llm/prefill_attention.py: float32 softmax compiled, threaded);
    `blocks`: its prefill_attention.Workspace, made once by a plan. Both are
    bounded against float64 in tests/llm/test_attention.py. Other chunks
    (keys out of order) take numpy's einsums."""
    T, H, hd = q.shape
    Hkv = keys.shape[1]
    if T == 1:
        return attend_row(q, keys, values, kpos, pos, attrs, rows)
    if T > 1 and np.all(kpos[1:] > kpos[:-1]):  # a prefill chunk: by blocks of query rows
        full = np.empty((rows, H * values.shape[-1]), np.float32)
        full[T:] = 0
        attend_blocks(q.astype(np.float32, copy=False), keys, values, kpos, pos, np.float32(attrs["scale"]),
                      int(attrs["window"]), full[:T], blocks)
        return full
    G = H // Hkv
    qg = q.astype(np.float32, order="C").reshape(T, Hkv, G, hd)  # C order: as the KV context
    scale = np.float32(attrs["scale"])
    scores = contract(*SCORES, qg, keys) * scale
    window = int(attrs["window"])
    lo, hi, first = kpos.min(), kpos.max(), pos.min()
    if not (hi <= first and (not window or pos.max() - lo < window)):
        allowed = kpos[None, :] <= pos[:, None]
        if window:
            allowed &= (pos[:, None] - kpos[None, :]) < window
        scores = np.where(allowed[None, None], scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = contract(*VALUES, probs, values)
    full = np.zeros((rows, H * values.shape[-1]), np.float32)
    full[:T] = out.reshape(T, H * values.shape[-1])
    return full


def attention_shared(inputs, attrs, state):
    """Attention of the new rows over an earlier layer's KV cache as that layer
    left it in this step (KV sharing: attrs["source"]); the cache is unchanged."""
    q, pos = inputs
    n = getattr(state, "valid", len(pos))
    q, pos = q[:n], np.asarray(pos)[:n]
    keys, values, kpos = state.cache.shared(int(attrs["source"]))
    return [attend(q, keys, values, kpos, pos, attrs, len(inputs[0]))]


def rms_norm_plain(inputs, attrs, state):
    x = inputs[0].astype(np.float32)
    ms = np.mean(np.multiply(x, x, order="C"), axis=-1, keepdims=True, dtype=np.float32)  # as rms_norm
    return [(x / np.sqrt(ms + np.float32(attrs["epsilon"]))).astype(np.float32)]


def pick(inputs, attrs, state):
    return [np.ascontiguousarray(inputs[0][:, int(attrs["index"])])]


def scale_by(inputs, attrs, state):
    return [(inputs[0] * _dense(inputs[1]).astype(np.float32)).astype(np.float32)]


# the largest float32 t whose float32 exp is finite (exp(t) = 3.4027985e38);
# exp overflows for every t above it (tests/llm/test_plan.py checks both)
EXP_MAX = np.float32(88.72283172607422)


def silu_values(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)) without overflowing in the exp: where exp(-x) would
    be inf the denominator is inf outright, so every value is the plain
    formula's (x / inf, a signed zero) and no RuntimeWarning is raised."""
    t = np.negative(x)
    den = 1.0 + np.exp(np.minimum(t, EXP_MAX))
    den[t > EXP_MAX] = np.inf
    return x / den


def silu(inputs, attrs, state):
    return [silu_values(inputs[0]).astype(np.float32)]


def gelu_tanh(inputs, attrs, state):
    x = inputs[0]
    return [(0.5 * x * (1.0 + np.tanh(np.float32(_GELU_C) * (x + np.float32(0.044715) * x * x * x))))
            .astype(np.float32)]


def tanh(inputs, attrs, state):
    return [np.tanh(inputs[0])]


def mul(inputs, attrs, state):
    return [inputs[0] * inputs[1]]


def add(inputs, attrs, state):
    return [inputs[0] + inputs[1]]


def take_last(inputs, attrs, state):
    n = getattr(state, "valid", len(inputs[0]))
    return [inputs[0][n - 1:n]]


KERNELS: dict[str, Kernel] = {
    "Gather": gather, "Scale": scale, "RMSNorm": rms_norm, "Linear": linear, "Reshape": reshape,
    "RoPE": rope, "Attention": attention, "SiLU": silu, "GeluTanh": gelu_tanh, "Tanh": tanh,
    "Mul": mul, "Add": add, "TakeLast": take_last, "GatherRows": gather_rows, "GatherPacked": gather_packed,
    "QuantizeRows": quantize_rows_kernel, "DequantizeRows": dequantize_rows, "SumPartials": sum_partials,
    "QuantizeNibbles": quantize_nibbles, "CombineInt4": combine_int4,
    "AttentionShared": attention_shared, "RMSNormPlain": rms_norm_plain, "Pick": pick, "ScaleBy": scale_by,
}
