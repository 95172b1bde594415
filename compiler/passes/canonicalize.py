"""Canonical form: pass-through ops (Identity, inference Dropout) removed, a
ReduceMean over all spatial axes of a 4-D map is a GlobalAveragePool, and so
is an AveragePool whose one window covers the whole map and excludes the
padding from its count; a Sum of two tensors is an Add; a Relu of a Concat is
the Concat of its pieces' Relus (each then fuses into its piece's producer)."""

from __future__ import annotations

from rkc.compiler.passes.edit import consumers, only_consumer, producer, remove_op, rename_output, replace_uses
from rkc.ir.graph import Graph, Op, Tensor
from rkc.ir.npu.geometry import pads_for


def drop_pass_through(graph: Graph, op: Op) -> bool:
    if op.type not in ("Identity", "Dropout"):
        return False
    if op.type == "Dropout" and len(op.outputs) > 1 and consumers(graph, op.outputs[1]):
        return False  # someone reads the mask
    src, dst = op.inputs[0], op.outputs[0]
    if dst in graph.outputs:
        up = producer(graph, src)
        if up is None or src in graph.outputs:
            return False  # an input or constant passed straight out: keep the copy
        graph.ops.remove(op)
        del graph.tensors[dst]
        rename_output(graph, up, src, dst)
        return True
    replace_uses(graph, dst, src)
    remove_op(graph, op)
    return True


def reduce_mean_to_global_pool(graph: Graph, op: Op) -> bool:
    if op.type != "ReduceMean" or not op.attrs.get("keepdims", 1):
        return False
    x = graph.tensors[op.inputs[0]].type
    axes = op.attrs.get("axes")
    if len(op.inputs) > 1 and op.inputs[1]:
        value = graph.const_value(op.inputs[1])
        if value is None:
            return False
        axes = [int(a) for a in value.reshape(-1)]
    if len(x.shape) != 4 or axes is None or sorted(a % 4 for a in axes) != [2, 3]:
        return False
    op.type = "GlobalAveragePool"
    op.inputs = op.inputs[:1]
    op.attrs = {}
    return True


def one_window_average_to_global_pool(graph: Graph, op: Op) -> bool:
    """AveragePool with one output position whose window holds every input position
    and counts only those (count_include_pad 0): the mean of the map, whatever the
    padding (Inception v1's 7x7 pool of a 6x6 map padded at the end)."""
    if op.type != "AveragePool" or op.attrs.get("count_include_pad", 0):
        return False
    x, y = graph.tensors[op.inputs[0]].type, graph.tensors[op.outputs[0]].type
    if len(x.shape) != 4 or not x.is_static or list(y.shape[2:]) != [1, 1]:
        return False
    kernel = [int(k) for k in op.attrs["kernel_shape"]]
    begin, _ = pads_for(op.attrs.get("auto_pad", "NOTSET"), x.shape[2:], kernel,
                        [int(s) for s in op.attrs.get("strides", [1, 1])], [1, 1], op.attrs.get("pads"))
    if any(size > k - b for size, k, b in zip(x.shape[2:], kernel, begin)):
        return False  # the window [-begin, k - begin) misses some of the map
    op.type = "GlobalAveragePool"
    op.attrs = {}
    return True


def sum_of_two_is_add(graph: Graph, op: Op) -> bool:
    """Sum(a, b) is Add(a, b) (one form for fusion and lowering); Sum(a) is a.
    Max/Min of two tensors stay as they are."""
    if op.type != "Sum" or len(op.inputs) > 2:
        return False
    op.type = "Add" if len(op.inputs) == 2 else "Identity"
    return True


# ops whose output is >= 0 wherever their data inputs are (a pool's padding never wins a
# max, adds zero to a sum; a Concat only places its pieces)
_KEEPS_SIGN = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Concat")


def non_negative(graph: Graph, tensor: str, depth: int = 8) -> bool:
    """Whether `tensor` is >= 0 by construction: a Relu's output, a Clip's with a lower
    bound >= 0, or a pool or Concat of such tensors (`depth` producers up at most)."""
    op = producer(graph, tensor)
    if op is None or depth == 0:
        return False
    if op.type == "Relu":
        return True
    if op.type == "Clip":
        low = graph.const_value(op.inputs[1]) if len(op.inputs) > 1 else op.attrs.get("min")
        return low is not None and float(low) >= 0
    if op.type in _KEEPS_SIGN:
        data = op.inputs if op.type == "Concat" else op.inputs[:1]
        return all(non_negative(graph, t, depth - 1) for t in data)
    return False


def relu_through_concat(graph: Graph, op: Op) -> bool:
    """Relu(Concat(pieces)) -> Concat(Relu(piece), ...), a piece already >= 0 (a pool of a
    Relu's output) taken as it is: each Relu then fuses into its piece's producer, and the
    Concat stays a view of one buffer (ShuffleNet's stride-2 unit, Concat(AveragePool(x),
    Conv) -> Relu, ran the Concat and the Relu on the CPU with conversions around them)."""
    if op.type != "Relu":
        return False
    concat = producer(graph, op.inputs[0])
    if concat is None or concat.type != "Concat" or only_consumer(graph, op.inputs[0]) is not op:
        return False
    pieces, relus = [], []
    for piece in concat.inputs:
        if non_negative(graph, piece):
            pieces.append(piece)
            continue
        name, k = f"{piece}.relu", 0
        while name in graph.tensors:
            k += 1
            name = f"{piece}.relu{k}"
        graph.tensors[name] = Tensor(name, graph.tensors[piece].type, "value")
        relus.append(Op("Relu", [piece], [name], {}, name))
        pieces.append(name)
    graph.ops.remove(op)
    del graph.tensors[concat.outputs[0]]
    concat.inputs, concat.outputs = pieces, list(op.outputs)
    position = next(i for i, o in enumerate(graph.ops) if o is concat)
    graph.ops[position:position] = relus
    return True


REWRITES = [drop_pass_through, reduce_mean_to_global_pool, one_window_average_to_global_pool, sum_of_two_is_add,
            relu_through_concat]
