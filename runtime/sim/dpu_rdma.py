"""DPU_RDMA: the DPU's read DMAs (TRM ch. 36 'DPU_RDMA' 0x5000-0x506C).

MRDMA feeds the DPU's main data in flying mode (no convolution); BRDMA and
NRDMA fetch per-channel operands for the BS and BN stages; ERDMA fetches the
EW stage's operand (per channel or per pixel). With COMB_USE = 5 (Mesa's
residual add, gregordinary's fp16 K-accumulation) MRDMA and ERDMA read one
operand cube together: MRDMA the even channel surfaces from SRC_BASE_ADDR,
ERDMA the odd ones from EW_BASE_ADDR, each skipping the other's surface via
SURF_NOTCH / EW_SURF_NOTCH (the reading that makes every captured program
address the natural NC1HWC2 cube; Q16 in quirks.py).

Strides: a line is (width + line notch) atoms, a surface (line * height +
surface notch) atoms, per the TRM's notch descriptions ('pixels from the end
of width to the end of the line / of this feature map to the end of the shape').
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.ir.npu import extents
from rkc.runtime.sim.errors import (AlignmentError, FieldError, GeometryError, HangError, QuirkRejection,
                                SimError, UnsupportedError)
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.numerics import PRECISIONS, Precision, to_compute
from rkc.runtime.sim.regfile import TaskRegisters

ATOM = 16
BURST_LENS = (3, 7, 15)
DATA_USE_ALU, DATA_USE_CPEND, DATA_USE_MUL, DATA_USE_TRT = 1, 2, 4, 8
COMB_EW_PAIR = 5  # COMB_USE bits 0 (MRDMA and ERDMA read the same data) + 2 (data to ERDMA)


@dataclass
class RdmaMode:
    flying: bool  # DPU main data comes from MRDMA
    mrdma: bool  # MRDMA enabled
    comb: int
    in_prec: int
    fp16_to_fp32: bool


def mode(r: TaskRegisters) -> RdmaMode:
    f = r.fields("DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    if f["BURST_LEN"] not in BURST_LENS:
        raise r.error(FieldError, f"BURST_LEN={f['BURST_LEN']} is reserved (3, 7 or 15)",
                      "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    unpool = {k: v for k, v in r.fields("DPU_RDMA_RDMA_SRC_DMA_CFG").items() if k != "LINE_NOTCH_ADDR" and v}
    if unpool or r.value("DPU_RDMA_RDMA_PAD_CFG"):
        raise r.error(UnsupportedError, f"un-pooling (SRC_DMA_CFG {unpool or ''}, PAD_CFG) is not modelled",
                      "DPU_RDMA_RDMA_SRC_DMA_CFG")
    return RdmaMode(bool(f["FLYING_MODE"]), not f["MRDMA_DISABLE"], f["COMB_USE"], f["IN_PRECISION"],
                    bool(f["MRDMA_FP16TOFP32_EN"]))


def check_cube(r: TaskRegisters, width: int, height: int, channels: int) -> None:
    got = (r.field("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", "WIDTH") + 1,
           r.field("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", "HEIGHT") + 1,
           r.field("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", "CHANNEL") + 1)
    if got != (width, height, channels):
        raise r.error(GeometryError, f"DPU_RDMA cube {got[0]}x{got[1]}x{got[2]} differs from the DPU cube "
                      f"{width}x{height}x{channels}", "DPU_RDMA_RDMA_DATA_CUBE_WIDTH")


def _located(exc: SimError, r: TaskRegisters, reg: str) -> SimError:
    return exc.located(register=reg, entry=r.entry(reg))


def address(r: TaskRegisters, reg: str) -> int:
    addr = r.value(reg)
    if addr % ATOM:
        raise r.error(AlignmentError, f"{addr:#x} is not 16-byte aligned", reg)
    return addr


def read(r: TaskRegisters, mem: IovaSpace, base_reg: str, extent, dtype, what: str) -> np.ndarray:
    """What the DMA from `base_reg` reads (its walk, ir/npu/extents.py): a
    per-channel vector, or an NC1HWC2 cube [S, H, W, C2] of raw storage elements
    (no surfaces: an empty cube, nothing read)."""
    addr = address(r, base_reg)
    walk = r.walk(extent)
    if walk.shape[0] == 0:
        return np.zeros(walk.shape, dtype)
    try:
        return mem.strided(addr, walk, dtype, what)
    except SimError as exc:
        raise _located(exc, r, base_reg)


def main_data(r: TaskRegisters, mem: IovaSpace, m: RdmaMode, width: int, height: int,
              channels: int) -> tuple[np.ndarray, Precision, int]:
    """Flying mode: MRDMA reads the DPU's main input cube. Returns
    ([C, H, W] in compute values, its precision, bytes read)."""
    prec = PRECISIONS.get(m.in_prec)
    if prec is None:
        raise r.error(FieldError, f"IN_PRECISION={m.in_prec} is reserved", "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    if prec.element_bits < 8:
        raise r.error(UnsupportedError, f"a flying {prec.name} read is not modelled (Q23)",
                      "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    if m.comb:
        raise r.error(UnsupportedError, f"COMB_USE={m.comb} in flying mode is not modelled",
                      "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    raw = read(r, mem, "DPU_RDMA_RDMA_SRC_BASE_ADDR", extents.mrdma, prec.storage, "DPU MRDMA")
    values = to_compute(raw, prec)
    if prec.code == 2 and not m.fp16_to_fp32:
        raise r.error(UnsupportedError, "fp16 main data without MRDMA_FP16TOFP32_EN is not modelled",
                      "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    data = values.transpose(0, 3, 1, 2).reshape(-1, height, width)[:channels]
    return data, prec, raw.shape[0] * height * width * ATOM


def ew_operand(r: TaskRegisters, mem: IovaSpace, m: RdmaMode, prec: Precision, per_pixel: bool,
               channels: int, height: int, width: int) -> tuple[np.ndarray, int]:
    """The EW stage's operand from ERDMA (and MRDMA when combined): per channel
    [C, 1, 1] or per pixel [C, H, W], raw storage values."""
    if not per_pixel:
        vec = read(r, mem, "DPU_RDMA_RDMA_EW_BASE_ADDR", extents.erdma, prec.storage, "DPU ERDMA").copy()
        return vec[:, None, None], channels * prec.itemsize
    n = -(-channels // prec.c2)
    line = width + r.field("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", "EW_LINE_NOTCH_ADDR")
    if m.comb == COMB_EW_PAIR:
        if not m.mrdma:
            raise r.error(HangError, "COMB_USE=5 needs MRDMA enabled (it reads half the operand)",
                          "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
        src = r.value("DPU_RDMA_RDMA_SRC_BASE_ADDR")
        ew = r.value("DPU_RDMA_RDMA_EW_BASE_ADDR")
        stride = r.field("DPU_RDMA_RDMA_EW_SURF_STRIDE", "EW_SURF_STRIDE")
        even_step = line * height + r.field("DPU_RDMA_RDMA_SURF_NOTCH", "SURF_NOTCH_ADDR")
        odd_step = line * height + r.field("DPU_RDMA_RDMA_EW_SURF_NOTCH", "EW_SURF_NOTCH")
        if ew != src + stride * ATOM:
            raise r.error(QuirkRejection, f"EW_BASE_ADDR={ew:#x} is not SRC_BASE_ADDR + EW_SURF_STRIDE "
                          f"({src:#x} + {stride} atoms): only that pairing is known to work (Q16)",
                          "DPU_RDMA_RDMA_EW_BASE_ADDR")
        if n > 1 and (even_step != 2 * stride or odd_step != 2 * stride):
            raise r.error(QuirkRejection, f"combined operand read: surface steps {even_step}/{odd_step} "
                          f"atoms (line*height + notch) must both be 2*EW_SURF_STRIDE={2 * stride} so that "
                          f"MRDMA and ERDMA interleave whole surfaces; EW_SURF_STRIDE below the cube's "
                          f"surface (W*H < 12 with Mesa's max(W*H, 12)) mis-strides on hardware (Q16)",
                          "DPU_RDMA_RDMA_EW_SURF_STRIDE")
        even = read(r, mem, "DPU_RDMA_RDMA_SRC_BASE_ADDR", extents.mrdma, prec.storage, "DPU MRDMA (operand)")
        odd = read(r, mem, "DPU_RDMA_RDMA_EW_BASE_ADDR", extents.erdma, prec.storage, "DPU ERDMA")
        surfaces = np.empty((n, height, width, prec.c2), prec.storage)
        surfaces[0::2] = even
        surfaces[1::2] = odd
    elif m.comb == 0:
        if r.field("DPU_RDMA_RDMA_EW_SURF_NOTCH", "EW_SURF_NOTCH"):
            raise r.error(UnsupportedError, "EW_SURF_NOTCH outside the combined read is not modelled",
                          "DPU_RDMA_RDMA_EW_SURF_NOTCH")
        surfaces = read(r, mem, "DPU_RDMA_RDMA_EW_BASE_ADDR", extents.erdma, prec.storage, "DPU ERDMA")
    else:
        raise r.error(UnsupportedError, f"COMB_USE={m.comb} is not modelled (0 or 5)",
                      "DPU_RDMA_RDMA_FEATURE_MODE_CFG")
    data = np.asarray(surfaces).transpose(0, 3, 1, 2).reshape(-1, height, width)[:channels]
    return data, n * height * width * ATOM
