"""NPU lowering of a MatMul of two run-time tensors (graph op -> emitter
operation), beside compiler/emitter_builders.py's builders: attention's products
(YOLO11n's C2PSA). B is not known at compile time, so the host writes it in the
1x1 weight layout the CNA reads ("native-weights", ir/npu/geometry.py) and the
GEMM takes it as `api.Gemm.b_buffer`, as the LLM path's attention products do
(compiler/llm/npu_attention.py)."""

from __future__ import annotations

import numpy as np

from rkc.compiler.emitter_graph import Refused, device_dtype, dpu_epilogue, npu_feature, weights_name
from rkc.compiler.npu import api
from rkc.ir.graph import Graph

RUN_TIME_B = "native-weights"


def run_time_b_matmul(graph: Graph, i: int, tail, precision: str, program: str) -> tuple[api.Gemm, dict[str, str]]:
    """A[M, K] x B[K, N] with B a run-time 2-D tensor, in fp16 only: an int8 B would
    need its column sums at compile time (the zero-point correction, compiler/npu/gemm.py)."""
    op = graph.ops[i]
    dtype = device_dtype(precision)
    if dtype != "fp16":
        raise Refused("a product of two run-time tensors runs in fp16 (int8 needs B's column sums "
                       "at compile time)")
    a, b = op.inputs[0], op.inputs[1]
    k, n = (int(d) for d in graph.tensors[b].type.shape[-2:])
    m = int(graph.tensors[a].type.shape[-2])
    epi = dpu_epilogue(graph, tail, tail.bias, dtype, precision, program, "native-gemm", 1.0, None)
    gemm = api.Gemm(npu_feature(graph, a, "native-gemm", dtype, precision, program),
                    np.broadcast_to(np.float16(0), (k, n)),  # B's shape and dtype only (b_buffer)
                    npu_feature(graph, tail.output, "native-gemm", dtype, precision, program), m,
                    epilogue=epi, name=f"npu{i}", b_buffer=weights_name(b, dtype, program))
    reads = {a: "native-gemm", b: RUN_TIME_B}
    if tail.residual:
        reads[tail.residual] = "native-gemm"
    return gemm, reads
