"""NPU constraints shared by several ops. Each is a predicate over an
OpContext; its docstring's first line is the user-facing reason when it
fails (the op then runs on the CPU)."""

from __future__ import annotations

from rkc.ir.types import DType

NPU_DTYPES = (DType.FP32, DType.FP16, DType.INT8, DType.UINT8)


def static_shapes(ctx) -> bool:
    """the NPU needs static shapes (fix dynamic dimensions with --input-shape)"""
    return all(ctx.graph.tensors[n].type.is_static for n in [*ctx.op.present_inputs(), *ctx.op.outputs])


def float_data(ctx) -> bool:
    """the NPU computes in fp16 or int8 from float (or quantized int8/uint8) tensors"""
    return all(ctx.graph.tensors[n].type.dtype in NPU_DTYPES
               for n in [ctx.op.inputs[0], *ctx.op.outputs])


def feature_map(ctx) -> bool:
    """the NPU holds [1, C, H, W] feature maps and [M, K] / [1, M, K] matrices"""
    shape = ctx.graph.tensors[ctx.op.outputs[0]].type.shape
    return len(shape) == 2 or (len(shape) in (3, 4) and shape[0] == 1)


def constant_weights(ctx) -> bool:
    """the NPU needs the weights as constants (they are laid out at compile time)"""
    return ctx.const(1) is not None


BASIC = (static_shapes, float_data, feature_map)


def cpu_only(reason: str):
    """A constraint that always fails, with `reason` as its docstring."""
    def check(ctx) -> bool:
        return False
    check.__doc__ = reason
    check.__name__ = "cpu_only"
    return check
