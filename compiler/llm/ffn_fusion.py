"""The gated FFN in one NPU segment (issue 37 item 2): gate and up products,
the activation and the gating multiply on the DPU, feeding the down product.

    gate GEMM -> BN index multiply -> LUT (SiLU / GELU-tanh) -> fp16 s
    up GEMM   -> EW multiply by s (the ERDMA operand)       -> fp16 h
    down GEMM reads h

Every stage is a documented, simulator-modelled NPU operation on fp16 data:
the LUT epilogue of a GEMM (hw-matmul.md 5, dpu-lut-activation.md; the
simulator's reading is Q18) and the conv-main EW multiply with an fp16 ERDMA
operand (gregordinary's 0x108003C4 word). The LUT on an int8 datapath is not
documented (Q22), and an int8 product's dequantization needs a per-token row
scale the DPU has no operand for (BS/BN are per channel), so int8 and int4
FFNs keep their boundary: only FFNs whose three weights are fp16 fuse.

The tables approximate the activation to ~1e-3 absolute (compiler/npu/lut.py),
against the CPU's float32 activation: the quality gate is the teacher-forced KL
of tools/llm_quant_eval.py (docs/llm.md), not bit identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rkc.compiler.npu import api, formats
from rkc.ir.graph import Graph

# the frontend's activation ops -> the LUT function that computes them (compiler/npu/lut.FUNCTIONS)
ACTIVATION_LUT = {"SiLU": "silu", "GeluTanh": "gelu_tanh"}


def operand_rows(m: int) -> int:
    """Rows of the map act(gate) is written in. The EW operand's surfaces must
    span at least EW_STRIDE_MIN atoms (Q16: Mesa and gregordinary program
    max(W*H, 12); below, the upper surfaces mis-stride), so a map of fewer rows
    (decode's 4) is written as the top rows of a 12-row map: the DPU reads it as
    the M tile of a taller operand, the notch geometry every tiled product uses."""
    return max(api.gemm_rows(m), formats.EW_STRIDE_MIN)


@dataclass(frozen=True)
class GatedFfn:
    """Op indices of one FFN: down(act(gate(x)) * up(x))."""

    gate: int
    act: int
    up: int
    mul: int
    down: int

    @property
    def inner(self) -> tuple[int, int]:
        """The element-wise ops the products absorb."""
        return self.act, self.mul


def gated_ffns(graph: Graph, fuses: Callable[[str], bool]) -> list[GatedFfn]:
    """Every gated FFN of `graph` whose intermediates nothing else reads and
    whose three weights `fuses` accepts."""
    producer = {o: i for i, op in enumerate(graph.ops) for o in op.outputs}
    users: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for name in op.present_inputs():
            users.setdefault(name, []).append(i)
    outputs = set(graph.outputs)

    def only_user(tensor: str, op: int) -> bool:
        return users.get(tensor) == [op] and tensor not in outputs

    found = []
    for mul, op in enumerate(graph.ops):
        if op.type != "Mul" or len(op.inputs) != 2:
            continue
        act, up = producer.get(op.inputs[0]), producer.get(op.inputs[1])
        if act is None or up is None or graph.ops[act].type not in ACTIVATION_LUT or graph.ops[up].type != "Linear":
            continue
        gate = producer.get(graph.ops[act].inputs[0])
        if gate is None or graph.ops[gate].type != "Linear" or graph.ops[gate].inputs[0] != graph.ops[up].inputs[0]:
            continue
        readers = users.get(op.outputs[0], [])
        if len(readers) != 1 or graph.ops[readers[0]].type != "Linear" or \
                graph.ops[readers[0]].inputs[0] != op.outputs[0]:
            continue
        down = readers[0]
        if not (only_user(graph.ops[gate].outputs[0], act) and only_user(graph.ops[act].outputs[0], mul)
                and only_user(graph.ops[up].outputs[0], mul) and op.outputs[0] not in outputs):
            continue
        if all(fuses(graph.ops[i].inputs[1]) for i in (gate, up, down)):
            found.append(GatedFfn(gate, act, up, mul, down))
    return found
