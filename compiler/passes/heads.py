"""Batched products of two run-time tensors (attention: [1, H, M, K] x [1, H, K, N],
YOLO11n's C2PSA) split per head into 2-D MatMuls, which the NPU runs as GEMMs with
a run-time B (compiler/emitter_matmul.py): a Split of each operand along the head
axis, a Reshape of each piece to 2-D, one MatMul per head, and a Concat of the
[1, 1, M, N] results back into the batched output."""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const
from rkc.ir.graph import Graph, Op, Tensor
from rkc.ir.types import TensorType


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


def split_heads(graph: Graph, mm: Op) -> bool:
    heads = _batched_heads(graph, mm)
    if heads is None:
        return False
    out = mm.outputs[0]
    t = graph.tensors[out].type
    m, n = t.shape[2], t.shape[3]
    base = mm.name or out
    ops: list[Op] = []
    a_parts = _per_head(graph, mm.inputs[0], heads, f"{base}.a", ops)
    b_parts = _per_head(graph, mm.inputs[1], heads, f"{base}.b", ops)
    shape4 = add_const(graph, f"{base}.shape4d", np.array([1, 1, m, n], np.int64))
    results = []
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
    return True


REWRITES = [split_heads]
