"""BatchNormalization after a Conv (or ConvTranspose/Gemm-free) whose output
feeds only it: scale the Conv's weights per output channel and shift its bias.
y = (conv(x) - mean) * g / sqrt(var + eps) + b."""

from __future__ import annotations

import numpy as np

from compiler.passes.edit import add_const, only_consumer, producer, rename_output
from ir.graph import Graph, Op


def _const(graph: Graph, name: str) -> np.ndarray | None:
    t = graph.tensors.get(name) if name else None
    if t is None or t.kind != "const" or t.payload not in graph.payloads:
        return None
    return graph.payloads[t.payload]


def fold_into_conv(graph: Graph, bn: Op) -> bool:
    if bn.type != "BatchNormalization" or len(bn.outputs) != 1 or bn.attrs.get("training_mode", 0):
        return False
    conv = producer(graph, bn.inputs[0])
    if conv is None or conv.type != "Conv" or only_consumer(graph, conv.outputs[0]) is not bn:
        return False
    w = _const(graph, conv.inputs[1])
    params = [_const(graph, n) for n in bn.inputs[1:5]]
    if w is None or any(p is None for p in params) or w.dtype.kind != "f":
        return False
    bias = _const(graph, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0], w.dtype)
    if bias is None:
        return False
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    k = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    new_w = (w.astype(np.float64) * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
    new_b = ((bias.astype(np.float64) - mean) * k + beta).astype(w.dtype)
    base = conv.name or conv.outputs[0]
    conv.inputs = [conv.inputs[0], add_const(graph, f"{base}.w_bn", new_w), add_const(graph, f"{base}.b_bn", new_b)]
    out = bn.outputs[0]
    graph.ops.remove(bn)
    del graph.tensors[out]
    rename_output(graph, conv, conv.outputs[0], out)
    return True


REWRITES = [fold_into_conv]
