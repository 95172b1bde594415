"""Per-op cost figures of the graph for reports: MACs and DDR bytes of CPU ops
and layout conversions. NPU figures come from the emitter's per-task counters
and the one performance model (ir/npu/perf.py)."""

from __future__ import annotations

import numpy as np

from rkc.ir.graph import Graph, Op


def _numel(shape) -> int:
    return int(np.prod([d for d in shape if isinstance(d, int)], dtype=np.int64))


def tensor_bytes(graph: Graph, name: str) -> int:
    t = graph.tensors[name].type
    return _numel(t.shape) * t.dtype.itemsize if t.is_static else 0


def op_macs(graph: Graph, op: Op) -> int:
    out = graph.tensors[op.outputs[0]].type
    if not out.is_static:
        return 0
    if op.type in ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose"):
        w = graph.tensors[op.inputs[3 if op.type == "QLinearConv" else 1]].type.shape
        per_output = _numel(w[1:])
        if op.type == "ConvTranspose":
            x = graph.tensors[op.inputs[0]].type.shape
            return _numel(x) * _numel(w[1:])
        return _numel(out.shape) * per_output
    if op.type in ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"):
        a = graph.tensors[op.inputs[0]].type.shape
        k = a[0] if op.type == "Gemm" and op.attrs.get("transA") else a[-1]
        return _numel(out.shape) * int(k)
    if op.type in ("AveragePool", "MaxPool", "LpPool"):  # one operation per window element
        return _numel(out.shape) * _numel(op.attrs.get("kernel_shape", [1]))
    if op.type in ("GlobalAveragePool", "GlobalMaxPool"):  # one per input element
        return _numel(graph.tensors[op.inputs[0]].type.shape)
    return _numel(out.shape)


def op_ddr_bytes(graph: Graph, op: Op) -> int:
    return sum(tensor_bytes(graph, n) for n in [*op.present_inputs(), *op.outputs])


# The host CPU time of a max pool the CPU runs (runtime/kernels/pool_jit.py on the NPU
# feature map in place): a fixed part (the step between two NPU submissions: its closure,
# the BOs' bracket, the kernel's setup) plus a part per input element, by dtype. Fitted
# by bench/max_pool_host.py (least squares over 9 pool shapes of SqueezeNet, Inception
# v1, ResNet-50 and YOLO's SPPF, 41 K to 1.1 M input elements, 3x3/1, 3x3/2 and 5x5/1;
# each the median process CPU time of 60 calls of the whole step on the null device, the
# median of 3 rounds with shapes and dtypes alternating), at load 4.5 on this machine's
# x86 cores, after the fused pool kernel (stop 50): int8 0.025-0.063 ms, fp16
# 0.039-0.148 ms; each shape within 20 % of the fit
# (docs/notes/2026-12-07-cnn-host-rows-2.md; stop 47's figures, 55 + 0.07 and 75 + 0.2,
# were the kernel before two rewrites).
MAX_POOL_HOST_S = {"int8": (27e-6, 0.03e-9), "fp16": (42e-6, 0.09e-9)}


def max_pool_host_seconds(dtype: str, input_elements: int) -> float:
    """The modelled host CPU time of one max pool over `input_elements` of `dtype`."""
    fixed, per_element = MAX_POOL_HOST_S[dtype]
    return fixed + per_element * input_elements
