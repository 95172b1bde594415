"""The int8 NPU program as numpy arithmetic: a fake-quantized run of the graph.

Every NPU group (compiler/emitter_ops.py: an anchor and what its epilogue absorbed)
that runs in int8 reads its inputs as int8 at their tensor scales, multiplies
by its weights as quantized to int8 (per output channel), and writes its output
rounded to the output's scale; everything else runs in float, as the CPU does.
This is the integer model the NPU must match (to the rounding of its 16-bit
multipliers: one step at most), and the reference the quantizer uses to judge
its choices (compiler/quantize.py) and `tools/int8_layers.py` prints per layer.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import numpy as np

from rkc.ir.graph import Graph
from rkc.ir.types import PerAxisQuant, PerTensorQuant
from rkc.runtime.kernels import run_kernel

WEIGHTED = {"Conv": 1, "Gemm": 1, "MatMul": 1}


def quantize_act(graph: Graph, name: str, value: np.ndarray) -> np.ndarray:
    """`value` as the NPU holds tensor `name`: int8 at its scale, dequantized."""
    q = graph.tensors[name].type.quant
    if not isinstance(q, PerTensorQuant):
        return value
    v = np.asarray(value, np.float64)
    return (np.clip(np.rint(v / q.scale) + q.zero_point, -128, 127) - q.zero_point) * q.scale


def quantized_weight(graph: Graph, name: str) -> np.ndarray:
    """Constant weight `name` as the NPU multiplies it (int8 per channel, dequantized)."""
    t = graph.tensors[name]
    w = graph.payloads[t.payload].astype(np.float64)
    q = t.type.quant
    if isinstance(q, PerTensorQuant):
        return (np.clip(np.rint(w / q.scale) + q.zero_point, -128, 127) - q.zero_point) * q.scale
    if not isinstance(q, PerAxisQuant):
        return w
    shape = [1] * w.ndim
    shape[q.axis] = -1
    s = graph.payloads[q.scale].astype(np.float64).reshape(shape)
    zp = graph.payloads[q.zero_point].astype(np.float64).reshape(shape)
    return (np.clip(np.rint(w / s) + zp, -128, 127) - zp) * s


def start_env(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The values before the first op: graph inputs from `feeds`, constants."""
    env: dict[str, np.ndarray] = {n: np.asarray(feeds[n]) for n in graph.inputs}
    env.update({name: graph.payloads[t.payload] for name, t in graph.tensors.items() if t.kind == "const"})
    return env


def run_ops(graph: Graph, indices: Iterable[int], env: dict[str, np.ndarray],
            int8_group: Callable[[int], object | None] = lambda i: None,
            observe: Callable[[str, np.ndarray], None] | None = None) -> None:
    """Run graph.ops[i] for each i in order over `env` (read and written in place).
    An op for which `int8_group(i)` gives its NpuGroup (anything with .anchor,
    .reads, .output) computes as the int8 NPU does: the anchor reads its inputs
    at their scales and its weight as int8, and the group's output is rounded to
    its scale; every other op runs in float."""
    for i in indices:
        op, g = graph.ops[i], int8_group(i)
        inputs = [_operand(graph, g, i, k, name, env[name]) if name else None for k, name in enumerate(op.inputs)]
        for name, value in zip(op.outputs, run_kernel(op.type, inputs, op.attrs, len(op.outputs))):
            value = np.asarray(value)
            if g is not None and name == g.output:
                value = quantize_act(graph, name, value).astype(value.dtype)
            env[name] = value
            if observe is not None:
                observe(name, value)


def _operand(graph: Graph, g, i: int, k: int, name: str, value: np.ndarray) -> np.ndarray:
    """Input k of op i as the int8 anchor of group `g` reads it (else unchanged)."""
    if g is None or i != g.anchor:
        return value
    if name in g.reads:
        return quantize_act(graph, name, value)
    if k == WEIGHTED.get(graph.ops[i].type) and graph.tensors[name].kind == "const":
        return quantized_weight(graph, name)
    return value


def run_fake_quant(graph: Graph, groups: Mapping[int, object], feeds: Mapping[str, np.ndarray],
                   float_groups: set[int] | frozenset = frozenset(),
                   observe: Callable[[str, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
    """Graph outputs of the int8 program. `groups` maps op index -> NpuGroup
    (anything with .anchor, .reads, .output); a group whose anchor is in
    `float_groups` runs in float (mixed precision)."""

    def int8_group(i: int):
        g = groups.get(i)
        return g if g is not None and g.anchor not in float_groups else None

    env = start_env(graph, feeds)
    run_ops(graph, range(len(graph.ops)), env, int8_group, observe)
    return {name: env[name] for name in graph.outputs}
