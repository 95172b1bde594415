"""Convolutions: Conv (NPU: CNA+CORE direct convolution, depthwise mode),
ConvTranspose, and the integer forms ConvInteger / QLinearConv."""

from __future__ import annotations

from rkc.compiler.npu import api
from rkc.compiler.ops import NpuLowering, OpSpec
from rkc.compiler.ops.constraints import BASIC, constant_weights
from rkc.compiler.ops.rules import need, spatial_out, window_params
from rkc.ir.errors import VerifyError
from rkc.ir.types import DType, TensorType


def conv_shape(ctx, x_index: int = 0, w_index: int = 1, dtype: DType | None = None):
    x, w = need(ctx, x_index), need(ctx, w_index)
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise VerifyError(f"op {ctx.op.describe()}: input rank {len(x.shape)} and weight rank {len(w.shape)} "
                          "do not make a convolution")
    kernel = [int(k) for k in ctx.attr("kernel_shape", w.shape[2:])]
    strides, dilations = window_params(ctx, kernel)
    check_groups(ctx, x.shape[1], w.shape[0], w.shape[1])
    sp = spatial_out(x.shape[2:], kernel, strides, dilations, ctx.attr("pads"), ctx.attr("auto_pad", "NOTSET"))
    return [TensorType(dtype or x.dtype, (x.shape[0], w.shape[0], *sp))]


def check_groups(ctx, channels, kernels, per_group) -> None:
    """ONNX Conv: `group` divides the input channels and the kernels, and each
    kernel sees channels / group of them."""
    group = int(ctx.attr("group", 1))
    what = f"op {ctx.op.describe()}"
    if group < 1:
        raise VerifyError(f"{what}: group {group} must be at least 1")
    if not all(isinstance(d, int) for d in (channels, kernels, per_group)):
        return
    if channels % group or kernels % group:
        raise VerifyError(f"{what}: group {group} does not divide the {channels} input channels and "
                          f"{kernels} kernels")
    if per_group * group != channels:
        raise VerifyError(f"{what}: the weight takes {per_group} channels per group, but the input has "
                          f"{channels} in {group} group(s)")


def conv_transpose_shape(ctx):
    x, w = need(ctx, 0), need(ctx, 1)
    nd = len(x.shape) - 2
    group = int(ctx.attr("group", 1))
    kernel = [int(k) for k in ctx.attr("kernel_shape", w.shape[2:])]
    strides, dilations = window_params(ctx, kernel)
    out_shape = ctx.attr("output_shape")
    channels = w.shape[1] * group if isinstance(w.shape[1], int) else w.shape[1]
    if out_shape is not None:
        return [TensorType(x.dtype, (x.shape[0], channels, *[int(v) for v in out_shape][-nd:]))]
    if any(isinstance(d, str) for d in x.shape[2:]):
        return [TensorType(x.dtype, (x.shape[0], channels, *["unk"] * nd))]
    out_pad = [int(p) for p in ctx.attr("output_padding", [0] * nd)]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sp = [i * s for i, s in zip(x.shape[2:], strides)]
    else:
        pads = [int(p) for p in ctx.attr("pads", [0] * 2 * nd)]
        sp = [s * (i - 1) + op + (k - 1) * d + 1 - pads[a] - pads[nd + a]
              for a, (i, s, op, k, d) in enumerate(zip(x.shape[2:], strides, out_pad, kernel, dilations))]
    return [TensorType(x.dtype, (x.shape[0], channels, *sp))]


def is_2d(ctx) -> bool:
    """the NPU convolves 2-D feature maps (NCHW) only"""
    return len(need(ctx).shape) == 4


def plain_or_depthwise(ctx) -> bool:
    """the NPU does ordinary (group=1) and depthwise (group=channels) convolutions, not other groupings
    (up to 8 groups become one block-diagonal ordinary convolution first, compiler/passes/groups.py)"""
    group = int(ctx.attr("group", 1))
    x, w = need(ctx, 0), need(ctx, 1)
    return group == 1 or (group == x.shape[1] and w.shape[0] == group)


def no_dilation(ctx) -> bool:
    """dilated (atrous) convolution is not lowered to the NPU yet"""
    return all(int(d) == 1 for d in ctx.attr("dilations", [1, 1]))


def fits_fields(ctx) -> bool:
    """kernel up to 32x32, stride up to 7 and padding up to 15 (CNA register fields)"""
    w = need(ctx, 1)
    kh, kw = w.shape[2], w.shape[3]
    strides = [int(s) for s in ctx.attr("strides", [1, 1])]
    pads = [int(p) for p in ctx.attr("pads", [0, 0, 0, 0])]
    return kh <= 32 and kw <= 32 and max(strides) <= 7 and max(pads, default=0) <= 15


def stride_is_kernel(ctx) -> bool:
    """the NPU runs a transposed convolution whose stride equals its square kernel (up to 16x16), one
    group, no padding, dilation or output padding (each input pixel writes its own k x k block)"""
    w = need(ctx, 1)
    k = [int(v) for v in ctx.attr("kernel_shape", w.shape[2:])]
    if len(k) != 2 or k[0] != k[1] or not 2 <= k[0] <= 16 or list(w.shape[2:]) != k:
        return False
    x, y = need(ctx).shape, ctx.out_type().shape
    return (int(ctx.attr("group", 1)) == 1
            and [int(s) for s in ctx.attr("strides", [1, 1])] == k
            and all(int(d) == 1 for d in ctx.attr("dilations", [1, 1]))
            and not any(int(p) for p in ctx.attr("pads", [0, 0, 0, 0]))
            and not any(int(p) for p in ctx.attr("output_padding", [0, 0]))
            and ctx.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")
            and tuple(y[2:]) == (k[0] * x[2], k[1] * x[3]))


def qlinear_conv_shape(ctx):
    zp = ctx.type(7)
    return conv_shape(ctx, 0, 3, zp.dtype if zp is not None else DType.UINT8)


SPECS = [
    OpSpec("Conv", conv_shape, npu=(*BASIC, is_2d, constant_weights, plain_or_depthwise, no_dilation, fits_fields),
           lower=NpuLowering(api.Conv2D),
           summary="convolution, 2-D on the NPU (direct or depthwise), with fused bias and activation"),
    OpSpec("ConvTranspose", conv_transpose_shape, npu=(*BASIC, is_2d, constant_weights, stride_is_kernel),
           lower=NpuLowering(api.ConvTranspose2D),
           summary="transposed convolution; on the NPU when its stride is its kernel (1 x k windows over the "
                   "pixels, copies k lines apart), with fused bias and activation"),
    OpSpec("ConvInteger", lambda ctx: conv_shape(ctx, 0, 1, DType.INT32), npu=(*BASIC, is_2d, constant_weights),
           summary="integer convolution to int32"),
    OpSpec("QLinearConv", qlinear_conv_shape, npu=(*BASIC, is_2d),
           summary="quantized convolution (uses the model's scales)"),
]
