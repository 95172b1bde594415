"""Dense products: Gemm and MatMul (NPU: GEMM as a 1x1 convolution), and the
integer forms MatMulInteger / QLinearMatMul."""

from __future__ import annotations

from rkc.compiler.npu import api
from rkc.compiler.ops import NpuLowering, OpSpec
from rkc.compiler.ops.constraints import static_shapes, float_data
from rkc.compiler.ops.rules import broadcast_shapes, need
from rkc.ir.errors import VerifyError
from rkc.ir.types import DType, TensorType


def gemm_shape(ctx):
    a, b = need(ctx, 0), need(ctx, 1)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise VerifyError(f"op {ctx.op.describe()}: Gemm takes 2-D inputs, got {list(a.shape)} and {list(b.shape)}")
    m = a.shape[1] if ctx.attr("transA", 0) else a.shape[0]
    n = b.shape[0] if ctx.attr("transB", 0) else b.shape[1]
    return [TensorType(a.dtype, (m, n))]


def matmul_shape(ctx, dtype: DType | None = None, a_index: int = 0, b_index: int = 1):
    a, b = need(ctx, a_index), need(ctx, b_index)
    sa, sb = list(a.shape), list(b.shape)
    if not sa or not sb:
        raise VerifyError(f"op {ctx.op.describe()}: MatMul of a scalar")
    a1, b1 = len(sa) == 1, len(sb) == 1
    if a1:
        sa = [1] + sa
    if b1:
        sb = sb + [1]
    k1, k2 = sa[-1], sb[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        raise VerifyError(f"op {ctx.op.describe()}: inner dimensions {k1} and {k2} differ")
    batch = broadcast_shapes([sa[:-2], sb[:-2]], f"op {ctx.op.describe()}")
    out = [*batch, *([] if a1 else [sa[-2]]), *([] if b1 else [sb[-1]])]
    return [TensorType(dtype or a.dtype, tuple(out))]


def constant_b(ctx) -> bool:
    """the NPU needs the second operand (the weights) as a constant, laid out at compile time"""
    return ctx.const(1) is not None


def two_d_weights(ctx) -> bool:
    """the NPU multiplies by a 2-D matrix (batched run-time products are split per head where every head's product runs on the NPU; --npu-attention always)"""
    return len(need(ctx, 1).shape) == 2


def gemm_operand(ctx) -> bool:
    """the NPU's matrix operand is [M, K] or [1, M, K]"""
    shape = need(ctx).shape
    return len(shape) == 2 or (len(shape) == 3 and shape[0] == 1)


def no_trans_a(ctx) -> bool:
    """a transposed activation operand (transA=1) is not lowered to the NPU"""
    return not ctx.attr("transA", 0)


def qlinear_constant_b(ctx) -> bool:
    """the NPU needs the quantized weights (input 3) as a constant"""
    return ctx.const(3) is not None


NPU_GEMM = (static_shapes, float_data, two_d_weights, gemm_operand)

SPECS = [
    OpSpec("Gemm", gemm_shape, npu=(static_shapes, float_data, constant_b, two_d_weights, gemm_operand, no_trans_a),
           lower=NpuLowering(api.Gemm), summary="alpha * A @ B + beta * C"),
    # a run-time B (attention's products) is written by the host in the weight layout
    # (compiler/emitter_matmul.py); --npu-attention splits batched ones per head (compiler/passes/heads.py)
    OpSpec("MatMul", matmul_shape, npu=NPU_GEMM, lower=NpuLowering(api.Gemm), summary="matrix product (numpy semantics)"),
    OpSpec("MatMulInteger", lambda ctx: matmul_shape(ctx, DType.INT32), npu=(static_shapes, constant_b),
           summary="integer matrix product to int32"),
    OpSpec("QLinearMatMul", lambda ctx: matmul_shape(ctx, (ctx.type(7) or need(ctx)).dtype, 0, 3),
           npu=(static_shapes, qlinear_constant_b), summary="quantized matrix product"),
]
