"""DPU lookup-table activations (the NVDLA SDP LE/LO hybrid tables), fp16.

How the table is driven (gregordinary/rockchip-npu-notes encodings/
dpu-lut-activation.md, HW-validated for sigmoid, tanh, SiLU, hardsigmoid,
hardswish, exp): the BN stage maps x to a table index (index = x * index_scale,
BN MUL with an fp16 operand after a no-op fp32 ALU add); two 513-entry tables
cover the index range [-16384, 0] (LE) and [0, 16384] (LO) in steps of 2^5,
interpolated linearly; an entry holds g = (f(x) - lo) / S as an unsigned Q0.15
value, and OUT_CVT decodes it: f = (q + offset) * 2^-minus_exp with
minus_exp = 15 - log2(S) and offset = lo * 2^15 / S. Outside the tables the
hardware extrapolates with the LE underflow / LO overflow slopes.

rkc's choices (each function: its domain, the output range [lo, lo + S]) are in
FUNCTIONS; the accuracy is the table's (~S * 2^-12 inside the domain).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rkc.compiler.npu.regfile import RegisterFile
from rkc.ir.errors import UnsupportedError

TABLE_ENTRIES = 513
INDEX_RANGE = 16384  # LE covers [-16384, 0], LO [0, 16384]
INDEX_SELECT = 5  # table step 2^5 index units: 16384 / 32 = 512 segments
Q_BITS = 15


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


@dataclass(frozen=True)
class LutFunction:
    f: Callable[[np.ndarray], np.ndarray]
    x_max: float  # table domain [-x_max, x_max]; index_scale = 16384 / x_max
    lo: float  # output range [lo, lo + 2^s_exp]
    s_exp: int
    overflow_slope: float = 0.0  # df/dx past +x_max (LO overflow extrapolation)
    underflow_slope: float = 0.0  # df/dx below -x_max


FUNCTIONS = {
    "sigmoid": LutFunction(_sigmoid, 8.0, 0.0, 0),
    "hardsigmoid": LutFunction(lambda x: np.clip(np.asarray(x, np.float64) / 6 + 0.5, 0, 1), 8.0, 0.0, 0),
    "tanh": LutFunction(np.tanh, 4.0, -1.0, 1),
    "exp": LutFunction(lambda x: np.exp(np.minimum(np.asarray(x, np.float64), 0.0)), 16.0, 0.0, 0),
    "silu": LutFunction(lambda x: np.asarray(x, np.float64) * _sigmoid(x), 16.0, -1.0, 5, overflow_slope=1.0),
    "gelu": LutFunction(lambda x: 0.5 * np.asarray(x, np.float64) * (1 + _erf(np.asarray(x) / math.sqrt(2))),
                        16.0, -1.0, 5, overflow_slope=1.0),
    # GELU's tanh form, as Gemma's FFN computes it (llama.cpp's gelu; the erf form above differs by <~1e-3)
    "gelu_tanh": LutFunction(lambda x: 0.5 * np.asarray(x, np.float64)
                             * (1 + np.tanh(math.sqrt(2 / math.pi) * (np.asarray(x, np.float64)
                                                                      + 0.044715 * np.asarray(x, np.float64) ** 3))),
                             16.0, -1.0, 5, overflow_slope=1.0),
    "hardswish": LutFunction(lambda x: np.asarray(x, np.float64) * np.clip(np.asarray(x) / 6 + 0.5, 0, 1),
                             16.0, -1.0, 5, overflow_slope=1.0),
}


@dataclass
class LutPlan:
    name: str
    spec: LutFunction
    le: np.ndarray  # 513 uint16 entries, index -16384 .. 0
    lo: np.ndarray  # 513 uint16 entries, index 0 .. 16384

    @property
    def index_scale(self) -> float:
        return INDEX_RANGE / self.spec.x_max

    def function(self, x: np.ndarray) -> np.ndarray:
        """The ideal function the table approximates (for references)."""
        return self.spec.f(x)

    def tolerance(self) -> float:
        """Absolute error bound inside the domain: half a Q0.15 step plus the
        linear-interpolation error of a 512-segment table, with fp16 output rounding."""
        step = self.spec.x_max / 512
        return (2.0 ** self.spec.s_exp) * 2.0 ** -Q_BITS * 2 + step * step * 0.25 + 2e-3

    def write_bn(self, r: RegisterFile) -> None:
        # BN: index = (x + (-0.0)) * index_scale; the ALU word is fp32 -0.0, the MUL operand fp16
        r.set("DPU_BN_CFG", BN_ALU_ALGO=2, BN_RELU_BYPASS=1)
        r.set("DPU_BN_ALU_CFG", BN_ALU_OPERAND=0x80000000)
        r.set("DPU_BN_MUL_CFG", BN_MUL_OPERAND=int(np.array(self.index_scale, np.float16).view(np.uint16)))
        # EW: the LUT runs (LUT not bypassed), ReLU and operand converter bypassed
        r.set("DPU_EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1)
        r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)

    def write_bn_integer(self, r: RegisterFile, mul: int, shift: int) -> None:
        """The index from an integer datapath (hardware question Q22, `rkc probe` only):
        index = rne(v * mul >> shift), BN's register multiplier with the sign-split
        shift of the BS stage (Q21), its ALU bypassed; the EW word as on fp16."""
        r.set("DPU_BN_CFG", BN_ALU_BYPASS=1, BN_RELU_BYPASS=1)
        r.set("DPU_BN_MUL_CFG", BN_MUL_OPERAND=mul, BN_MUL_SHIFT_VALUE=shift)
        r.set("DPU_EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1)
        r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)

    def write_out_cvt(self, r: RegisterFile) -> None:
        s = self.spec
        offset = round(s.lo * (1 << Q_BITS) / 2.0 ** s.s_exp)
        r.set("DPU_OUT_CVT_OFFSET", OUT_CVT_OFFSET=offset & 0xFFFFFFFF)
        r.set("DPU_OUT_CVT_SCALE", FP32TOFP16_EN=1, OUT_CVT_SCALE=1)
        r.set("DPU_OUT_CVT_SHIFT", CVT_TYPE=1, MINUS_EXP=Q_BITS - s.s_exp)

    def write_tables(self, r: RegisterFile) -> None:
        r.lut_tables = (self.le, self.lo)
        # hybrid LE/LO mux with the priorities of the validated program
        r.set("DPU_LUT_CFG", LUT_HYBRID_PRIORITY=1, LUT_OFLOW_PRIORITY=1, LUT_LO_LE_MUX=2)
        r.set("DPU_LUT_INFO", LUT_LO_INDEX_SELECT=INDEX_SELECT, LUT_LE_INDEX_SELECT=INDEX_SELECT)
        r.set("DPU_LUT_LE_START", LUT_LE_START=(-INDEX_RANGE) & 0xFFFFFFFF)
        r.set("DPU_LUT_LO_END", LUT_LO_END=INDEX_RANGE)
        for side, slope, field in (("LO", self.spec.overflow_slope, "OFLOW"), ("LE", self.spec.underflow_slope, "UFLOW")):
            scale, shift = _slope_pair(slope, self.spec, self.index_scale)
            r.set(f"DPU_LUT_{side}_SLOPE_SCALE", **{f"LUT_{side}_SLOPE_{field}_SCALE": scale})
            r.set(f"DPU_LUT_{side}_SLOPE_SHIFT", **{f"LUT_{side}_SLOPE_{field}_SHIFT": shift})


def _slope_pair(slope: float, spec: LutFunction, index_scale: float) -> tuple[int, int]:
    """Extrapolation slope in table units (Q0.15 steps per index unit) as a 16-bit
    signed scale and a 5-bit shift: dq/dindex = scale / 2^shift."""
    if slope == 0:
        return 0, 0
    dq = slope * (1 << Q_BITS) / 2.0 ** spec.s_exp / index_scale
    shift = 0
    while abs(dq) * 2 ** (shift + 1) < 32767 and shift < 31:
        shift += 1
    return int(round(dq * 2 ** shift)) & 0xFFFF, shift


def _quantize(g: np.ndarray) -> np.ndarray:
    # Q0.15 in a signed 16-bit entry (act_lut_readme.md), clamped to [1, 32767]: an
    # entry of exactly 0 decodes as ~4.0 on silicon (QUIRK in dpu-lut-activation.md)
    return np.clip(np.rint(g * (1 << Q_BITS)), 1, (1 << Q_BITS) - 1).astype(np.uint16)


def sample(spec: LutFunction, x: np.ndarray) -> np.ndarray:
    """What the tables give at table input x (fp64, before OUT_CVT's fp16 rounding):
    the entries interpolated, the end entries held outside them where the slope is 0.
    For error bounds over a range (the simulator computes the same, runtime/sim/lut.py)."""
    if spec.overflow_slope or spec.underflow_slope:
        raise ValueError("sample() models tables whose ends hold (slopes 0)")
    p = plan(spec)
    s = 2.0 ** spec.s_exp
    pos = np.clip(np.asarray(x, np.float64) * p.index_scale / 2 ** INDEX_SELECT, -512, 512)
    table = np.concatenate([p.le[:-1], p.lo]).astype(np.float64)
    i = np.clip(np.floor(pos).astype(np.int64) + 512, 0, 1023)
    frac = pos + 512 - i
    g = table[i] + frac * (table[i + 1] - table[i])
    return g / (1 << Q_BITS) * s + spec.lo


def plan(name: str | LutFunction) -> LutPlan:
    """The tables of a function of FUNCTIONS, or of an emitter's own `LutFunction`
    (LRN's power: compiler/npu/lrn.py)."""
    if isinstance(name, LutFunction):
        spec, name = name, getattr(name.f, "__name__", "table")
    else:
        try:
            spec = FUNCTIONS[name]
        except KeyError:
            raise UnsupportedError(f"no NPU lookup table for {name!r} (have {', '.join(FUNCTIONS)})") from None
    s = 2.0 ** spec.s_exp
    step = spec.x_max / 512
    le_x = -(512 - np.arange(TABLE_ENTRIES)) * step
    lo_x = np.arange(TABLE_ENTRIES) * step
    le = _quantize((spec.f(le_x) - spec.lo) / s)
    lo = _quantize((spec.f(lo_x) - spec.lo) / s)
    return LutPlan(name, spec, le, lo)
