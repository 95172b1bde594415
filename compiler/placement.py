"""Where each op runs, and why.

1. Static checks: every NPU constraint of the op's OpSpec (compiler/ops)
   must hold; the first that fails is the reason it stays on the CPU.
2. The emitter decides the rest: compiler/npu_lower.py builds each NPU
   operation (an anchor plus what its epilogue absorbs) and emits it once; an
   op the emitter refuses stays on the CPU with the emitter's message.
The CPU must have a kernel for every op left there (else the model cannot
compile, and the error names the op)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.npu_lower import NpuGroup, plan_groups
from compiler.ops import OpContext, check_cpu, npu_verdict
from ir.graph import Graph, Op


@dataclass
class Placement:
    op: Op
    device: str  # "npu" or "cpu"
    reason: str


def place_ops(graph: Graph, precision: str, cpu_only: bool = False) -> tuple[list[Placement], dict[int, NpuGroup]]:
    verdicts = []
    for op in graph.ops:
        if cpu_only:
            verdicts.append((False, "placed on the CPU by request (--cpu-only)"))
        else:
            verdicts.append(npu_verdict(OpContext(op, graph, precision)))
    groups, refusals = plan_groups(graph, precision, lambda i: verdicts[i][0])
    result = []
    for i, op in enumerate(graph.ops):
        if i in groups:
            g = groups[i]
            why = "NPU" if g.anchor == i else f"fused into the epilogue of {graph.ops[g.anchor].describe()}"
            result.append(Placement(op, "npu", why if g.anchor != i else "all NPU constraints hold"))
            continue
        ok, reason = verdicts[i]
        if ok:
            reason = refusals.get(i, "runs on the NPU only fused into a preceding convolution or matrix product")
        check_cpu(OpContext(op, graph, precision))
        result.append(Placement(op, "cpu", reason))
    return result, groups
