"""Pre-quantized ONNX models (QDQ and QOperator formats) as quantization
parameters on a float graph, the form the int8 NPU lowering reads.

* QLinearConv / QLinearMatMul become DequantizeLinear -> Conv / MatMul ->
  QuantizeLinear with the op's own scales and zero points. (ConvInteger /
  MatMulInteger stay CPU ops: their exact int32 sums would need int32 NPU
  tensors, and in practice their input scale comes from DynamicQuantizeLinear at
  run time, which no compiled program can take.)
* DequantizeLinear of a constant (weights, int32 biases) becomes the dequantized
  float constant, its scales (per tensor or per axis) recorded on the tensor:
  the lowering quantizes it back to exactly the model's integers.
* With `fold_activations`, a QuantizeLinear -> DequantizeLinear pair on an
  activation disappears: the float tensor carries the pair's scale and zero
  point (an 8-bit tensor on the NPU), readers of the DequantizeLinear read it.

uint8 tensors are held as int8 with the zero point moved by -128 (the same
values, rounding and saturation: real = s * (q - zp) = s * ((q - 128) - (zp - 128))).
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, consumers, producer, remove_dead, rename_output
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph, Op, Tensor
from rkc.ir.types import DType, PerAxisQuant, PerTensorQuant, TensorType
from rkc.runtime.kernels.quant import dequantize_linear

INTEGER_8 = (DType.INT8, DType.UINT8)


def _int8_zero_point(zp: np.ndarray, dtype: DType) -> np.ndarray:
    zp = np.asarray(zp, np.int64)
    return zp - 128 if dtype is DType.UINT8 else zp


def _insert(graph: Graph, index: int, op_type: str, inputs: list[str], out: str, out_type: TensorType,
            attrs: dict | None = None, name: str = "") -> Op:
    op = graph.add_op(op_type, inputs, [(out, out_type)], attrs or {}, name=name)
    graph.ops.remove(op)
    graph.ops.insert(index, op)
    return op


def _expand_qlinear(graph: Graph) -> None:
    """QLinearConv / QLinearMatMul -> DequantizeLinear -> Conv / MatMul ->
    QuantizeLinear, in place."""
    for op in list(graph.ops):
        if op.type not in ("QLinearConv", "QLinearMatMul"):
            continue
        if any(graph.const_value(op.inputs[k]) is None for k in (1, 3, 4, 6)):
            continue  # an activation x activation product, or runtime scales: the exact CPU kernel
        i = graph.ops.index(op)
        graph.ops.remove(op)
        y = op.outputs[0]
        y_type = graph.tensors[y].type
        x, xs, xz, w, ws, wz, ys, yz = (list(op.inputs) + [""] * 9)[:8]
        bias = op.inputs[8] if op.type == "QLinearConv" and len(op.inputs) > 8 else ""
        base = op.name or y
        ft = TensorType(DType.FP32, graph.tensors[x].type.shape)
        xf = _fresh(graph, f"{x}.dq")
        _insert(graph, i, "DequantizeLinear", [x, xs, xz], xf, ft, name=f"{base}.dq_x")
        wt = TensorType(DType.FP32, graph.tensors[w].type.shape)
        wf = _fresh(graph, f"{w}.dq")
        axis = {"axis": 0} if "Conv" in op.type else {"axis": 1}
        _insert(graph, i + 1, "DequantizeLinear", [w, ws, wz], wf, wt, axis, name=f"{base}.dq_w")
        inputs = [xf, wf]
        k = i + 2
        if bias:
            bf = _fresh(graph, f"{bias}.dq")
            w_scale = graph.const_value(ws)
            x_scale = graph.const_value(xs)
            bvalue = graph.const_value(bias)
            if w_scale is None or x_scale is None or bvalue is None:
                raise UnsupportedError(f"op {op.describe()}: needs constant scales and bias")
            bias_scale = (np.asarray(x_scale, np.float64).reshape(()) * np.asarray(w_scale, np.float64).reshape(-1))
            add = add_const(graph, bf, (bvalue.astype(np.float64) * bias_scale).astype(np.float32))
            inputs.append(add)
        yf_type = TensorType(DType.FP32, y_type.shape)
        yf = _fresh(graph, f"{y}.real")
        core = "Conv" if "Conv" in op.type else "MatMul"
        attrs = dict(op.attrs) if core == "Conv" else {}
        _insert(graph, k, core, inputs, yf, yf_type, attrs, name=op.name)
        graph.tensors.pop(y)
        _insert(graph, k + 1, "QuantizeLinear", [yf, ys, yz], y, y_type, name=f"{base}.q_y")


def _fresh(graph: Graph, base: str) -> str:
    name, k = base, 0
    while name in graph.tensors:
        k += 1
        name = f"{base}.{k}"
    return name


def _dequantize_constants(graph: Graph) -> None:
    """DequantizeLinear of a constant -> the float constant, scales recorded."""
    for op in list(graph.ops):
        if op.type != "DequantizeLinear":
            continue
        q, s = graph.const_value(op.inputs[0]), graph.const_value(op.inputs[1])
        zp_name = op.inputs[2] if len(op.inputs) > 2 else ""
        zp = graph.const_value(zp_name) if zp_name else np.zeros((), np.int64)
        if q is None or s is None or zp is None or op.attrs.get("block_size", 0):
            continue
        qdtype = graph.tensors[op.inputs[0]].type.dtype
        axis = int(op.attrs.get("axis", 1))
        value = dequantize_linear(q, s, zp if zp_name else None, axis=axis).astype(np.float32)
        out = op.outputs[0]
        t = graph.tensors[out]
        graph.ops.remove(op)
        t.kind, t.payload = "const", f"{out}.value"
        graph.payloads[t.payload] = value
        quant = None
        if qdtype in INTEGER_8:
            # weights: the lowering multiplies (q - zp), which is what rint(value / s) gives back
            s64 = np.asarray(s, np.float64)
            if s64.size == 1:
                quant = PerTensorQuant(float(s64.reshape(-1)[0]), 0)
            else:
                graph.payloads[f"{out}.scale"] = s64.reshape(-1).astype(np.float32)
                graph.payloads[f"{out}.zp"] = np.zeros(s64.size, np.int8)
                quant = PerAxisQuant(axis % max(1, value.ndim), f"{out}.scale", f"{out}.zp")
        t.type = TensorType(DType.FP32, tuple(value.shape), quant)


def _per_tensor(graph: Graph, op: Op) -> PerTensorQuant | None:
    s = graph.const_value(op.inputs[1])
    zp_name = op.inputs[2] if len(op.inputs) > 2 else ""
    zp = graph.const_value(zp_name) if zp_name else np.zeros((), np.uint8)
    if s is None or zp is None or np.size(s) != 1 or np.size(zp) != 1:
        return None
    dtype = graph.tensors[zp_name].type.dtype if zp_name else DType.UINT8
    if dtype not in INTEGER_8:
        return None
    return PerTensorQuant(float(np.reshape(s, -1)[0]), int(_int8_zero_point(np.reshape(zp, -1)[0], dtype)))


LAYOUT_OPS = {"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity"}


def _sink_dequantize(graph: Graph) -> None:
    """Q -> Flatten/Reshape/... -> DQ (QOperator models move integers through
    layout ops): dequantize before the layout op instead, so the pair meets."""
    for dq in [op for op in graph.ops if op.type == "DequantizeLinear"]:
        while _per_tensor(graph, dq) is not None:
            p = producer(graph, dq.inputs[0])
            if p is None or p.type not in LAYOUT_OPS or p.outputs[0] in graph.outputs \
                    or [c for c in consumers(graph, p.outputs[0])] != [dq]:
                break
            x, mid, out = p.inputs[0], p.outputs[0], dq.outputs[0]
            xf = _fresh(graph, f"{x}.dq")
            graph.tensors[xf] = Tensor(xf, TensorType(DType.FP32, graph.tensors[x].type.shape))
            graph.tensors[out].type = TensorType(DType.FP32, graph.tensors[mid].type.shape)
            graph.tensors.pop(mid)
            dq.inputs[0], dq.outputs = x, [xf]
            p.inputs[0], p.outputs = xf, [out]
            graph.ops.remove(dq)
            graph.ops.insert(graph.ops.index(p), dq)


def _fold_activation_pairs(graph: Graph) -> None:
    """float t -> Q -> DQ -> readers  ==>  t (annotated) -> readers."""
    for dq in list(graph.ops):
        if dq.type != "DequantizeLinear" or dq not in graph.ops:
            continue
        q = producer(graph, dq.inputs[0])
        if q is None or q.type != "QuantizeLinear":
            continue
        qa, qb = _per_tensor(graph, q), _per_tensor(graph, dq)
        if qa is None or qa != qb:
            continue
        t = q.inputs[0]
        tt = graph.tensors[t]
        if not tt.type.dtype.is_float or (tt.type.quant is not None and tt.type.quant != qa):
            continue
        tt.type = TensorType(tt.type.dtype, tt.type.shape, qa)
        out = dq.outputs[0]
        graph.ops.remove(dq)
        if out in graph.outputs and producer(graph, t) is not None and t not in graph.outputs:
            # keep the model's output name: its producer writes it directly
            graph.tensors.pop(out)
            rename_output(graph, producer(graph, t), t, out)
            t = out
        else:
            for other in graph.ops:
                other.inputs = [t if i == out else i for i in other.inputs]
            graph.outputs = [t if o == out else o for o in graph.outputs]
            graph.tensors.pop(out, None)
        if not consumers(graph, q.outputs[0]) and q.outputs[0] not in graph.outputs:
            graph.ops.remove(q)
            graph.tensors.pop(q.outputs[0], None)


def _through_layout_ops(graph: Graph) -> None:
    """A reshaped tensor holds the same values: it keeps its source's scale."""
    for op in graph.ops:
        if op.type in LAYOUT_OPS and op.inputs:
            q = graph.tensors[op.inputs[0]].type.quant
            out = graph.tensors[op.outputs[0]]
            if isinstance(q, PerTensorQuant) and out.type.quant is None and out.type.dtype.is_float:
                out.type = TensorType(out.type.dtype, out.type.shape, q)


def absorb_qdq(graph: Graph, fold_activations: bool) -> Graph:
    _expand_qlinear(graph)
    _dequantize_constants(graph)
    if fold_activations:
        _sink_dequantize(graph)
        _fold_activation_pairs(graph)
        _through_layout_ops(graph)
    remove_dead(graph)
    return graph
