"""Per-channel affine maps after a Conv (or a ConvTranspose) whose output feeds
only them, folded into its weights and bias:

* BatchNormalization: y = (conv(x) - mean) * g / sqrt(var + eps) + b
* Mul by a constant per output channel (exporters spell BN as Mul + Add):
  y = conv(x) * s  ->  weights * s, bias * s (the Add then fuses as a bias)
* Add of a constant per output channel after a ConvTranspose (exporters that
  spell its bias as an Add): its bias input, so that a BatchNormalization
  after it folds too (a Conv's Add fuses into its epilogue instead)
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, only_consumer, producer, rename_output
from rkc.ir.errors import FormatError
from rkc.ir.graph import Graph, Op


def batchnorm_scale(bn: Op, gamma: np.ndarray, var: np.ndarray) -> np.ndarray:
    """g / sqrt(var + eps) per channel (float64); a variance that makes it
    undefined (var + eps <= 0, or not finite) is a broken model, refused here
    rather than compiled into NaN weights."""
    denom = var + float(bn.attrs.get("epsilon", 1e-5))
    bad = ~(np.isfinite(denom) & (denom > 0) & np.isfinite(gamma))
    if bad.any():
        raise FormatError(f"op {bn.describe()}: scale / sqrt(variance + epsilon) is undefined in {int(bad.sum())} of "
                          f"{bad.size} channels (first: channel {int(np.flatnonzero(bad)[0])}); the model's "
                          "BatchNormalization parameters are broken")
    return gamma / np.sqrt(denom)


def _output_axis(conv: Op | None) -> int | None:
    """The weight axis of the output channels of a Conv ([O, I, ...]) or a one-group
    ConvTranspose ([I, O, ...]); None for anything else."""
    if conv is None:
        return None
    if conv.type == "Conv":
        return 0
    return 1 if conv.type == "ConvTranspose" and int(conv.attrs.get("group", 1)) == 1 else None


def _scaled(w: np.ndarray, axis: int, k: np.ndarray) -> np.ndarray:
    """Weights with output channel o multiplied by k[o]."""
    shape = [1] * w.ndim
    shape[axis] = -1
    return (w.astype(np.float64) * k.reshape(shape)).astype(w.dtype)


def _bias(graph: Graph, conv: Op, w: np.ndarray, axis: int) -> np.ndarray | None:
    """The conv's bias (zeros when it has none), or None when it is not a constant."""
    has_bias = len(conv.inputs) > 2 and conv.inputs[2]
    return graph.const_value(conv.inputs[2]) if has_bias else np.zeros(w.shape[axis], w.dtype)


def fold_into_conv(graph: Graph, bn: Op) -> bool:
    if bn.type != "BatchNormalization" or len(bn.outputs) != 1 or bn.attrs.get("training_mode", 0):
        return False
    conv = producer(graph, bn.inputs[0])
    axis = _output_axis(conv)
    if axis is None or only_consumer(graph, conv.outputs[0]) is not bn:
        return False
    w = graph.const_value(conv.inputs[1])
    params = [graph.const_value(n) for n in bn.inputs[1:5]]
    if w is None or any(p is None for p in params) or w.dtype.kind != "f":
        return False
    bias = _bias(graph, conv, w, axis)
    if bias is None:
        return False
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    k = batchnorm_scale(bn, gamma, var)
    new_w = _scaled(w, axis, k)
    new_b = ((bias.astype(np.float64) - mean) * k + beta).astype(w.dtype)
    base = conv.name or conv.outputs[0]
    conv.inputs = [conv.inputs[0], add_const(graph, f"{base}.w_bn", new_w), add_const(graph, f"{base}.b_bn", new_b)]
    out = bn.outputs[0]
    graph.ops.remove(bn)
    del graph.tensors[out]
    rename_output(graph, conv, conv.outputs[0], out)
    return True


def _channel_vector(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that scales each output channel of [N, C, ...]: as a [C] vector."""
    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)) if value.size == 1 else value.reshape(-1)


def fold_scale_into_conv(graph: Graph, mul: Op) -> bool:
    if mul.type != "Mul" or len(mul.inputs) != 2:
        return False
    for data, other in (mul.inputs, mul.inputs[::-1]):
        conv = producer(graph, data)
        scale = graph.const_value(other)
        axis = _output_axis(conv)
        if axis is None or scale is None or only_consumer(graph, data) is not mul:
            continue
        w = graph.const_value(conv.inputs[1])
        if w is None or w.dtype.kind != "f" or scale.dtype != w.dtype:
            continue
        vec = _channel_vector(scale, w.shape[axis], len(graph.tensors[data].type.shape))
        if vec is None:
            continue
        bias = _bias(graph, conv, w, axis)
        if bias is None:
            continue
        vec = vec.astype(np.float64)
        base = conv.name or conv.outputs[0]
        new_w = _scaled(w, axis, vec)
        new_b = (bias.astype(np.float64) * vec).astype(w.dtype)
        conv.inputs = [conv.inputs[0], add_const(graph, f"{base}.w_scaled", new_w),
                       add_const(graph, f"{base}.b_scaled", new_b)]
        out = mul.outputs[0]
        graph.ops.remove(mul)
        del graph.tensors[out]
        rename_output(graph, conv, data, out)
        return True
    return False


def fold_bias_into_conv_transpose(graph: Graph, add: Op) -> bool:
    if add.type != "Add" or len(add.inputs) != 2:
        return False
    for data, other in (add.inputs, add.inputs[::-1]):
        conv = producer(graph, data)
        shift = graph.const_value(other)
        if conv is None or conv.type != "ConvTranspose" or _output_axis(conv) is None or shift is None \
                or only_consumer(graph, data) is not add:
            continue
        w = graph.const_value(conv.inputs[1])
        if w is None or w.dtype.kind != "f" or shift.dtype != w.dtype:
            continue
        vec = _channel_vector(shift, w.shape[1], len(graph.tensors[data].type.shape))
        bias = _bias(graph, conv, w, 1)
        if vec is None or bias is None or tuple(graph.tensors[add.outputs[0]].type.shape) != \
                tuple(graph.tensors[data].type.shape):
            continue
        base = conv.name or conv.outputs[0]
        new_b = (bias.astype(np.float64) + vec.astype(np.float64)).astype(w.dtype)
        conv.inputs = [conv.inputs[0], conv.inputs[1], add_const(graph, f"{base}.b_add", new_b)]
        out = add.outputs[0]
        graph.ops.remove(add)
        del graph.tensors[out]
        rename_output(graph, conv, data, out)
        return True
    return False


REWRITES = [fold_into_conv, fold_scale_into_conv, fold_bias_into_conv_transpose]
