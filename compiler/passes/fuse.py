"""Pattern fusions that exporters spell out op by op:

* Erf GELU:  x * 0.5 * (1 + erf(x / sqrt(2)))  (any association of the two
  multiplies, x / sqrt(2) or x * (1 / sqrt(2)))  -> Gelu
* HardSwish: x * clip(x + 3, 0, 6) / 6 (or * (1/6))   -> HardSwish
* SiLU:      x * sigmoid(x) (how exporters spell nn.SiLU) -> Swish (ONNX opset 24,
  alpha 1): one activation a convolution's epilogue can absorb, where the
  Sigmoid and the Mul each read the convolution's output
* LayerNorm: mean = ReduceMean(x); d = x - mean; v = ReduceMean(d ** 2);
  y = d / sqrt(v + eps) [* gamma] [+ beta] over trailing axes -> LayerNormalization
"""

from __future__ import annotations

import math

import numpy as np

from rkc.compiler.passes.edit import add_const, only_consumer, producer
from rkc.ir.graph import Graph, Op


def _scalar(graph: Graph, name: str) -> float | None:
    v = graph.const_value(name)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(-1)[0])


def _other(op: Op, name: str) -> str | None:
    """The other input of a binary op, given one."""
    if len(op.inputs) != 2 or name not in op.inputs:
        return None
    return op.inputs[1] if op.inputs[0] == name else op.inputs[0]


def _near(a: float | None, b: float, tol: float = 1e-3) -> bool:
    return a is not None and abs(a - b) <= tol * abs(b)


def _replace_chain(graph: Graph, remove: list[Op], last: Op, new_type: str, inputs: list[str], attrs: dict,
                   name: str | None) -> None:
    """Replace the ops `remove` (ending in `last`) by one op producing last's output.
    It takes last's place in the list, which keeps the list in dependency order
    (every removed op is an ancestor of `last`)."""
    out = last.outputs[0]
    position = next(i for i, op in enumerate(graph.ops) if op is last) - (len(remove) - 1)
    for op in remove:
        graph.ops.remove(op)
        for o in op.outputs:
            if o != out:
                graph.tensors.pop(o, None)
    graph.ops.insert(position, Op(new_type, inputs, [out], attrs, name))


def fuse_erf_gelu(graph: Graph, erf: Op) -> bool:
    if erf.type != "Erf":
        return False
    scaled = producer(graph, erf.inputs[0])
    if scaled is None or scaled.type not in ("Div", "Mul") or only_consumer(graph, scaled.outputs[0]) is not erf:
        return False
    x = scaled.inputs[0]
    factor = _scalar(graph, scaled.inputs[1])
    if not (_near(factor, math.sqrt(2)) if scaled.type == "Div" else _near(factor, 1 / math.sqrt(2))):
        return False
    add = only_consumer(graph, erf.outputs[0])
    if add is None or add.type != "Add" or not _near(_scalar(graph, _other(add, erf.outputs[0]) or ""), 1.0):
        return False
    m1 = only_consumer(graph, add.outputs[0])
    if m1 is None or m1.type != "Mul":
        return False
    partner = _other(m1, add.outputs[0])
    if partner == x:  # (x * (1 + erf)) * 0.5
        m2 = only_consumer(graph, m1.outputs[0])
        if m2 is None or m2.type != "Mul" or not _near(_scalar(graph, _other(m2, m1.outputs[0]) or ""), 0.5):
            return False
        chain, last = [scaled, erf, add, m1, m2], m2
    else:  # (x * 0.5) * (1 + erf)
        half = producer(graph, partner or "")
        if (half is None or half.type != "Mul" or _other(half, x) is None
                or not _near(_scalar(graph, _other(half, x)), 0.5) or only_consumer(graph, half.outputs[0]) is not m1):
            return False
        chain, last = [scaled, erf, add, half, m1], m1
    _replace_chain(graph, chain, last, "Gelu", [x], {}, erf.name)
    return True


def fuse_layernorm(graph: Graph, mean_op: Op) -> bool:
    if mean_op.type != "ReduceMean":
        return False
    x = mean_op.inputs[0]
    rank = len(graph.tensors[x].type.shape)
    axes = _axes(graph, mean_op)
    if axes is None or not axes or sorted(a % rank for a in axes) != list(range(rank - len(axes), rank)):
        return False
    users = [op for op in graph.ops if mean_op.outputs[0] in op.inputs]
    if len(users) != 1 or users[0].type != "Sub" or users[0].inputs != [x, mean_op.outputs[0]]:
        return False
    sub = users[0]
    d = sub.outputs[0]
    d_users = [op for op in graph.ops if d in op.inputs]
    pow_op = next((op for op in d_users if op.type == "Pow" and _near(_scalar(graph, op.inputs[1]), 2.0)), None)
    if pow_op is None:
        pow_op = next((op for op in d_users if op.type == "Mul" and op.inputs == [d, d]), None)
    div = next((op for op in d_users if op.type == "Div" and op.inputs[0] == d), None)
    if pow_op is None or div is None or len(d_users) != 2 or d in graph.outputs:
        return False
    var = only_consumer(graph, pow_op.outputs[0])
    if var is None or var.type != "ReduceMean" or _axes(graph, var) != axes:
        return False
    add = only_consumer(graph, var.outputs[0])
    eps = _scalar(graph, _other(add, var.outputs[0]) or "") if add is not None and add.type == "Add" else None
    if eps is None:
        return False
    sqrt = only_consumer(graph, add.outputs[0])
    if sqrt is None or sqrt.type != "Sqrt" or only_consumer(graph, sqrt.outputs[0]) is not div \
            or div.inputs[1] != sqrt.outputs[0]:
        return False
    chain, last = [mean_op, sub, pow_op, var, add, sqrt, div], div
    norm_shape = graph.tensors[x].type.shape[rank - len(axes):]
    dtype = graph.tensors[x].type.dtype.numpy
    gamma = beta = None
    mul = only_consumer(graph, div.outputs[0])
    if mul is not None and mul.type == "Mul":
        g = graph.const_value(_other(mul, div.outputs[0]) or "")
        if g is not None and g.size and np.broadcast_shapes(g.shape, norm_shape) == tuple(norm_shape) \
                and g.ndim <= len(axes):
            gamma, chain, last = g, [*chain, mul], mul
            bias = only_consumer(graph, mul.outputs[0])
            if bias is not None and bias.type == "Add":
                b = graph.const_value(_other(bias, mul.outputs[0]) or "")
                if b is not None and b.ndim <= len(axes) and \
                        np.broadcast_shapes(b.shape, norm_shape) == tuple(norm_shape):
                    beta, chain, last = b, [*chain, bias], bias
    base = mean_op.name or x
    gamma_name = add_const(graph, f"{base}.ln_scale",
                           np.broadcast_to(np.ones(norm_shape, dtype) if gamma is None else gamma, norm_shape).astype(dtype))
    inputs = [x, gamma_name]
    if beta is not None:
        inputs.append(add_const(graph, f"{base}.ln_bias", np.broadcast_to(beta, norm_shape).astype(dtype)))
    _replace_chain(graph, chain, last, "LayerNormalization", inputs,
                   {"axis": -len(axes), "epsilon": eps}, mean_op.name)
    return True


def fuse_hard_swish(graph: Graph, add: Op) -> bool:
    if add.type != "Add" or len(add.inputs) != 2:
        return False
    x = next((i for i in add.inputs if _near(_scalar(graph, _other(add, i) or ""), 3.0)), None)
    if x is None or graph.const_value(x) is not None:
        return False
    clip = only_consumer(graph, add.outputs[0])
    if clip is None or clip.type != "Clip" or len(clip.inputs) < 3 or \
            _scalar(graph, clip.inputs[1]) != 0.0 or _scalar(graph, clip.inputs[2]) != 6.0:
        return False
    mul = only_consumer(graph, clip.outputs[0])
    if mul is None or mul.type != "Mul" or _other(mul, clip.outputs[0]) != x:
        return False
    scale = only_consumer(graph, mul.outputs[0])
    if scale is None or not ((scale.type == "Div" and scale.inputs[0] == mul.outputs[0]
                              and _near(_scalar(graph, scale.inputs[1]), 6.0))
                             or (scale.type == "Mul" and _near(_scalar(graph, _other(scale, mul.outputs[0]) or ""),
                                                               1 / 6))):
        return False
    _replace_chain(graph, [add, clip, mul, scale], scale, "HardSwish", [x], {}, add.name)
    return True


def fuse_silu(graph: Graph, mul: Op) -> bool:
    if mul.type != "Mul" or len(mul.inputs) != 2:
        return False
    for x in mul.inputs:
        sig = producer(graph, _other(mul, x) or "")
        if sig is not None and sig.type == "Sigmoid" and sig.inputs[0] == x and x != sig.outputs[0] \
                and only_consumer(graph, sig.outputs[0]) is mul:
            _replace_chain(graph, [sig, mul], mul, "Swish", [x], {}, mul.name)
            return True
    return False


def _axes(graph: Graph, op: Op) -> list[int] | None:
    if len(op.inputs) > 1 and op.inputs[1]:
        v = graph.const_value(op.inputs[1])
        return None if v is None else [int(a) for a in v.reshape(-1)]
    a = op.attrs.get("axes")
    return None if a is None else [int(v) for v in a]


REWRITES = [fuse_erf_gelu, fuse_layernorm, fuse_hard_swish, fuse_silu]
