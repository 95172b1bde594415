"""A classifier head that flattens a pooled map before its matrix product:

    Flatten/Reshape(x [N, C, 1, 1]) -> [N, C];  MatMul(., W [C, K]) or Gemm(., B, bias)

becomes a 1x1 convolution on the map, flattened after it:

    Conv(x, W^T as [K, C, 1, 1], bias) -> [N, K, 1, 1];  Flatten -> [N, K]

The same products, but the flatten (a CPU step: it moves data between layouts)
now follows the product instead of cutting the NPU segment before it, and the
pooled map stays in the NPU's layout (a [N, C, 1, 1] map is stored like a
one-row matrix, so the convolution runs as the same GEMM).

A map flattened whole, [N, C, H, W] -> [N, C*H*W] (AlexNet's, ZFNet's and VGG's
first fully connected layer), becomes an H x W convolution without padding, one
output pixel: row-major flattening numbers the weights' rows as the kernel's
(c, y, x). The CNA sums a whole window of all channels in one task, where the
GEMM of K = C*H*W (9216 for AlexNet, 25088 for VGG-19) needs K partial sums the
NPU cannot accumulate for one row (compiler/npu/gemm.py) and stayed on the CPU.

A bias added after the flatten (Paddle's fc: MatMul, then Add of [K]) becomes the
convolution's bias, so the Add leaves the host's steps:

    Flatten(Conv(x) [N, K, 1, 1]) + b [K]  ->  Flatten(Conv(x, bias + b))"""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, only_consumer, producer
from rkc.ir.graph import Graph, Op, Tensor
from rkc.ir.types import TensorType


MAX_WINDOW = 32  # the CNA's kernel height and width fields (compiler/ops/conv.py fits_fields)


def _flattens_map(graph: Graph, op: Op) -> bool:
    """Does `op` flatten a static [N, C, H, W] map (H, W up to MAX_WINDOW) into [N, C*H*W]?"""
    if op.type not in ("Flatten", "Reshape") or op.type == "Flatten" and int(op.attrs.get("axis", 1)) != 1:
        return False
    x, y = graph.tensors[op.inputs[0]].type, graph.tensors[op.outputs[0]].type
    if not x.is_static or len(x.shape) != 4 or max(x.shape[2:]) > MAX_WINDOW:
        return False
    return tuple(y.shape) == (x.shape[0], int(np.prod(x.shape[1:])))


def _weights_and_bias(graph: Graph, mm: Op) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(W [C, K], bias [K] or None) of a product with constant weights."""
    w = graph.const_value(mm.inputs[1])
    if w is None or w.ndim != 2 or w.dtype.kind != "f":
        return None
    if mm.type == "MatMul":
        return w, None
    if mm.attrs.get("transA", 0):
        return None
    w = w.T if mm.attrs.get("transB", 0) else w
    alpha, beta = float(mm.attrs.get("alpha", 1.0)), float(mm.attrs.get("beta", 1.0))
    bias = None
    if len(mm.inputs) > 2 and mm.inputs[2]:
        c = graph.const_value(mm.inputs[2])
        if c is None or c.size not in (1, w.shape[1]) or c.ndim > 2 or c.ndim == 2 and c.shape[0] != 1:
            return None
        bias = np.broadcast_to(c.reshape(-1), (w.shape[1],)).astype(np.float64) * beta
    w = w.astype(np.float64) * alpha
    return w, bias


# Weight bytes of one kernel group per channel and window position: 32 int8 or 16 fp16 kernels
# (compiler/npu/conv.py streams a kernel group at a time when the weights do not fit CBUF), and
# the part of CBUF a group may take beside the window's rows of data (9 of its 12 banks)
GROUP_BYTES_PER_TAP = 32
GROUP_BYTES_MAX = 9 * 32 * 1024
PART_ALIGN = 16  # channel slices of whole 16-byte atoms (16 int8 channels, two fp16 atoms)


def _channel_parts(channels: int, taps: int) -> list[int]:
    """Channel counts of the window convolutions a flattened map's product is cut into: one when a
    kernel group of the whole window fits CBUF (AlexNet's 256x6x6), else even slices of whole
    atoms whose kernel groups do (VGG-19's 512x7x7: three; ZFNet's 512x6x6: two), summed after."""
    most = GROUP_BYTES_MAX // (GROUP_BYTES_PER_TAP * taps) // PART_ALIGN * PART_ALIGN
    if channels <= most or most == 0 or channels % PART_ALIGN:
        return [channels]
    parts = -(-channels // most)
    units = channels // PART_ALIGN
    return [(units // parts + (i < units % parts)) * PART_ALIGN for i in range(parts)]


def _value(graph: Graph, name: str, dtype, shape) -> str:
    graph.tensors[name] = Tensor(name, TensorType(dtype, tuple(int(d) for d in shape)), "value")
    return name


def head_as_conv(graph: Graph, mm: Op) -> bool:
    if mm.type not in ("MatMul", "Gemm"):
        return False
    flat = producer(graph, mm.inputs[0])
    if flat is None or only_consumer(graph, flat.outputs[0]) is not mm or not _flattens_map(graph, flat):
        return False
    found = _weights_and_bias(graph, mm)
    if found is None:
        return False
    w, bias = found
    x, out = flat.inputs[0], mm.outputs[0]
    dtype = graph.tensors[out].type.dtype
    n, k = graph.tensors[out].type.shape
    base = mm.name or out
    mapped = f"{base}.map"
    graph.tensors[mapped] = Tensor(mapped, TensorType(dtype, (n, k, 1, 1)), "value")
    _, c, h, width = graph.tensors[x].type.shape
    kernels = w.T.reshape(k, c, h, width).astype(dtype.numpy)
    sizes = _channel_parts(int(c), int(h) * int(width))
    pieces, ops = [x], []
    if len(sizes) > 1:  # channel slices of the map (views of its buffer: whole atoms), one window each
        pieces = [_value(graph, f"{x}.part{i}", dtype, (n, size, h, width)) for i, size in enumerate(sizes)]
        ops.append(Op("Split", [x, add_const(graph, f"{base}.parts", np.array(sizes, np.int64))], pieces,
                      {"axis": 1}, f"{base}.split"))
    starts = np.cumsum([0, *sizes])
    partials = [mapped] if len(sizes) == 1 else [_value(graph, f"{mapped}.part{i}", dtype, (n, k, 1, 1))
                                                 for i in range(len(sizes))]
    attrs = {"kernel_shape": [h, width], "strides": [1, 1], "pads": [0, 0, 0, 0]}
    for i, (piece, partial) in enumerate(zip(pieces, partials)):
        inputs = [piece, add_const(graph, f"{base}.w_conv", kernels[:, starts[i]:starts[i + 1]])]
        if bias is not None and i == 0:
            inputs.append(add_const(graph, f"{base}.b_conv", bias.astype(dtype.numpy)))
        ops.append(Op("Conv", inputs, [partial], dict(attrs), mm.name if len(sizes) == 1 else f"{base}.part{i}"))
    total = partials[0]
    for i, partial in enumerate(partials[1:], 1):
        summed = mapped if i == len(partials) - 1 else _value(graph, f"{mapped}.sum{i}", dtype, (n, k, 1, 1))
        ops.append(Op("Add", [total, partial], [summed], {}, f"{base}.sum{i}"))
        total = summed
    position = next(i for i, o in enumerate(graph.ops) if o is mm)
    graph.ops[position:position + 1] = [*ops, Op("Flatten", [mapped], [out], {"axis": 1}, flat.name)]
    graph.ops.remove(flat)
    del graph.tensors[flat.outputs[0]]
    return True


def bias_into_head(graph: Graph, add: Op) -> bool:
    if add.type != "Add" or len(add.inputs) != 2:
        return False
    for flat_out, other in (add.inputs, add.inputs[::-1]):
        flat = producer(graph, flat_out)
        if flat is None or flat.type != "Flatten" or only_consumer(graph, flat_out) is not add:
            continue
        conv = producer(graph, flat.inputs[0])
        mapped = graph.tensors[flat.inputs[0]].type.shape
        if conv is None or conv.type != "Conv" or only_consumer(graph, flat.inputs[0]) is not flat \
                or len(mapped) != 4 or tuple(mapped[2:]) != (1, 1):
            continue
        k = int(mapped[1])
        b = graph.const_value(other)
        if b is None or b.dtype.kind != "f" or b.size not in (1, k) or b.ndim > 2 or b.ndim == 2 and b.shape[0] != 1 \
                or graph.tensors[add.outputs[0]].type.shape != graph.tensors[flat_out].type.shape:
            continue
        old = graph.const_value(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(k)
        if old is None:
            continue
        dtype = graph.tensors[flat_out].type.dtype
        bias = old.astype(np.float64).reshape(-1) + np.broadcast_to(b.reshape(-1), (k,))
        conv.inputs = [*conv.inputs[:2], add_const(graph, f"{conv.name or flat_out}.b_conv", bias.astype(dtype.numpy))]
        out = add.outputs[0]
        graph.ops.remove(add)
        del graph.tensors[flat_out]
        flat.outputs = [out]
        return True
    return False


# element-wise ops with scalar attributes only: they commute with a flatten
ELEMENTWISE = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Swish", "Elu", "Tanh",
                         "Gelu"})


def activation_before_flatten(graph: Graph, act: Op) -> bool:
    """Act(Flatten(Conv(x))) -> Flatten(Act(Conv(x))): the activation then fuses into the
    convolution's epilogue (AlexNet's ReLU after its first fully connected layer)."""
    if act.type not in ELEMENTWISE or len(act.outputs) != 1 or any(
            t and (graph.const_value(t) is None or np.size(graph.const_value(t)) != 1) for t in act.inputs[1:]):
        return False
    flat = producer(graph, act.inputs[0])
    if flat is None or flat.type != "Flatten" or only_consumer(graph, flat.outputs[0]) is not act:
        return False
    conv = producer(graph, flat.inputs[0])  # a convolution, or the sum of a split one's parts
    if conv is None or conv.type not in ("Conv", "Add") or only_consumer(graph, flat.inputs[0]) is not flat:
        return False
    mapped, flat_out, out = flat.inputs[0], flat.outputs[0], act.outputs[0]
    graph.tensors[flat_out].type = graph.tensors[mapped].type  # now the activation's output, map-shaped
    act.inputs = [mapped, *act.inputs[1:]]
    act.outputs = [flat_out]
    flat.inputs, flat.outputs = [flat_out], [out]
    a, f = (next(i for i, o in enumerate(graph.ops) if o is op) for op in (act, flat))
    graph.ops[a], graph.ops[f] = flat, act
    return True


REWRITES = [head_as_conv, bias_into_head, activation_before_flatten]
