"""Local response normalisation (ONNX LRN across channels) from documented DPU
operations, fp16:

    out = x * (bias + alpha / size * sum over the window of x^2) ** -beta

1. Squares. An element-wise multiply of x by itself (compiler/npu/eltwise.py: an
   identity 1x1 convolution, x as the EW operand) whose identity weight is
   SQUARE_SCALE = 2^-8, so sq = x^2 / 256 (exact: a power of two, the DPU
   multiplies in fp32 and rounds once to fp16) stays finite for |x| < 4096
   where x^2 would pass fp16's 65504 at |x| = 256.
2. Window sums and the power. A 1x1 convolution over sq with a constant banded
   weight (output channel c sums the input channels of its window, each times
   alpha / size * 256) gives u = alpha / size * sum x^2 in the accumulator, and
   the DPU lookup table maps u to (bias + u) ** -beta (dpu-lut-activation.md's
   documented configuration, compiler/npu/lut.py) in the same task.
3. The product. An element-wise multiply of x by that factor.

The table covers u in [0, U] with 512 linear segments; U is chosen so that the
interpolation error of the convex power stays below `TABLE_ERROR` relative to its
largest value (bias ** -beta, at u = 0); the input's calibrated range
(`input_max`) must keep u within it. Past U the LO table's overflow slope is
0, so the hardware would hold the last entry, (bias + U) ** -beta, as
dpu-lut-activation.md documents for an index past the table's end: an input whose
range is unknown, or reaches past U, is refused (`table_error` says how far off the
held entry is); the emitter's notes state the table's error over the range the op
sees.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api, eltwise, lut
from rkc.compiler.npu.conv import lower_conv
from rkc.ir.errors import UnsupportedError

SQUARE_SCALE = 2.0 ** -8  # the square's identity weight (module doc, step 1)
TABLE_ERROR = 2.0 ** -12  # the table's interpolation error over its value at u = 0 (about an fp16 step)


def _power(bias: float, beta: float):
    def power(u):
        return (bias + np.maximum(np.asarray(u, np.float64), 0.0)) ** -beta
    return power


def power_table(bias: float, beta: float) -> lut.LutFunction:
    """The table of (bias + u) ** -beta over [0, U]: U a power of two (the BN index
    multiplier 16384 / U is then exact in fp16), the largest whose worst interpolation
    error, h^2 / 8 * f''(0) with h = U / 512, is TABLE_ERROR * f(0). The widest such
    table leaves the most room for inputs beyond the calibrated range."""
    if bias <= 0 or beta <= 0:
        raise UnsupportedError(f"LRN with bias {bias} and beta {beta}: the table needs bias > 0 and beta > 0")
    # f''(0) / f(0) = beta (beta + 1) / bias^2
    h = math.sqrt(8 * TABLE_ERROR * bias ** 2 / (beta * (beta + 1)))
    # not below 1: the index multiplier 16384 / U must stay an fp16 value
    u_top = max(1.0, 2.0 ** math.floor(math.log2(512 * h)))
    s_exp = math.ceil(math.log2(bias ** -beta))  # the output range [0, 2^s_exp] holds f(0)
    return lut.LutFunction(_power(bias, beta), u_top, 0.0, s_exp)


def table_error(spec: lut.LutFunction, u_max: float) -> float:
    """The largest error of the table against the power over [0, u_max], relative to
    the power at each point (the held end entry included past the table)."""
    u = np.linspace(0.0, u_max, 20001)
    if u_max > spec.x_max:
        u = np.concatenate([u, np.geomspace(spec.x_max, u_max, 2001)])
    exact = spec.f(u)
    return float(np.max(np.abs(lut.sample(spec, u) - exact) / exact))


def band_weights(channels: int, size: int, coefficient: float) -> np.ndarray:
    """[O, 1, 1, I]: output channel c sums input channels c - (size-1)//2 ..
    c + ceil((size-1)/2) (ONNX LRN's window), each times `coefficient`."""
    lo, hi = (size - 1) // 2, size // 2
    c = np.arange(channels)
    band = (c[None, :] >= c[:, None] - lo) & (c[None, :] <= c[:, None] + hi)
    return (band * coefficient).astype(np.float16)[:, None, None, :]


def lower_lrn(op: api.LocalResponseNorm, options: api.EmitOptions) -> api.EmitResult:
    """Refused when the input's range is unknown or takes the window sums past the
    table (the held end entry would be off by more than TABLE_ERROR)."""
    f, o = op.input, op.output
    if f.dtype != "fp16" or o.dtype != "fp16" or f.shape != o.shape:
        raise UnsupportedError(f"{op.name}: LRN runs on fp16 maps of one shape (the lookup table is fp16 only, "
                               f"Q22), not {f.shape} {f.dtype} -> {o.shape} {o.dtype}")
    if op.size < 1:
        raise UnsupportedError(f"{op.name}: LRN size {op.size}")
    c, h, w = f.shape
    if op.input_max is None:
        raise UnsupportedError(f"{op.name}: LRN's power runs through a table over a bounded range, and the "
                               f"input's range is unknown (calibrate: --calib)")
    u_max = op.alpha * op.input_max ** 2  # alpha / size times size squares at most
    spec = power_table(op.bias, op.beta)
    if u_max > spec.x_max:
        raise UnsupportedError(f"{op.name}: the window sums reach {u_max:.3g}, past the power's table "
                               f"[0, {spec.x_max:g}] (its end entry would hold, {table_error(spec, u_max):.2g} "
                               f"off)")
    squares = api.Feature(f"{op.name}.squares", 0, c, h, w, "fp16")
    factor = api.Feature(f"{op.name}.factor", 0, c, h, w, "fp16")
    coefficient = op.alpha / op.size / SQUARE_SCALE
    if not np.isfinite(np.float16(coefficient)) or np.float16(coefficient) == 0:
        raise UnsupportedError(f"{op.name}: alpha / size = {op.alpha / op.size:g} has no fp16 window weight")
    parts = [
        eltwise.lower_eltwise(api.Elementwise(f, f, squares, "mul", name=f"{op.name}.square",
                                              scale=SQUARE_SCALE), options),
        lower_conv(api.Conv2D(squares, band_weights(c, op.size, coefficient), factor,
                              epilogue=api.Epilogue(activation=spec), name=f"{op.name}.window"), options),
        eltwise.lower_eltwise(api.Elementwise(f, factor, o, "mul", name=f"{op.name}.product"), options),
    ]
    tasks, jobs, constants = [], [], []
    for part in parts:
        first = len(tasks)
        tasks += part.tasks
        constants += part.constants
        jobs += [replace(j, tasks=[first + t for t in j.tasks]) for j in part.jobs]
    extents: dict[str, int] = {}
    for part in parts:
        for buf, end in part.extents().items():
            extents[buf] = max(extents.get(buf, 0), end)
    scratch = [api.Scratch(b.buffer, extents[b.buffer]) for b in (squares, factor)]
    err = table_error(spec, u_max)
    notes = [f"LRN size {op.size} {f.shape} fp16: squares (x^2 * 2^-8), window sums as a 1x1 convolution of banded "
             f"weights with (bias + u)^-beta through the LUT over u in [0, {spec.x_max:g}], then x times it; "
             f"table error {err:.1e} relative over the u its input reaches, [0, {u_max:.3g}]"]
    notes += [n for part in parts for n in part.notes]
    return api.EmitResult(op, tasks, jobs, constants, scratch, notes=notes)
