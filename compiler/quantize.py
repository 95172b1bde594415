"""Precision: which number format each NPU tensor gets, as IR quantization
parameters.

* fp16: nothing to annotate; NPU tensors are fp16, weights converted at lowering.
* int8: activations asymmetric per tensor over the range calibration observes
  (`--calib FILE.npz`: one array per model input keyed by input name, with a
  leading sample axis), weights of convolutions and matrix products symmetric
  per output channel (floored to the span the NPU's multiplier resolves). The
  parameters travel on the tensors' types (TensorType.quant), so `rkc ir`-style
  dumps show them and the lowering reads them from there. Which groups then run
  in fp16 instead is compiler/mixed_precision.py's measurement.
* a pre-quantized model (QDQ or QLinear ops) keeps its own scales (compiler/qdq.py);
  `--calib` then fills in the tensors it leaves unquantized.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rkc.compiler.npu.epilogue import PER_CHANNEL_RANGE
from rkc.compiler.qdq import absorb_qdq
from rkc.compiler.reference import run_graph
from rkc.ir.errors import FormatError, UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.types import DType, PerAxisQuant, PerTensorQuant, TensorType

WEIGHT_OPS = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}
def selects_values(op) -> bool:
    """Each output element is one of the input's elements (MaxPool, nearest Resize):
    the output takes the input's scale, so the int8 codes pass through unchanged (the
    CPU step then runs on the NPU's codes in place, compiler/program_steps.py, with no
    dequantize/quantize around it)."""
    return op.type == "MaxPool" or (op.type == "Resize" and op.attrs.get("mode", "nearest") == "nearest"
                                    and op.attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize")


# ops that only move values: every tensor they touch shares one scale (over the union of
# their ranges: nothing clips), so a Concat or Split is slices of one int8 buffer
MOVES_VALUES = frozenset({"Concat", "Split"})
QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
             "ConvInteger"}


def load_calibration(path: str | Path, graph: Graph) -> list[dict[str, np.ndarray]]:
    """The npz as a list of feeds (one per sample)."""
    try:
        data = dict(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a readable .npz calibration file ({exc})") from None
    missing = [n for n in graph.inputs if n not in data]
    if missing:
        raise FormatError(f"{path}: no calibration array for input(s) {', '.join(missing)} "
                          f"(has: {', '.join(data) or 'none'})")
    counts = set()
    for name in graph.inputs:
        want = tuple(graph.tensors[name].type.shape)
        got = data[name].shape
        if got[1:] != want:
            raise FormatError(f"{path}: calibration array {name!r} is {list(got)}, expected "
                              f"[samples, {', '.join(map(str, want))}]")
        counts.add(got[0])
    if len(counts) != 1 or 0 in counts:
        raise FormatError(f"{path}: calibration arrays must have the same, non-zero number of samples")
    n = counts.pop()
    return [{name: data[name][i] for name in graph.inputs} for i in range(n)]


def observe_ranges(graph: Graph, samples: list[dict[str, np.ndarray]]) -> dict[str, tuple[float, float]]:
    ranges: dict[str, tuple[float, float]] = {}

    def observe(name: str, value: np.ndarray) -> None:
        if value.dtype.kind != "f" or not value.size:
            return
        lo, hi = float(np.nanmin(value)), float(np.nanmax(value))
        old = ranges.get(name)
        ranges[name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    for feeds in samples:
        for name in graph.inputs:
            observe(name, np.asarray(feeds[name]))
        run_graph(graph, feeds, observe)
    return ranges


def activation_quant(lo: float, hi: float) -> PerTensorQuant:
    """Asymmetric int8 over the observed range (widened to hold 0 exactly): all
    256 levels serve the values, where a symmetric scale would leave half of them
    unused on a one-sided tensor (after a ReLU or HardSwish). The NPU's int8 path
    takes the zero points (feature offsets, padding value, output offset)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = max(hi - lo, 1e-8) / 255.0
    zero_point = int(np.clip(np.rint(-128.0 - lo / scale), -128, 127))
    return PerTensorQuant(scale, zero_point)


def weight_quant(graph: Graph, name: str, axis: int = 0) -> None:
    """Per-output-channel symmetric int8 scales for a constant weight tensor, none
    below 1/PER_CHANNEL_RANGE of the largest: the NPU's per-channel multiplier
    resolves no wider span (compiler/npu/epilogue.py), and a channel that small
    (typically a dead one left by BatchNorm folding) loses nothing visible at the
    output's per-tensor step by the coarser scale."""
    t = graph.tensors[name]
    w = graph.payloads[t.payload].astype(np.float64)
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scale = np.maximum(np.abs(moved).max(axis=1), 1e-12) / 127.0
    scale = np.maximum(scale, scale.max() / PER_CHANNEL_RANGE)
    graph.payloads[f"{name}.scale"] = scale.astype(np.float32)
    graph.payloads[f"{name}.zp"] = np.zeros(scale.size, np.int8)
    t.type = TensorType(t.type.dtype, t.type.shape, PerAxisQuant(axis, f"{name}.scale", f"{name}.zp"))


def _share_scales(graph: Graph, ranges: dict[str, tuple[float, float]]) -> None:
    """The calibrated tensors a SCALE_SHARING op touches (transitively) get one scale,
    over the union of their ranges."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    for op in graph.ops:
        if op.type not in MOVES_VALUES and not selects_values(op):
            continue
        members = [t for t in (op.inputs[:1] if op.type != "Concat" else op.inputs) + op.outputs
                   if t and t in ranges and graph.tensors[t].type.quant is not None]
        for t in members[1:]:
            parent[find(t)] = find(members[0])
    groups: dict[str, list[str]] = {}
    for t in parent:
        groups.setdefault(find(t), []).append(t)
    for root, members in groups.items():
        members = set(members) | {root}
        quant = activation_quant(min(ranges[t][0] for t in members), max(ranges[t][1] for t in members))
        for t in members:
            tt = graph.tensors[t]
            tt.type = TensorType(tt.type.dtype, tt.type.shape, quant)


def quantize(graph: Graph, precision: str, calib: str | Path | None = None) -> Graph:
    prequantized = any(op.type in QUANT_OPS for op in graph.ops)
    if precision != "int8" and calib is not None:
        raise UnsupportedError("--calib applies to --precision int8 only")
    if prequantized:
        # the model's own integers: constant weights and biases become float constants
        # carrying their scales; in int8, Q/DQ pairs on activations become scales too
        absorb_qdq(graph, fold_activations=precision == "int8")
    if precision != "int8":
        return graph
    if calib is None and not prequantized:
        raise UnsupportedError("--precision int8 needs --calib FILE.npz (or a model quantized with QDQ/QLinear ops)")
    if calib is not None:
        # calibrate what the model does not quantize itself
        ranges = observe_ranges(graph, load_calibration(calib, graph))
        calibrated = {}
        for name, (lo, hi) in ranges.items():
            t = graph.tensors[name]
            if t.type.dtype in (DType.FP32, DType.FP16) and t.type.quant is None:
                t.type = TensorType(t.type.dtype, t.type.shape, activation_quant(lo, hi))
                calibrated[name] = (lo, hi)
        _share_scales(graph, calibrated)
    for op in graph.ops:
        index = WEIGHT_OPS.get(op.type)
        if index is None or len(op.inputs) <= index:
            continue
        w = graph.tensors[op.inputs[index]]
        if w.kind == "const" and w.type.quant is None and w.type.dtype.is_float:
            axis = {"Conv": 0, "ConvTranspose": 1}.get(op.type)  # the output channels ([I, O, kH, kW])
            if axis is None:
                axis = 0 if op.type == "Gemm" and op.attrs.get("transB") else len(w.type.shape) - 1
            weight_quant(graph, w.name, axis)
    graph.metadata["quantized"] = "int8 calibrated" if calib is not None else "int8 (the model's own scales)"
    return graph
