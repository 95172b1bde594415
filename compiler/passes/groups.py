"""Grouped convolutions and channel shuffles in the forms the NPU runs.

* A Conv with 1 < group < channels (AlexNet's two towers, ShuffleNet's grouped
  1x1 convolutions) becomes one ordinary convolution whose weights are zero
  outside each output channel's group: the CNA does ordinary and depthwise
  convolutions only (hw-rocket-and-mesa.md), and the block-diagonal form is the
  same sums exactly (the added products are of zero weights) for `group` times
  the MACs and weight bytes, which the modelled NPU time counts. Its output
  stays one map, so no Split or Concat of channels that are not whole 16-byte
  atoms (ShuffleNet's 68-channel groups) is needed. Up to MAX_GROUPS groups.
* A channel shuffle (Reshape to [1, g, C/g, H, W], Transpose of the two channel
  axes, Reshape back: ShuffleNet) is a permutation of the channels. Where the
  map comes from an ordinary Conv with constant weights, through element-wise
  ops that treat every channel alike (Relu, Clip, ...), the permutation moves
  into that Conv's weight rows and bias: the Conv writes the channels in the
  shuffled order and the three data moves are gone.
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, only_consumer, producer, replace_uses
from rkc.ir.graph import Graph, Op
from rkc.runtime.kernels import run_kernel

MAX_GROUPS = 8  # the dense form costs `group` times the MACs: beyond this the CPU's grouped kernel may win
# element-wise ops with scalar attributes only: they commute with a permutation of the channels
CHANNEL_BLIND = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Swish", "Elu",
                           "Tanh", "Gelu", "Identity"})
MOVES = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"})


def dense_groups(graph: Graph, op: Op) -> bool:
    """Conv(group=g) with constant weights -> Conv(group=1) with block-diagonal weights."""
    if op.type != "Conv" or len(op.inputs) < 2:
        return False
    group = int(op.attrs.get("group", 1))
    w = graph.const_value(op.inputs[1])
    x = graph.tensors[op.inputs[0]].type
    if group == 1 or group > MAX_GROUPS or w is None or w.ndim != 4 or len(x.shape) != 4:
        return False
    channels = x.shape[1]
    if not isinstance(channels, int) or group == channels or w.shape[0] % group or w.shape[1] * group != channels:
        return False
    per_in, per_out = w.shape[1], w.shape[0] // group
    dense = np.zeros((w.shape[0], channels, *w.shape[2:]), w.dtype)
    for g in range(group):
        dense[g * per_out:(g + 1) * per_out, g * per_in:(g + 1) * per_in] = w[g * per_out:(g + 1) * per_out]
    op.inputs = [op.inputs[0], add_const(graph, f"{op.name or op.outputs[0]}.dense_w", dense), *op.inputs[2:]]
    op.attrs = {k: v for k, v in op.attrs.items() if k != "group"}
    return True


def _channel_permutation(graph: Graph, last: Op) -> tuple[list[Op], np.ndarray] | None:
    """(the moves, in graph order, and perm) when `last` ends a chain of data moves from a
    [1, C, H, W] map to a map of the same shape whose channel c is the source's channel perm[c];
    every move but the last read only by the next."""
    out = graph.tensors[last.outputs[0]].type
    if last.type != "Reshape" or not out.is_static or len(out.shape) != 4 or out.shape[0] != 1:
        return None
    chain = [last]
    while True:
        up = producer(graph, chain[0].inputs[0])
        if up is None or up.type not in MOVES or len(up.outputs) != 1 or only_consumer(graph, up.outputs[0]) is None:
            break
        chain.insert(0, up)
        if len(chain) > 4:
            return None
    source = graph.tensors[chain[0].inputs[0]].type
    if len(chain) < 2 or tuple(source.shape) != tuple(out.shape):
        return None
    _, c, h, w = (int(d) for d in out.shape)
    ids = np.arange(c * h * w, dtype=np.int64).reshape(1, c, h, w)
    value = ids
    for op in chain:
        inputs = [value, *(graph.const_value(t) for t in op.inputs[1:])]
        if any(v is None for v in inputs[1:]):
            return None
        value = run_kernel(op.type, inputs, op.attrs, 1)[0]
    value = np.asarray(value).reshape(c, h * w)
    perm = value[:, 0] // (h * w)
    if not np.array_equal(value, perm[:, None] * (h * w) + np.arange(h * w)):
        return None  # moves pixels, not only channels
    return chain, perm


def shuffle_into_conv(graph: Graph, last: Op) -> bool:
    """Conv -> channel-blind ops -> channel permutation: the permutation goes into the Conv's weights."""
    found = None if last.outputs[0] in graph.outputs else _channel_permutation(graph, last)
    if found is None:
        return False
    chain, perm = found
    between, tensor = [], chain[0].inputs[0]
    while True:
        up = producer(graph, tensor)
        if up is None or only_consumer(graph, tensor) is None or len(up.outputs) != 1:
            return False
        if up.type == "Conv":
            break
        if up.type not in CHANNEL_BLIND or any(graph.const_value(t) is None or np.size(graph.const_value(t)) != 1
                                               for t in up.inputs[1:] if t):
            return False
        between.append(up)
        tensor = up.inputs[0]
    conv = up
    w = graph.const_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    bias = graph.const_value(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    if w is None or w.ndim != 4 or int(conv.attrs.get("group", 1)) != 1 or w.shape[0] != len(perm):
        return False
    if len(conv.inputs) > 2 and conv.inputs[2] and bias is None:
        return False
    base = conv.name or conv.outputs[0]
    inputs = [conv.inputs[0], add_const(graph, f"{base}.shuffled_w", w[perm])]
    if bias is not None:
        inputs.append(add_const(graph, f"{base}.shuffled_b", bias[perm]))
    conv.inputs = inputs
    shuffled = chain[0].inputs[0]
    for op in chain:
        graph.ops.remove(op)
    for op in chain[:-1]:
        del graph.tensors[op.outputs[0]]
    replace_uses(graph, last.outputs[0], shuffled)
    del graph.tensors[last.outputs[0]]
    return True


REWRITES = [dense_groups, shuffle_into_conv]
