"""Per-channel affine maps y = x * a + b on a [1, C, H, W] map as 1x1 depthwise
convolutions, so the NPU runs them (a convolution's DPU epilogue then also takes
the bias Add, ReLU or Clip after them):

* Mul / Div by a constant scalar or per-channel vector (weights a, or 1/a),
* Add / Sub of such a constant (weights 1 or -1, bias b); after a Conv that
  folds them, Div and Sub become the Mul and Add it folds,
* BatchNormalization the Conv before it could not absorb (a = g / sqrt(v + eps),
  b = beta - mean * a),
* HardSigmoid = clip(alpha * x + beta, 0, 1): rewritten as Mul, Add, Clip(0, 1),
  which the rules above and the Conv folds (compiler/passes/fold_batchnorm.py)
  then place; exact, where a lookup table only approximates it.

A constant after a Conv that reads only it is left to the Conv (folded into its
weights, or fused as its bias), and these run after the pattern fusions
(GELU, LayerNorm, HardSwish), whose Mul / Add they would otherwise break up.
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, only_consumer, producer
from rkc.compiler.passes.fold_batchnorm import batchnorm_scale
from rkc.ir.graph import Graph, Op, Tensor
from rkc.ir.types import TensorType

FOLDS_CONSTANTS = ("Conv", "Gemm", "MatMul")  # a constant after these folds into their weights / bias


def _feature_map(graph: Graph, name: str) -> tuple[int, np.dtype] | None:
    """(channels, numpy dtype) of a static float [1, C, H, W] value, else None."""
    t = graph.tensors.get(name)
    if t is None or t.kind == "const" or not t.type.is_static or len(t.type.shape) != 4 or t.type.shape[0] != 1:
        return None
    dtype = t.type.dtype.numpy
    return (int(t.type.shape[1]), dtype) if np.dtype(dtype).kind == "f" else None


def _channel_vector(value: np.ndarray | None, channels: int) -> np.ndarray | None:
    """A constant broadcasting to one value per channel of [1, C, H, W], as [C] (float64)."""
    if value is None or value.ndim > 4 or value.dtype.kind != "f":
        return None
    shape = (1,) * (4 - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,)).copy()


def _folds_into_producer(graph: Graph, name: str) -> bool:
    up = producer(graph, name)
    return up is not None and up.type in FOLDS_CONSTANTS and only_consumer(graph, name) is not None


def _as_depthwise(graph: Graph, op: Op, x: str, scale: np.ndarray, shift: np.ndarray | None) -> None:
    """Replace `op` (same output) by Conv(x, scale, shift) with group = channels."""
    channels, dtype = _feature_map(graph, x)
    base = op.name or op.outputs[0]
    inputs = [x, add_const(graph, f"{base}.dw_scale", scale.reshape(channels, 1, 1, 1).astype(dtype))]
    if shift is not None:
        inputs.append(add_const(graph, f"{base}.dw_shift", shift.astype(dtype)))
    position = next(i for i, o in enumerate(graph.ops) if o is op)
    graph.ops[position] = Op("Conv", inputs, list(op.outputs),
                             {"group": channels, "kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0]},
                             op.name)


def binary_affine(graph: Graph, op: Op) -> bool:
    if op.type not in ("Mul", "Div", "Add", "Sub") or len(op.inputs) != 2:
        return False
    for position, (x, c) in enumerate((op.inputs, op.inputs[::-1])):
        fm = _feature_map(graph, x)
        if fm is None or tuple(graph.tensors[op.outputs[0]].type.shape) != tuple(graph.tensors[x].type.shape):
            continue
        vec = _channel_vector(graph.const_value(c), fm[0])
        if vec is None or (op.type == "Div" and (position == 1 or np.any(vec == 0))):
            continue
        if _folds_into_producer(graph, x):
            # the Conv before it takes the constant (weights or bias), in the forms it folds
            if op.type == "Div" or (op.type == "Sub" and position == 0):
                base = op.name or op.outputs[0]
                value = 1 / vec if op.type == "Div" else -vec
                op.type = "Mul" if op.type == "Div" else "Add"
                op.inputs = [x, add_const(graph, f"{base}.c", value.reshape(1, -1, 1, 1).astype(fm[1]))]
                return True
            return False
        ones = np.ones(fm[0])
        if op.type == "Mul":
            _as_depthwise(graph, op, x, vec, None)
        elif op.type == "Div":
            _as_depthwise(graph, op, x, 1 / vec, None)
        elif op.type == "Add":
            _as_depthwise(graph, op, x, ones, vec)
        else:  # Sub: x - c, or c - x
            _as_depthwise(graph, op, x, -ones if position == 1 else ones, vec if position == 1 else -vec)
        return True
    return False


def batchnorm_affine(graph: Graph, op: Op) -> bool:
    if op.type != "BatchNormalization" or len(op.outputs) != 1 or op.attrs.get("training_mode", 0):
        return False
    fm = _feature_map(graph, op.inputs[0])
    params = [graph.const_value(n) for n in op.inputs[1:5]]
    if fm is None or any(p is None for p in params):
        return False
    gamma, beta, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
    scale = batchnorm_scale(op, gamma, var)
    _as_depthwise(graph, op, op.inputs[0], scale, beta - mean * scale)
    return True


def hard_sigmoid_affine(graph: Graph, op: Op) -> bool:
    if op.type != "HardSigmoid" or _feature_map(graph, op.inputs[0]) is None:
        return False
    x, out = op.inputs[0], op.outputs[0]
    t = graph.tensors[out].type
    dtype = t.dtype.numpy
    base = op.name or out
    alpha, beta = float(op.attrs.get("alpha", 0.2)), float(op.attrs.get("beta", 0.5))
    scaled, shifted = f"{base}.scaled", f"{base}.shifted"
    for name in (scaled, shifted):
        graph.tensors[name] = Tensor(name, TensorType(t.dtype, t.shape), "value")
    position = next(i for i, o in enumerate(graph.ops) if o is op)
    graph.ops[position:position + 1] = [
        Op("Mul", [x, add_const(graph, f"{base}.alpha", np.array(alpha, dtype))], [scaled], {}, f"{base}.mul"),
        Op("Add", [scaled, add_const(graph, f"{base}.beta", np.array(beta, dtype))], [shifted], {}, f"{base}.add"),
        Op("Clip", [shifted, add_const(graph, f"{base}.lo", np.array(0, dtype)),
                    add_const(graph, f"{base}.hi", np.array(1, dtype))], [out], {}, op.name),
    ]
    return True


def hard_swish_product(graph: Graph, op: Op) -> bool:
    """HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2): the HardSigmoid becomes an
    affine map with a clip (above), the product an element-wise Mul of two
    same-shaped tensors. Only for calibrated int8 programs (INT8_REWRITES): the
    DPU has no int8 lookup table, and in fp16 a table fused after the convolution
    costs no task of its own."""
    if op.type != "HardSwish" or _feature_map(graph, op.inputs[0]) is None:
        return False
    x, out = op.inputs[0], op.outputs[0]
    base = op.name or out
    gate = f"{base}.gate"
    graph.tensors[gate] = Tensor(gate, graph.tensors[out].type, "value")
    position = next(i for i, o in enumerate(graph.ops) if o is op)
    graph.ops[position:position + 1] = [
        Op("HardSigmoid", [x], [gate], {"alpha": 1 / 6, "beta": 0.5}, f"{base}.gate"),
        Op("Mul", [x, gate], [out], {}, op.name),
    ]
    return True


REWRITES = [hard_sigmoid_affine, batchnorm_affine, binary_affine]
# int8 programs calibrated after the passes (every new tensor gets a scale)
INT8_REWRITES = [hard_swish_product]
