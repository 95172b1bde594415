"""Pooling (NPU: PPU max/avg, global average) and LRN (NPU: squares, a banded 1x1
convolution with a power table, a product; compiler/npu/lrn.py)."""

from __future__ import annotations

from rkc.compiler.npu import api
from rkc.compiler.ops import NpuLowering, OpSpec
from rkc.compiler.ops.constraints import BASIC
from rkc.compiler.ops.rules import need, spatial_out, window_params
from rkc.ir.types import DType, TensorType


def pool_shape(ctx):
    x = need(ctx)
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    strides, dilations = window_params(ctx, kernel)
    sp = spatial_out(x.shape[2:], kernel, strides, dilations, ctx.attr("pads"), ctx.attr("auto_pad", "NOTSET"),
                     int(ctx.attr("ceil_mode", 0)))
    out = [TensorType(x.dtype, (*x.shape[:2], *sp))]
    if len(ctx.op.outputs) > 1:
        out.append(TensorType(DType.INT64, out[0].shape))
    return out


def global_pool_shape(ctx):
    x = need(ctx)
    return [TensorType(x.dtype, (*x.shape[:2], *[1] * (len(x.shape) - 2)))]


def pool_2d(ctx) -> bool:
    """the PPU pools 2-D feature maps only"""
    return len(need(ctx).shape) == 4


def lrn_map(ctx) -> bool:
    """the NPU normalises 2-D feature maps across channels ([1, C, H, W])"""
    return len(need(ctx).shape) == 4


def pool_fields(ctx) -> bool:
    """the PPU takes kernels up to 8x8, strides up to 8 and padding up to 7, without dilation"""
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    strides = [int(s) for s in ctx.attr("strides", [1, 1])]
    pads = [int(p) for p in ctx.attr("pads", [0, 0, 0, 0])]
    dil = [int(d) for d in ctx.attr("dilations", [1, 1])]
    return (max(kernel) <= 8 and max(strides) <= 8 and max(pads, default=0) <= 7 and dil == [1, 1]
            and len(ctx.op.outputs) == 1)


AVG_POOL = NpuLowering(api.Pool, "avg")
MAX_POOL = NpuLowering(api.Pool, "max")

SPECS = [
    OpSpec("MaxPool", pool_shape, npu=(*BASIC, pool_2d, pool_fields), lower=MAX_POOL,
           summary="max pooling (NPU: fp16 on the PPU with --kernel-ppu-irq; else one-hot depthwise "
                   "convolutions keeping the DPU's element-wise max)"),
    OpSpec("AveragePool", pool_shape, npu=(*BASIC, pool_2d, pool_fields), lower=AVG_POOL,
           summary="average pooling (NPU: as a depthwise convolution; padding excluded from the count "
                   "or ceil mode: times a constant map of 1/count)"),
    OpSpec("GlobalAveragePool", global_pool_shape, npu=(*BASIC, pool_2d), lower=AVG_POOL, summary="mean over H, W"),
    OpSpec("GlobalMaxPool", global_pool_shape, npu=(*BASIC, pool_2d), summary="max over H, W"),
    OpSpec("LRN", lambda ctx: [need(ctx)], npu=(*BASIC, lrn_map), lower=NpuLowering(api.LocalResponseNorm),
           summary="local response normalisation across channels (NPU: fp16, the input's range calibrated)"),
]
