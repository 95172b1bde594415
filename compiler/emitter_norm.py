"""NPU lowering of normalisation ops (graph op -> emitter operation), beside
compiler/emitter_builders.py's builders: LRN (compiler/npu/lrn.py)."""

from __future__ import annotations

from rkc.compiler.emitter_graph import Refused, npu_feature
from rkc.compiler.npu import api
from rkc.ir.graph import Graph
from rkc.ir.types import PerTensorQuant

INT8_CODES = (-128, 127)
# graph.metadata key: [[tensor, largest |x|], ...] the calibration of an int8 build saw,
# kept for the whole program in fp16 it is weighed against (compiler/build.py)
CALIBRATED_MAX = "calibrated_max"


def calibrated_max(graph: Graph, tensor: str) -> float | None:
    """The largest |x| `tensor` holds by its calibration (the int8 scale's range, or
    the int8 build's when this is its fp16 alternative), or None."""
    q = graph.tensors[tensor].type.quant
    if isinstance(q, PerTensorQuant):
        return float(max(abs(code - q.zero_point) for code in INT8_CODES) * q.scale)
    return dict(graph.metadata.get(CALIBRATED_MAX, [])).get(tensor)


def normalised_maxima(graph: Graph) -> list[list]:
    """[[tensor, largest |x|]] of every calibrated LRN input of `graph` (an int8 build's)."""
    out = []
    for op in graph.ops:
        if op.type == "LRN" and (m := calibrated_max(graph, op.inputs[0])) is not None:
            out.append([op.inputs[0], m])
    return out


def build_lrn(graph: Graph, i: int, tail, precision: str, program: str):
    """LRN in fp16 (its power is a lookup table: fp16 only, Q22), whatever the program's
    precision; the table's range from the input's calibration."""

    op = graph.ops[i]
    if precision != "fp16":
        raise Refused("LRN's power is a lookup table, which runs in fp16 (Q22)")
    x, y = op.inputs[0], op.outputs[0]
    lrn = api.LocalResponseNorm(npu_feature(graph, x, "native", "fp16", precision, program),
                                npu_feature(graph, y, "native", "fp16", precision, program),
                                int(op.attrs["size"]), float(op.attrs.get("alpha", 1e-4)),
                                float(op.attrs.get("beta", 0.75)), float(op.attrs.get("bias", 1.0)),
                                name=f"npu{i}", input_max=calibrated_max(graph, x))
    return lrn, {x: "native"}
