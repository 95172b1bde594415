"""Dispatch: which module lowers which operation."""

from __future__ import annotations

import importlib

from rkc.compiler.npu import api
from rkc.ir.errors import UnsupportedError

# operation class name -> "module:function(op, options) -> EmitResult"
LOWERINGS = {
    "MesaConv": "rkc.compiler.npu.mesa:lower_mesa_with_options",
    "Gemm": "rkc.compiler.npu.gemm:lower_gemm",
    "Conv2D": "rkc.compiler.npu.conv:lower_conv",
    "Elementwise": "rkc.compiler.npu.eltwise:lower_eltwise",
    "Activation": "rkc.compiler.npu.flying:lower_activation",
    "Pool": "rkc.compiler.npu.pool:lower_pool",
}


def lower(op: object, options: api.EmitOptions) -> api.EmitResult:
    target = LOWERINGS.get(type(op).__name__)
    if target is None:
        raise UnsupportedError(f"no NPU lowering for {type(op).__name__}")
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)(op, options)
