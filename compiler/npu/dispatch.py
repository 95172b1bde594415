"""Dispatch: which emitter lowers which NPU operation, and `emit`, the one entry
point from an operation of the graph-free API (compiler/npu/api.py) to its tasks."""

from __future__ import annotations

from typing import Callable

from rkc.compiler.npu import (api, conv, conv_transpose, eltwise, flying, gemm, gemm_int4, lrn, mesa, pool,
                               upsample)
from rkc.ir.errors import UnsupportedError

# operation class -> emitter(op, options) -> EmitResult; tests/npu/test_op_declarations.py
# checks that every operation class of the API has exactly one entry
LOWERINGS: dict[type, Callable[..., api.EmitResult]] = {
    mesa.MesaConv: mesa.lower_mesa_with_options,
    api.Gemm: gemm.lower_gemm,
    api.GemmInt4: gemm_int4.lower_gemm_int4,
    api.Conv2D: conv.lower_conv,
    api.Elementwise: eltwise.lower_eltwise,
    api.Activation: flying.lower_activation,
    api.Pool: pool.lower_pool,
    api.Upsample: upsample.lower_upsample,
    api.LocalResponseNorm: lrn.lower_lrn,
    api.ConvTranspose2D: conv_transpose.lower_conv_transpose,
}


def emit(op: object, options: api.EmitOptions = api.DEFAULT_OPTIONS) -> api.EmitResult:
    """Lower one NPU operation to tasks, jobs and constant buffers."""
    lowering = LOWERINGS.get(type(op))
    if lowering is None:
        raise UnsupportedError(f"no NPU lowering for {type(op).__name__}")
    return lowering(op, options)
