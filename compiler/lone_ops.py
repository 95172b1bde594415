"""Cheap NPU operations alone between CPU ops stay on the CPU.

An NPU group is moved to the CPU when all of these hold:

* it is memory-bound: at most one MAC per element it reads or writes (an affine
  map as a 1x1 depthwise convolution, an element-wise op of two tensors, a
  lookup-table activation, a global pool), and the CPU's kernel for it is too
  (not an LRN, whose power per element is the CPU's arithmetic);
* it is alone between CPU ops: every input comes from a CPU op and only CPU ops
  read its output. A tensor crossing between an int8 and an fp16 group is
  converted on the CPU too, so such a neighbour counts as a CPU op; a Concat or
  Split (slices of one NPU buffer) does not;
* in the byte counts of compiler/cost.py, the CPU running its ops
  (`op_ddr_bytes`, constants aside) moves no more bytes than the layout
  conversions it saves (`tensor_bytes`, what compiler/program_steps.py charges one):
  the CPU then does no more memory work than the conversions alone would, and
  the NPU's submission (its tasks and a kick, ir/npu/perf.py) is saved. A
  group of several ops (a convolution with its ReLU) is one pass on the NPU but
  one pass per op on the CPU: there the trade would need a CPU time model, so it
  stays on the NPU.

A model's own inputs and outputs are not CPU ops: a model that is one
element-wise op still runs it on the NPU. Groups with an NPU neighbour of their
dtype (inside a segment) never move.
"""

from __future__ import annotations

import numpy as np

from rkc.compiler import cost
from rkc.compiler.emitter_ops import NpuGroup
from rkc.compiler.ops import OpContext, check_cpu
from rkc.compiler.placement import Placement
from rkc.compiler.quantize import MOVES_VALUES
from rkc.ir.graph import Graph

REASON = "kept on the CPU: alone between CPU ops, the conversions would cost more than it saves"


# ops whose CPU kernel computes a power or an exponential per element: bound by arithmetic on the
# CPU, whatever their bytes (ZFNet's LRN over 96x110x110: 2.1 ms on the CPU, against ~0.3 ms for
# the conversion pass its NPU run costs)
CPU_ARITHMETIC = frozenset({"LRN"})


def _memory_bound(graph: Graph, group: NpuGroup) -> bool:
    """At most one MAC per element read or written, in every op of the group, and no op the CPU
    computes by arithmetic per element (CPU_ARITHMETIC)."""
    for j in group.ops:
        op = graph.ops[j]
        if op.type in CPU_ARITHMETIC:
            return False
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
        """Does a tensor between op i and a group of `dtype` need a conversion? Not
        for a Concat or Split, which becomes slices of one NPU buffer
        (compiler/program_steps.py)."""
        if placements[i].device == "cpu":
            return graph.ops[i].type not in MOVES_VALUES
        return groups[i].dtype != dtype

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
            # one conversion saved per input no other NPU reader of this dtype needs, and the output's
            saved = sum(cost.tensor_bytes(graph, t) for t in inputs
                        if all(r in inside or crosses(r, group.dtype) for r in read_by[t]))
            saved += sum(cost.tensor_bytes(graph, graph.ops[j].outputs[0]) for j in group.ops
                         if any(r not in inside for r in read_by.get(graph.ops[j].outputs[0], [])))
            on_cpu = sum(cost.tensor_bytes(graph, t) for j in group.ops
                         for t in (*graph.ops[j].present_inputs(), *graph.ops[j].outputs)
                         if graph.tensors[t].kind != "const")
            if on_cpu > saved:
                continue
            for j in group.ops:
                check_cpu(OpContext(graph.ops[j], graph, precision))
                placements[j] = Placement(graph.ops[j], "cpu", REASON)
                del groups[j]
            moved = True
    return placements, groups
