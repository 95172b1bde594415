"""Quantization kernels: (De)QuantizeLinear (per tensor, per axis, blocked),
QLinearConv, QLinearMatMul. Arithmetic in float64; rounding half to even,
saturating, as ONNX specifies."""

from __future__ import annotations

import numpy as np

from rkc.ir.types import DType
from rkc.runtime.kernels.conv import conv_integer


def _param(p, x: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """Broadcast a scale/zero point (scalar, per axis or blocked) against x."""
    p = np.asarray(p, np.float64)
    if p.ndim == 0 or p.size == 1:
        return p.reshape(())
    axis = axis % x.ndim
    if block_size:
        return np.repeat(p, block_size, axis=axis).take(range(x.shape[axis]), axis=axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    return p.reshape(shape)


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0, output_dtype=None,
                    precision=0):
    if y_zero_point is not None:
        dtype = y_zero_point.dtype
    elif output_dtype:
        dtype = DType(output_dtype).numpy
    else:
        dtype = np.dtype(np.uint8)
    zp = 0.0 if y_zero_point is None else _param(y_zero_point, x, axis, block_size)
    q = np.rint(x.astype(np.float64) / _param(y_scale, x, axis, block_size)) + zp
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=None):
    zp = 0.0 if x_zero_point is None else _param(x_zero_point, x, axis, block_size)
    out_dtype = np.asarray(x_scale).dtype
    return ((x.astype(np.float64) - zp) * _param(x_scale, x, axis, block_size)).astype(out_dtype)


def _requantize(acc: np.ndarray, scale: np.ndarray, y_scale, y_zero_point) -> np.ndarray:
    q = np.rint(acc * scale / float(np.asarray(y_scale).reshape(-1)[0]))
    dtype = np.asarray(y_zero_point).dtype
    q = q + float(np.asarray(y_zero_point).reshape(-1)[0])
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, **attrs):
    acc = conv_integer(x, w, x_zero_point, w_zero_point, **attrs).astype(np.float64)
    if b is not None:
        acc = acc + b.astype(np.float64).reshape(1, -1, *([1] * (x.ndim - 2)))
    ws = np.asarray(w_scale, np.float64).reshape(-1)
    scale = float(np.asarray(x_scale).reshape(-1)[0]) * (ws.reshape(1, -1, *([1] * (x.ndim - 2))) if ws.size > 1
                                                        else ws[0])
    return _requantize(acc, scale, y_scale, y_zero_point)


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    az = np.asarray(a_zero_point, np.float64)
    az = az.reshape(-1, 1) if az.size > 1 else az.reshape(())
    bz = np.asarray(b_zero_point, np.float64)
    acc = np.matmul(a.astype(np.float64) - az, b.astype(np.float64) - bz.reshape(-1) if bz.size > 1 else
                    b.astype(np.float64) - bz.reshape(()))
    sa = np.asarray(a_scale, np.float64)
    sa = sa.reshape(-1, 1) if sa.size > 1 else sa.reshape(())
    sb = np.asarray(b_scale, np.float64)
    sb = sb.reshape(-1) if sb.size > 1 else sb.reshape(())
    return _requantize(acc, sa * sb, y_scale, y_zero_point)


KERNELS = {
    "QuantizeLinear": quantize_linear, "DequantizeLinear": dequantize_linear,
    "QLinearConv": qlinear_conv, "QLinearMatMul": qlinear_matmul,
}
