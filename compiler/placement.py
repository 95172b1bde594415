"""Where each op runs, and why: the NPU when every NPU constraint of its
OpSpec holds (and it has a lowering), else the CPU, which must have a kernel
for it (else the model cannot compile, and the error names the op)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ops import OpContext, check_cpu, npu_verdict
from ir.graph import Graph, Op


@dataclass
class Placement:
    op: Op
    device: str  # "npu" or "cpu"
    reason: str


def place_ops(graph: Graph, precision: str, cpu_only: bool = False) -> list[Placement]:
    result = []
    for op in graph.ops:
        ctx = OpContext(op, graph, precision)
        if cpu_only:
            on_npu, reason = False, "placed on the CPU by request (--cpu-only)"
        else:
            on_npu, reason = npu_verdict(ctx)
        if not on_npu:
            check_cpu(ctx)
        result.append(Placement(op, "npu" if on_npu else "cpu", reason))
    return result
