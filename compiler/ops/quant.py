"""QuantizeLinear / DequantizeLinear. In a QDQ model they carry the model's
own scales, which the quantize pass moves onto the tensors they annotate; left
over, they run on the CPU at segment edges."""

from __future__ import annotations

from rkc.compiler.ops import OpSpec
from rkc.compiler.ops.constraints import cpu_only
from rkc.compiler.ops.rules import need
from rkc.ir.types import DType, TensorType


def quantize_shape(ctx):
    x = need(ctx)
    zp = ctx.type(2)
    if zp is not None:
        dtype = zp.dtype
    else:
        dtype = DType(ctx.attr("output_dtype")) if ctx.attr("output_dtype") else DType.UINT8
    return [TensorType(dtype, x.shape)]


def dequantize_shape(ctx):
    x, scale = need(ctx, 0), need(ctx, 1)
    return [TensorType(scale.dtype, x.shape)]


BOUNDARY = cpu_only("(de)quantization between float and int8 runs on the CPU at segment edges")

SPECS = [
    OpSpec("QuantizeLinear", quantize_shape, npu=(BOUNDARY,), summary="float -> int8/uint8"),
    OpSpec("DequantizeLinear", dequantize_shape, npu=(BOUNDARY,), summary="int8/uint8/int32 -> float"),
]
