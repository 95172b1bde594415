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
# feature map in place): a fixed part (the step between two NPU submissions and the
# kernel's setup) plus a part per input element, by dtype. Fitted to the kernel's CPU
# time alone on 9 pool shapes of SqueezeNet, Inception v1, ResNet-50 and YOLO's SPPF
# (41 K to 1.2 M elements; int8 0.030-0.111 ms, fp16 0.062-0.306 ms), plus 25 us a step
# (YOLOv8n's SPPF pools: 0.087 ms each in the pipeline, 0.062 alone): this machine's
# x86 cores, docs/notes/2026-12-06-vision-host-time-3.md "Stop 46". bench/max_pool_host.py
# measures the whole step on the same shapes and fits these figures: since the pool writes
# the next map in place (stop 47), int8 51 us + 0.079 ns, fp16 89 us + 0.19 ns an element
# in one process at load 12 (the step before: 78 + 0.097, 140 + 0.20), within the spread
# of separate runs (+-50 % at that load) of the figures here, which stand
# (docs/notes/2026-12-07-small-models-host.md). After stop 50's fused kernel the same script fits
# int8 27 us + 0.03 ns, fp16 42 + 0.09 (load 4.5); not taken: with them Inception v1-ppu's plan
# puts its int8 stem pool on the CPU behind an int8 -> fp16 edge the plan prices below its cost,
# for no measured gain (docs/notes/2026-12-07-cnn-host-rows-2.md).
MAX_POOL_HOST_S = {"int8": (55e-6, 0.07e-9), "fp16": (75e-6, 0.2e-9)}


def max_pool_host_seconds(dtype: str, input_elements: int) -> float:
    """The modelled host CPU time of one max pool over `input_elements` of `dtype`."""
    fixed, per_element = MAX_POOL_HOST_S[dtype]
    return fixed + per_element * input_elements
