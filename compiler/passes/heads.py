"""Batched products of two run-time tensors (attention: [1, H, M, K] x [1, H, K, N],
YOLO11n's C2PSA) split per head into 2-D MatMuls, which the NPU runs as GEMMs with
a run-time B (compiler/emitter_matmul.py): a Split of each operand along the head
axis, a Reshape of each piece to 2-D, one MatMul per head, and a Concat of the
[1, 1, M, N] results back into the batched output. What reads that Concat per
head (a Softmax over the keys, a Transpose that keeps the head axis, a Split back
into the heads) then moves into the heads, so the scores never exist whole. A product
weighing values by the transposed probabilities is then computed transposed
(`transposed_product`)."""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, consumers, only_consumer, producer, remove_op, replace_uses
from rkc.ir.graph import Graph, Op, Tensor
from rkc.ir.types import TensorType


SPLIT = "heads.split"  # graph.metadata: how many batched products split_heads cut per head


def _batched_heads(graph: Graph, op: Op) -> int | None:
    """H of a MatMul [1, H, M, K] x [1, H, K, N] of two run-time tensors, else None."""
    if op.type != "MatMul" or len(op.inputs) != 2 or any(graph.const_value(t) is not None for t in op.inputs):
        return None
    a, b = (graph.tensors[t].type for t in op.inputs)
    if not (a.is_static and b.is_static) or len(a.shape) != 4 or len(b.shape) != 4:
        return None
    if a.shape[0] != 1 or b.shape[0] != 1 or a.shape[1] != b.shape[1] or a.shape[3] != b.shape[2]:
        return None
    return int(a.shape[1])


def _new(graph: Graph, base: str, dtype, shape) -> str:
    name, k = base, 0
    while name in graph.tensors:
        k += 1
        name = f"{base}.{k}"
    graph.tensors[name] = Tensor(name, TensorType(dtype, tuple(int(d) for d in shape)), "value")
    return name


def _per_head(graph: Graph, tensor: str, heads: int, base: str, ops: list[Op]) -> list[str]:
    """`tensor` [1, H, R, C] as H run-time [R, C] matrices."""
    t = graph.tensors[tensor].type
    rows, cols = t.shape[2], t.shape[3]
    pieces = [tensor]
    if heads > 1:
        pieces = [_new(graph, f"{base}.h{h}", t.dtype, (1, 1, rows, cols)) for h in range(heads)]
        sizes = add_const(graph, f"{base}.sizes", np.ones(heads, np.int64))
        ops.append(Op("Split", [tensor, sizes], pieces, {"axis": 1}, f"{base}.split"))
    shape = add_const(graph, f"{base}.shape2d", np.array([rows, cols], np.int64))
    out = []
    for h, piece in enumerate(pieces):
        out.append(_new(graph, f"{base}.h{h}.2d", t.dtype, (rows, cols)))
        ops.append(Op("Reshape", [piece, shape], [out[-1]], {}, f"{base}.h{h}.reshape"))
    return out


def _scalar_after(graph: Graph, mm: Op) -> tuple[Op, float] | None:
    """The Mul by a scalar constant that is the product's only reader (attention's
    1/sqrt(d) scale), and the scalar."""
    out = mm.outputs[0]
    users = consumers(graph, out)
    if len(users) != 1 or out in graph.outputs or users[0].type != "Mul":
        return None
    other = next((t for t in users[0].inputs if t != out), None)
    value = None if other is None else graph.const_value(other)
    return None if value is None or np.size(value) != 1 else (users[0], float(np.reshape(value, -1)[0]))


def split_heads(graph: Graph, mm: Op) -> bool:
    heads = _batched_heads(graph, mm)
    if heads is None:
        return False
    scaled = _scalar_after(graph, mm)
    if scaled is not None:
        # the scale moves onto B's small per-head pieces ([K, N], K = the key size),
        # before the product: else it stays a Mul of the whole [1, H, M, N] scores. B,
        # the GEMM's run-time weights, is a host gather anyway; A may then be a slice
        # of its producer's map (program_steps' gather: a view)
        mul, scale = scaled
        graph.ops.remove(mul)
        replace_uses(graph, mul.outputs[0], mm.outputs[0])
        del graph.tensors[mul.outputs[0]]
    out = mm.outputs[0]
    t = graph.tensors[out].type
    m, n = t.shape[2], t.shape[3]
    base = mm.name or out
    ops: list[Op] = []
    a_parts = _per_head(graph, mm.inputs[0], heads, f"{base}.a", ops)
    b_parts = _per_head(graph, mm.inputs[1], heads, f"{base}.b", ops)
    shape4 = add_const(graph, f"{base}.shape4d", np.array([1, 1, m, n], np.int64))
    results = []
    if scaled is not None:
        factor = add_const(graph, f"{base}.scale", np.array(scale, t.dtype.numpy))
        for h, part in enumerate(b_parts):
            b_parts[h] = _new(graph, f"{part}.scaled", t.dtype, graph.tensors[part].type.shape)
            ops.append(Op("Mul", [part, factor], [b_parts[h]], {}, f"{base}.h{h}.scale"))
    for h in range(heads):
        product = _new(graph, f"{base}.h{h}.product", t.dtype, (m, n))
        ops.append(Op("MatMul", [a_parts[h], b_parts[h]], [product], {}, f"{base}.h{h}"))
        if heads == 1:
            ops.append(Op("Reshape", [product, shape4], [out], {}, f"{base}.reshape"))
            break
        results.append(_new(graph, f"{base}.h{h}.out", t.dtype, (1, 1, m, n)))
        ops.append(Op("Reshape", [product, shape4], [results[-1]], {}, f"{base}.h{h}.out"))
    if heads > 1:
        ops.append(Op("Concat", results, [out], {"axis": 1}, f"{base}.concat"))
    position = next(i for i, o in enumerate(graph.ops) if o is mm)
    graph.ops[position:position + 1] = ops
    graph.metadata[SPLIT] = graph.metadata.get(SPLIT, 0) + 1
    return True


def _head_concat(graph: Graph, tensor: str) -> Op | None:
    """The Concat along axis 1 of [1, 1, ...] pieces producing `tensor`, read by one op only."""
    concat = producer(graph, tensor)
    if concat is None or concat.type != "Concat" or only_consumer(graph, tensor) is None:
        return None
    rank = len(graph.tensors[tensor].type.shape)
    if int(concat.attrs.get("axis", 0)) % rank != 1:
        return None
    if any(graph.tensors[t].type.shape[:2] != (1, 1) for t in concat.inputs):
        return None
    return concat


def _per_head_op(graph: Graph, op: Op) -> bool:
    """Softmax over another axis than the heads', or a Transpose keeping axes 0 and 1."""
    rank = len(graph.tensors[op.inputs[0]].type.shape)
    if op.type == "Softmax":
        return int(op.attrs.get("axis", -1)) % rank != 1
    if op.type == "Transpose":
        perm = list(op.attrs.get("perm", range(rank)[::-1]))
        return perm[:2] == [0, 1]
    return False


def sink_into_heads(graph: Graph, op: Op) -> bool:
    """op(Concat(heads)) -> Concat(op(head) for each head)."""
    if op.type not in ("Softmax", "Transpose") or len(op.outputs) != 1 or not _per_head_op(graph, op):
        return False
    concat = _head_concat(graph, op.inputs[0])
    if concat is None:
        return False
    t = graph.tensors[op.outputs[0]].type
    pieces, ops = [], []
    for h, part in enumerate(concat.inputs):
        shape = (1, 1, *t.shape[2:])
        pieces.append(_new(graph, f"{op.name or op.outputs[0]}.h{h}", t.dtype, shape))
        ops.append(Op(op.type, [part], [pieces[-1]], dict(op.attrs), f"{op.name or op.outputs[0]}.h{h}"))
    ops.append(Op("Concat", pieces, [op.outputs[0]], {"axis": 1}, f"{op.name or op.outputs[0]}.concat"))
    position = next(i for i, o in enumerate(graph.ops) if o is op)
    graph.ops[position:position + 1] = ops
    graph.ops.remove(concat)
    del graph.tensors[op.inputs[0]]
    return True


def split_of_concat(graph: Graph, op: Op) -> bool:
    """Split(Concat(heads)) back into the same heads -> the heads themselves."""
    if op.type != "Split":
        return False
    concat = _head_concat(graph, op.inputs[0])
    if concat is None or len(op.outputs) != len(concat.inputs):
        return False
    rank = len(graph.tensors[op.inputs[0]].type.shape)
    if int(op.attrs.get("axis", 0)) % rank != 1:
        return False
    if any(graph.tensors[a].type.shape != graph.tensors[b].type.shape for a, b in zip(concat.inputs, op.outputs)):
        return False
    graph.ops.remove(op)
    for piece, out in zip(concat.inputs, op.outputs):
        replace_uses(graph, out, piece)
        del graph.tensors[out]
    remove_op(graph, concat)  # read by the Split alone: the heads' readers see only their own (transposed_product)
    return True


def _probabilities_swapped(graph: Graph, b: str) -> tuple[str, list[Op]] | None:
    """(P, the ops between) when the 2-D `b` [K, N] is attention's probabilities P [1.., N, K]
    (a Softmax's output) with its last two axes swapped: a Transpose [and a Reshape to 2-D],
    each read only by the next op."""
    moves = []
    op = producer(graph, b)
    if op is not None and op.type == "Reshape":
        moves.append(op)
        op = producer(graph, op.inputs[0])
    if op is None or op.type != "Transpose" or only_consumer(graph, op.outputs[0]) is None:
        return None
    p = op.inputs[0]
    shape = graph.tensors[p].type.shape
    rank = len(shape)
    if list(op.attrs.get("perm", range(rank)[::-1])) != [*range(rank - 2), rank - 1, rank - 2] \
            or any(d != 1 for d in shape[:-2]) or only_consumer(graph, p) is not op:
        return None
    softmax = producer(graph, p)
    return (p, [op, *moves]) if softmax is not None and softmax.type == "Softmax" else None


def transposed_product(graph: Graph, mm: Op) -> bool:
    """O = A P^T (attention's second product: A [M, K] the values V, P [N, K] the probabilities
    of N queries over K keys) -> O = (P A^T)^T. P is then the GEMM's A, read in the layout
    the scores came out of the first product in (the softmax writes its rows where it read
    them: no transposing pass over the N x K probabilities), A^T the run-time weights (a host
    gather either way), and P A^T [N, M] comes out as GEMM atoms of M channels over N
    positions: a head's channel slice of the map that puts the heads back together, where
    the Transpose back is a view (program_steps' gathers)."""
    if mm.type != "MatMul" or len(mm.inputs) != 2 or any(graph.const_value(t) is not None for t in mm.inputs):
        return False
    a, b = mm.inputs
    ta, tb = graph.tensors[a].type, graph.tensors[b].type
    if not (ta.is_static and tb.is_static) or len(ta.shape) != 2 or len(tb.shape) != 2:
        return False
    found = _probabilities_swapped(graph, b) if only_consumer(graph, b) is mm else None
    if found is None:
        return False
    p, moves = found
    (m, k), n = ta.shape, tb.shape[1]
    base = mm.name or mm.outputs[0]
    ops: list[Op] = []
    if len(graph.tensors[p].type.shape) != 2:
        p2d = _new(graph, f"{base}.p", tb.dtype, (n, k))
        ops.append(Op("Reshape", [p, add_const(graph, f"{base}.p.shape", np.array([n, k], np.int64))], [p2d], {},
                      f"{base}.p"))
        p = p2d
    a_t = _new(graph, f"{base}.a.t", ta.dtype, (k, m))
    product = _new(graph, f"{base}.transposed", ta.dtype, (n, m))
    ops += [Op("Transpose", [a], [a_t], {"perm": [1, 0]}, f"{base}.a.t"),
            Op("MatMul", [p, a_t], [product], {}, base),
            Op("Transpose", [product], [mm.outputs[0]], {"perm": [1, 0]}, f"{base}.back")]
    position = next(i for i, o in enumerate(graph.ops) if o is mm)
    graph.ops[position:position + 1] = ops
    for op in moves:
        graph.ops.remove(op)
        del graph.tensors[op.outputs[0]]
    return True


REWRITES = [split_heads, sink_into_heads, split_of_concat, transposed_product]
