"""numpy CPU kernels for the LLM ops of compiler/frontend/gguf.py, by op name.

A kernel takes (inputs, attrs, state) and returns the outputs. `state` is the
generation state (the KV cache); only Attention uses it. Linear takes its weight
in one of the compiled forms (runtime/llm/weights.py): the kernel computes what
the NPU computes for that precision, so a CPU-placed phase and an NPU-placed
phase give the same numbers.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from runtime.llm.kvcache import KVCache
from runtime.llm.weights import Weight

Kernel = Callable[[list[Any], dict[str, Any], Any], list[np.ndarray]]

_GELU_C = math.sqrt(2.0 / math.pi)


def gather(inputs, attrs, state):
    table, ids = inputs
    return [table.rows(np.asarray(ids, dtype=np.int64))]


def scale(inputs, attrs, state):
    return [(inputs[0] * np.float32(attrs["factor"])).astype(np.float32)]


def rms_norm(inputs, attrs, state):
    x, w = inputs
    x = x.astype(np.float32)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return [(x / np.sqrt(ms + np.float32(attrs["epsilon"])) * w.dense()).astype(np.float32)]


def linear(inputs, attrs, state):
    x, w = inputs[0], inputs[1]
    y = w.matmul(x)
    if len(inputs) > 2:
        y = y + inputs[2].dense()
    return [y.astype(np.float32, copy=False)]


def reshape(inputs, attrs, state):
    return [inputs[0].reshape([int(d) for d in attrs["shape"]])]


def rope(inputs, attrs, state):
    x, pos = inputs[0], np.asarray(inputs[1])
    d = int(attrs["dims"])
    theta = np.float64(attrs["base"]) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if len(inputs) > 2:
        theta = theta / inputs[2].dense().astype(np.float64)
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


def attention(inputs, attrs, state: KVCache):
    """Causal attention of the new rows over the cached ones and themselves;
    with a window, a query at p sees keys at p - window < k <= p."""
    q, k, v, pos = inputs
    layer = int(attrs["layer"])
    keys, values, kpos = state.context(layer, k, v, np.asarray(pos))
    T, H, hd = q.shape
    Hkv = keys.shape[1]
    group = H // Hkv
    qg = q.astype(np.float32).reshape(T, Hkv, group, hd)
    scores = np.einsum("tkgd,pkd->kgtp", qg, keys, optimize=True) * np.float32(attrs["scale"])
    allowed = kpos[None, :] <= pos[:, None]
    window = int(attrs["window"])
    if window:
        allowed &= (pos[:, None] - kpos[None, :]) < window
    scores = np.where(allowed[None, None], scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    out = np.einsum("kgtp,pkd->tkgd", probs, values, optimize=True)
    state.append(layer, k, v, np.asarray(pos))
    return [out.reshape(T, H * values.shape[-1]).astype(np.float32)]


def silu(inputs, attrs, state):
    x = inputs[0]
    return [(x / (1.0 + np.exp(-x))).astype(np.float32)]


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
    return [inputs[0][-1:]]


KERNELS: dict[str, Kernel] = {
    "Gather": gather, "Scale": scale, "RMSNorm": rms_norm, "Linear": linear, "Reshape": reshape,
    "RoPE": rope, "Attention": attention, "SiLU": silu, "GeluTanh": gelu_tanh, "Tanh": tanh,
    "Mul": mul, "Add": add, "TakeLast": take_last,
}
