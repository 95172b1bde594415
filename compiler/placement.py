"""Where each op runs, and why.

1. Static checks: every NPU constraint of the op's OpSpec (compiler/ops)
   must hold; the first that fails is the reason it stays on the CPU.
2. The emitter decides the rest: compiler/emitter_builders.py builds each NPU
   operation (an anchor plus what its epilogue absorbs) and emits it once; an
   op the emitter refuses stays on the CPU with the emitter's message.
The CPU must have a kernel for every op left there (else the model cannot
compile, and the error names the op)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from rkc.compiler.emitter_graph import EMIT_OPTIONS
from rkc.compiler.emitter_ops import NpuGroup, plan_groups
from rkc.compiler.npu import api
from rkc.compiler.ops import OpContext, check_cpu, npu_verdict
from rkc.ir.graph import Graph, Op


@dataclass
class Placement:
    op: Op
    device: str  # "npu" or "cpu"
    reason: str
    dtype: str | None = None  # what an NPU op computes in ("int8" / "fp16")


def place_ops(graph: Graph, precision: str, cpu_only: bool = False,
              fp16_anchors: Mapping[int, str] | None = None, emit_options: api.EmitOptions = EMIT_OPTIONS
              ) -> tuple[list[Placement], dict[int, NpuGroup]]:
    """`fp16_anchors`: in an int8 program, the ops whose groups compute in fp16,
    with why (compiler/mixed_precision.py); `emit_options`: the emitter's (the cores used)."""
    fp16_anchors = fp16_anchors or {}
    verdicts = []
    for op in graph.ops:
        if cpu_only:
            verdicts.append((False, "placed on the CPU by request (--cpu-only)"))
        else:
            verdicts.append(npu_verdict(OpContext(op, graph, precision)))
    groups, refusals = plan_groups(graph, precision, lambda i: verdicts[i][0], frozenset(fp16_anchors),
                                   emit_options)
    result = []
    for i, op in enumerate(graph.ops):
        if i in groups:
            g = groups[i]
            if g.anchor != i:
                why = f"fused into the epilogue of {graph.ops[g.anchor].describe()}"
            elif i in fp16_anchors and g.dtype == "fp16" and precision == "int8":
                why = f"all NPU constraints hold; fp16: {fp16_anchors[i]}"
            else:
                why = "all NPU constraints hold"
            result.append(Placement(op, "npu", why, g.dtype))
            continue
        ok, reason = verdicts[i]
        if ok:
            reason = refusals.get(i, "runs on the NPU only fused into a preceding convolution, matrix "
                                          "product or element-wise op")
        check_cpu(OpContext(op, graph, precision))
        result.append(Placement(op, "cpu", reason))
    return result, groups
