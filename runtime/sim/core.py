"""CORE: the MAC array and accumulator (TRM ch. 36 'CORE' 0x3000-0x301C).

Direct convolution (GEMM is the 1x1 case with W=1, H=M, C=K), depthwise
convolution; int8/int16 products summed exactly (int64), fp16/bf16 products
(exact in fp32) summed in fp32 through sgemm. The hardware's fp32 summation
order is unknown (it accumulates each CBUF-resident K slice in an FP32-class
accumulator, hw-matmul.md 1); sgemm's order is one valid fp32 order, so
results differ from any other fp32 order by rounding only. CLIP_TRUNCATE
shifts the integer accumulator right before the DPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.runtime.sim.cna import ConvInput
from rkc.runtime.sim.errors import FieldError, GeometryError, UnsupportedError
from rkc.runtime.sim.numerics import TIE_RULES, blas_threads_for, exact_int_matmul, shift_round
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import TaskRegisters


@dataclass
class Accumulator:
    """What the CORE hands the DPU: [channels, H, W] (int64 or float32)."""

    data: np.ndarray
    window_sum: np.ndarray | None  # per output pixel (direct: [H, W]; depthwise: [C, H, W]) for CPEND
    macs: int


def check_core(r: TaskRegisters, conv: ConvInput, quirks: Quirks) -> int:
    """CORE registers against the CNA's view; returns the output channel count."""
    misc = r.fields("CORE_MISC_CFG")
    if misc["PROC_PRECISION"] != conv.prec.code:
        raise r.error(FieldError, f"PROC_PRECISION={misc['PROC_PRECISION']} differs from the CNA's "
                      f"{conv.prec.code} ({conv.prec.name})", "CORE_MISC_CFG")
    if bool(misc["DW_EN"]) != (conv.mode == "depthwise"):
        raise r.error(FieldError, f"DW_EN={misc['DW_EN']} but the CNA runs a {conv.mode} convolution",
                      "CORE_MISC_CFG")
    size0 = r.fields("CORE_DATAOUT_SIZE_0")
    if (size0["DATAOUT_WIDTH"] + 1, size0["DATAOUT_HEIGHT"] + 1) != (conv.out_w, conv.out_h):
        raise r.error(GeometryError, f"CORE output {size0['DATAOUT_WIDTH'] + 1}x{size0['DATAOUT_HEIGHT'] + 1}"
                      f" differs from the CNA's {conv.out_w}x{conv.out_h}", "CORE_DATAOUT_SIZE_0")
    channels = r.field("CORE_DATAOUT_SIZE_1", "DATAOUT_CHANNEL") + 1
    needed = conv.kernels if conv.mode == "direct" else conv.channels
    if channels < needed:
        raise r.error(GeometryError, f"DATAOUT_CHANNEL+1={channels} is fewer than the {needed} "
                      "channels the weights produce", "CORE_DATAOUT_SIZE_1")
    clip = r.fields("CORE_CLIP_TRUNCATE")
    if clip["CLIP_TRUNCATE"] and conv.prec.is_float:
        raise r.error(UnsupportedError, "CLIP_TRUNCATE on a float accumulator is not modelled",
                      "CORE_CLIP_TRUNCATE")
    for name in quirks.unnamed_zero:
        if name.startswith("UNNAMED_0x30") and r.value(name) != 0:
            raise r.error(FieldError, f"{name}={r.value(name):#x}: every known-good stream writes 0 (Q8)",
                          name)
    return channels


def convolve(conv: ConvInput, channels: int, want_window_sum: bool) -> Accumulator:
    x, w = conv.x, conv.weights
    ho, wo, sy, sx, kh, kw = conv.out_h, conv.out_w, conv.sy, conv.sx, conv.kh, conv.kw
    taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]

    def window(arr: np.ndarray, ky: int, kx: int) -> np.ndarray:
        return arr[..., ky:ky + sy * (ho - 1) + 1:sy, kx:kx + sx * (wo - 1) + 1:sx]

    c = conv.channels
    if conv.mode == "direct":
        k = conv.kernels
        if kh == kw == 1 and sy == sx == 1:
            cols = x.reshape(c, -1) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(c, -1)
        else:
            cols = np.concatenate([window(x, ky, kx).reshape(c, -1) for ky, kx in taps], axis=0)
        wmat = w.reshape(k, kh * kw * c)  # [K, (ky, kx, c)] matches the cols order
        if conv.prec.is_float:
            with blas_threads_for(wmat.size * cols.shape[1]):
                acc = (wmat.astype(np.float32, copy=False) @ cols.astype(np.float32, copy=False)).reshape(k, ho, wo)
        else:
            lim = 1 << (conv.prec.element_bits - 1)  # |int4| <= 8, |int8| <= 128, |int16| <= 32768
            acc = exact_int_matmul(wmat, cols, bound=lim * lim).reshape(k, ho, wo)
        wsum = None
        if want_window_sum:
            plane = x.sum(axis=0, dtype=np.int64)
            wsum = sum(window(plane, ky, kx) for ky, kx in taps)
        macs = k * ho * wo * kh * kw * c
    else:
        dtype = np.float32 if conv.prec.is_float else np.int64
        acc = np.zeros((c, ho, wo), dtype)
        for ky, kx in taps:
            acc += window(x, ky, kx).astype(dtype) * w[ky, kx][:, None, None].astype(dtype)
        wsum = sum(window(x, ky, kx).astype(np.int64) for ky, kx in taps) if want_window_sum else None
        macs = c * ho * wo * kh * kw
    if channels > acc.shape[0]:
        # channels past the last kernel: the MAC array multiplies by no weights
        pad = np.zeros((channels - acc.shape[0],) + acc.shape[1:], acc.dtype)
        acc = np.concatenate([acc, pad])
    return Accumulator(acc, wsum, macs)


def truncate(r: TaskRegisters, acc: np.ndarray, quirks: Quirks) -> np.ndarray:
    """CORE_CLIP_TRUNCATE: shift the integer accumulator right (ROUND_TYPE: 0
    ties to even, 1 ties away from zero, numerics.TIE_RULES)."""
    clip = r.fields("CORE_CLIP_TRUNCATE")
    t = clip["CLIP_TRUNCATE"]
    if t == 0 or acc.dtype.kind == "f":
        return acc
    return shift_round(acc, t, TIE_RULES[clip["ROUND_TYPE"]])
