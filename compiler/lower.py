"""Lower partitioned steps into program steps of the rkbin.

* a CPU step runs one kernel (runtime/kernels) on host tensors;
* an NPU segment becomes one NPU step (jobs of tasks from the emitters, see
  compiler/npu_lower.py), preceded by explicit conversion steps for every
  tensor entering it (host row layout -> NPU native layout and precision) and
  followed by conversions for every tensor leaving it.

Graph-kind agnostic: it reads only the ir.Graph and the partition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from compiler import cost
from compiler.module_builder import ModuleBuilder, quant_dict
from compiler.partition import Step as PartStep
from ir.errors import UnsupportedError
from ir.graph import Graph, PayloadRef
from ir.program import Step


@dataclass
class LowerStats:
    cpu_steps: int = 0
    npu_tasks: int = 0


def _json_attrs(op) -> dict:
    for key, value in op.attrs.items():
        if isinstance(value, PayloadRef):
            raise UnsupportedError(f"op {op.describe()}: attribute {key} refers to a payload; "
                                   "the CPU kernel cannot take it")
    attrs = dict(op.attrs)
    json.dumps(attrs)  # everything a CPU step carries must be plain data
    return attrs


def lower_program(graph: Graph, steps: list[PartStep], builder: ModuleBuilder, precision: str,
                  program: str = "main", progress=lambda stage: None) -> LowerStats:
    stats = LowerStats()
    placed: set[str] = set()

    def host(name: str) -> None:
        """Make sure `name` exists on the host side (a host tensor or a host constant)."""
        if name in placed or not name:
            return
        t = graph.tensors[name]
        if t.kind == "const":
            builder.host_const(name, graph.payloads[t.payload])
        else:
            builder.host_tensor(name, t.type.shape, t.type.dtype, quant_dict(t.type.quant, graph.payloads))
        placed.add(name)

    for name in graph.inputs:
        host(name)
    out_steps: list[Step] = []
    for step in steps:
        if step.device == "npu":
            from compiler.npu_lower import lower_segment

            stats.npu_tasks += lower_segment(graph, step, builder, precision, program, out_steps, host)
            continue
        op = graph.ops[step.ops[0]]
        for name in op.present_inputs():
            host(name)
        for name in op.outputs:
            host(name)
        macs = cost.op_macs(graph, op)
        out_steps.append(Step(
            kind="cpu", name=op.name or f"{op.type}:{op.outputs[0]}", op=op.type,
            inputs=list(op.inputs), outputs=list(op.outputs), attrs=_json_attrs(op),
            stats={"op": op.type, "macs": macs, "ddr_bytes": cost.op_ddr_bytes(graph, op)}))
        stats.cpu_steps += 1
    for name in graph.outputs:
        host(name)
    builder.program(program, list(graph.inputs), list(graph.outputs), out_steps)
    return stats
