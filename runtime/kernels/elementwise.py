"""Elementwise kernels: unary activations, binary arithmetic (numpy broadcasting
is ONNX's multidirectional broadcasting), variadic Sum/Max/Min/Mean, Cast, Where."""

from __future__ import annotations

import math

import numpy as np

from rkc.ir.types import DType

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """numpy has no erf: math.erf per element (exact; fast enough for the CPU
    side, where GELU is normally fused and runs elsewhere)."""
    return _erf(x.astype(np.float64)).astype(np.float64).astype(x.dtype)


def _like(x: np.ndarray, y) -> np.ndarray:
    return np.asarray(y).astype(x.dtype, copy=False)


def relu(x):
    return np.maximum(x, _like(x, 0))


def leaky_relu(x, alpha=0.01):
    return np.where(x >= 0, x, x * _like(x, alpha))


def sigmoid(x):
    with np.errstate(over="ignore"):
        return _like(x, 1.0 / (1.0 + np.exp(-x.astype(np.float64))))


def hard_sigmoid(x, alpha=0.2, beta=0.5):
    return _like(x, np.clip(x.astype(np.float64) * alpha + beta, 0.0, 1.0))


def swish(x, alpha=1.0):
    """ONNX Swish (opset 24): x * sigmoid(alpha * x); SiLU at alpha 1."""
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        return _like(x, x64 / (1.0 + np.exp(-float(alpha) * x64)))


def hard_swish(x):
    return _like(x, x * np.clip(x.astype(np.float64) / 6.0 + 0.5, 0.0, 1.0))


def gelu(x, approximate="none"):
    xd = x.astype(np.float64)
    if approximate == "tanh":
        y = 0.5 * xd * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (xd + 0.044715 * xd ** 3)))
    elif approximate == "none":
        y = 0.5 * xd * (1.0 + erf(xd / math.sqrt(2.0)))
    else:
        raise ValueError(f"Gelu approximate={approximate!r}")
    return _like(x, y)


def elu(x, alpha=1.0):
    with np.errstate(over="ignore"):
        return _like(x, np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0).astype(np.float64))))


def selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    xd = x.astype(np.float64)
    return _like(x, np.where(xd > 0, gamma * xd, gamma * alpha * np.expm1(np.minimum(xd, 0))))


def clip(x, min=None, max=None):  # noqa: A002 - ONNX names (attributes before opset 11, inputs after)
    lo = None if min is None else _like(x, min)
    hi = None if max is None else _like(x, max)
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def softplus(x):
    return _like(x, np.logaddexp(0.0, x.astype(np.float64)))


def _float_unary(fn):
    def kernel(x):
        with np.errstate(all="ignore"):
            return _like(x, fn(x.astype(np.float64) if x.dtype.kind == "f" else x))
    kernel.__name__ = fn.__name__
    return kernel


def _binary(fn):
    def kernel(a, b):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return _like(a, fn(a, b))
    return kernel


def div(a, b):
    if a.dtype.kind in "iu":
        with np.errstate(divide="ignore"):
            return _like(a, np.trunc(a.astype(np.float64) / b.astype(np.float64)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return a / b


def pow_(a, b):
    with np.errstate(all="ignore"):
        return _like(a, np.power(a.astype(np.float64), b.astype(np.float64)))


def _variadic(fn):
    def kernel(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return _like(xs[0], out) if np.ndim(out) >= 0 else out
    return kernel


def mean(*xs):
    return _like(xs[0], _variadic(np.add)(*[x.astype(np.float64) for x in xs]) / len(xs))


def identity(x):
    return x


def cast(x, to, saturate=1):
    """`to` is an IR dtype name (the frontend translates ONNX's enum)."""
    dtype = DType(to).numpy
    if dtype.kind in "iu" and x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.trunc(x).astype(dtype)
    return x.astype(dtype)


def where(cond, a, b):
    return np.where(cond, a, b)


def dropout(x, ratio=None, training_mode=None, seed=None):
    """Inference: Dropout is the identity (the mask output is all true)."""
    return x, np.ones(x.shape, dtype=bool)


KERNELS = {
    "Relu": relu, "LeakyRelu": leaky_relu, "Sigmoid": sigmoid, "HardSigmoid": hard_sigmoid,
    "HardSwish": hard_swish, "Swish": swish, "Gelu": gelu, "Elu": elu, "Selu": selu, "Clip": clip, "Softplus": softplus,
    "Tanh": _float_unary(np.tanh), "Erf": _float_unary(erf), "Exp": _float_unary(np.exp),
    "Log": _float_unary(np.log), "Sqrt": _float_unary(np.sqrt), "Abs": np.abs, "Neg": np.negative,
    "Reciprocal": _float_unary(np.reciprocal), "Floor": np.floor, "Ceil": np.ceil,
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": div,
    "Pow": pow_, "Sum": _variadic(np.add), "Max": _variadic(np.maximum), "Min": _variadic(np.minimum),
    "Mean": mean, "Identity": identity, "Cast": cast, "Where": where, "Dropout": dropout,
}
