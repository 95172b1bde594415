"""Small graph edits the rewrites share."""

from __future__ import annotations

import numpy as np

from rkc.ir.graph import Graph, Op
from rkc.ir.types import DType, TensorType


def consumers(graph: Graph, tensor: str) -> list[Op]:
    return [op for op in graph.ops if tensor in op.inputs]


def only_consumer(graph: Graph, tensor: str) -> Op | None:
    """The single op reading `tensor`, if exactly one does and it is not a graph output."""
    users = consumers(graph, tensor)
    if len(users) != 1 or tensor in graph.outputs:
        return None
    return users[0]


def producer(graph: Graph, tensor: str) -> Op | None:
    for op in graph.ops:
        if tensor in op.outputs:
            return op
    return None


def replace_uses(graph: Graph, old: str, new: str) -> None:
    """Make every reader of `old` read `new` (graph outputs included)."""
    for op in graph.ops:
        op.inputs = [new if i == old else i for i in op.inputs]
    graph.outputs = [new if o == old else o for o in graph.outputs]


def rename_output(graph: Graph, op: Op, old: str, new: str) -> None:
    """Let `op` produce `new` (an existing tensor name being freed) instead of `old`."""
    t = graph.tensors.pop(old)
    t.name = new
    graph.tensors[new] = t
    op.outputs = [new if o == old else o for o in op.outputs]
    for other in graph.ops:
        other.inputs = [new if i == old else i for i in other.inputs]


def remove_op(graph: Graph, op: Op) -> None:
    graph.ops.remove(op)
    for out in op.outputs:
        if out not in graph.outputs and not consumers(graph, out):
            graph.tensors.pop(out, None)


def add_const(graph: Graph, base: str, value: np.ndarray) -> str:
    name = base
    k = 0
    while name in graph.tensors:
        k += 1
        name = f"{base}.{k}"
    value = np.ascontiguousarray(value)
    graph.add_const(name, TensorType(DType.from_numpy(value.dtype), tuple(value.shape)), value)
    return name


def remove_dead(graph: Graph) -> None:
    """Drop ops whose outputs nobody reads, then unreferenced constants and payloads."""
    changed = True
    while changed:
        changed = False
        used = {i for op in graph.ops for i in op.inputs} | set(graph.outputs)
        for op in list(graph.ops):
            if not any(o in used for o in op.outputs):
                graph.ops.remove(op)
                for o in op.outputs:
                    graph.tensors.pop(o, None)
                changed = True
    used = {i for op in graph.ops for i in op.inputs} | set(graph.outputs)
    for name in [n for n, t in graph.tensors.items() if t.kind == "const" and n not in used]:
        del graph.tensors[name]
    refs = {t.payload for t in graph.tensors.values() if t.payload}
    for t in graph.tensors.values():
        q = t.type.quant
        if q is not None and hasattr(q, "scale") and isinstance(q.scale, str):
            refs |= {q.scale, q.zero_point}
    for key in [k for k in graph.payloads if k not in refs]:
        del graph.payloads[key]
