"""Cheap NPU operations alone between CPU ops stay on the CPU.

An NPU group whose work is memory-bound (at most one MAC per element it reads
or writes: an affine map as a 1x1 depthwise convolution, an element-wise op of
two tensors, a lookup-table activation, a global pool) touches each byte of its
inputs and output once. When every input comes from a CPU op and every reader
of its output is a CPU op, the layout conversions in and out touch those very
bytes on the CPU (compiler/cost.py `tensor_bytes`, what compiler/lower.py
charges a conversion), so the CPU would do at least the op's own memory
traffic anyway, and the NPU adds a submission (a kick, ir/npu/perf.py
`KICK_OVERHEAD_S`): it cannot win. A tensor crossing between an int8 and an
fp16 group is converted on the CPU too, so such a neighbour counts as a CPU op.

A model's own inputs and outputs are not CPU ops: a model that is one
element-wise op still runs it on the NPU. Groups inside a segment (with an NPU
neighbour of their dtype) never move.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from compiler import cost
from compiler.npu_lower import NpuGroup
from compiler.ops import OpContext, check_cpu
from compiler.placement import Placement
from ir.graph import Graph

REASON = "kept on the CPU: alone between CPU ops, the conversions would cost more than it saves"


def _memory_bound(graph: Graph, group: NpuGroup) -> bool:
    """At most one MAC per element read or written, in every op of the group."""
    for j in group.ops:
        op = graph.ops[j]
        touched = sum(_elements(graph, t) for t in (*op.present_inputs(), *op.outputs)
                      if graph.tensors[t].kind != "const")
        if cost.op_macs(graph, op) > touched:
            return False
    return True


def _elements(graph: Graph, tensor: str) -> int:
    return int(np.prod(graph.tensors[tensor].type.shape, dtype=np.int64))


def keep_lone_cheap_ops_on_cpu(graph: Graph, placements: list[Placement], groups: dict[int, NpuGroup],
                               precision: str) -> tuple[list[Placement], dict[int, NpuGroup]]:
    """The placements and groups with every memory-bound group that sits alone
    between CPU ops moved to the CPU (until none is left)."""
    placements, groups = list(placements), dict(groups)
    made_by = {o: i for i, op in enumerate(graph.ops) for o in op.outputs}
    read_by: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for name in op.present_inputs():
            read_by.setdefault(name, []).append(i)

    def crosses(i: int, dtype: str) -> bool:
        """Does a tensor between op i and a group of `dtype` need a conversion?"""
        return placements[i].device == "cpu" or groups[i].dtype != dtype

    moved = True
    while moved:
        moved = False
        for group in {id(g): g for g in groups.values()}.values():
            inside = set(group.ops)
            inputs = {t for j in group.ops for t in graph.ops[j].present_inputs()
                      if graph.tensors[t].kind != "const" and made_by.get(t) not in inside}
            readers = [r for j in group.ops for o in graph.ops[j].outputs for r in read_by.get(o, [])
                       if r not in inside]
            alone = (inputs and all(t in made_by and crosses(made_by[t], group.dtype) for t in inputs)
                     and readers and all(crosses(r, group.dtype) for r in readers)
                     and not any(o in graph.outputs for j in group.ops for o in graph.ops[j].outputs))
            if not alone or not _memory_bound(graph, group):
                continue
            for j in group.ops:
                check_cpu(OpContext(graph.ops[j], graph, precision))
                placements[j] = Placement(graph.ops[j], "cpu", REASON)
                del groups[j]
            moved = True
    return placements, groups
