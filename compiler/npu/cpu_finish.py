"""CPU steps the NPU cannot do itself (api.CpuStep), in numpy.

"sum_partials": the int32 (or fp32) K-split partials of a GEMM are summed, then
the op's DPU epilogue (bias, zero-point corrections, requantization, clip) is
applied with exactly the arithmetic the DPU would have used (DpuPlan.apply), so
a K-split op gives the bits a single task would have.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rkc.compiler.npu import api
from rkc.ir.errors import UnsupportedError

ReadFeature = Callable[[api.Feature], np.ndarray]  # -> [C, H, W] values
WriteFeature = Callable[[api.Feature, np.ndarray], None]


def run_cpu_step(step: api.CpuStep, read: ReadFeature, write: WriteFeature) -> None:
    if step.kind != "sum_partials":
        raise UnsupportedError(f"unknown CPU step {step.kind!r}")
    parts = [read(f) for f in step.inputs]
    if step.inputs[0].dtype == "int32":
        acc = np.sum([p.astype(np.int64) for p in parts], axis=0)
    else:
        acc = np.sum([p.astype(np.float64) for p in parts], axis=0)
    residual = read(step.epilogue.residual.tensor) if step.epilogue.residual is not None else None
    write(step.output, step.params["plan"].apply(acc, residual))
