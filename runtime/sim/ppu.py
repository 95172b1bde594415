"""PPU + PPU_RDMA: pooling (TRM ch. 36 'PPU' 0x6000-0x60DC, 'PPU_RDMA'
0x7000-0x7030; NVDLA PDP lineage).

Modelled as the HW-validated standalone pool runs it (gregordinary/
rockchip-npu-notes encodings/ppu-pooling.md): PPU_RDMA reads an NC1HWC2 fp16
cube (line and surface strides in bytes), the PPU reduces each kernel window
per channel (max, min, or average = window sum x RECIP_KERNEL_WIDTH x
RECIP_KERNEL_HEIGHT x 2**-32 with fp16(65536/k) reciprocals, padding counted),
and writes the output cube (surface stride DST_SURF_STRIDE bytes, lines of
out_width + NOTCH_ADDR atoms). fp16 only (Q14). Under stock rocket a task must
also raise the DPU interrupt (Q12), so a PPU task completes only where
`Quirks.completion_blocks` says the PPU's interrupt counts.
"""

from __future__ import annotations

import numpy as np

from rkc.ir.npu import extents
from rkc.ir.npu.registers import Block
from rkc.runtime.sim.errors import (AlignmentError, FieldError, GeometryError, QuirkRejection, SimError,
                                UnsupportedError)
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.numerics import PRECISIONS
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import TaskRegisters
from rkc.runtime.sim.stats import TaskStats

ATOM = 16
METHODS = {0: "avg", 1: "max", 2: "min"}
BURST_LENS = (3, 7, 15)
RDMA_SIZES = {2: 2}  # PPU_RDMA IN_PRECISION code -> bytes (16-bit only: fp16, Q14)


def _dims(r: TaskRegisters, prefix: str, names: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(r.field(f"{prefix}_{n}", n.replace("DATA_", "")) + 1 for n in names)


def run(r: TaskRegisters, mem: IovaSpace, quirks: Quirks, blocks: set, stats: TaskStats) -> None:
    fmt = r.fields("PPU_DATA_FORMAT")
    if fmt["PROC_PRECISION"] not in quirks.ppu_precisions:
        raise r.error(QuirkRejection, f"PROC_PRECISION={fmt['PROC_PRECISION']}: the PPU pools fp16 only "
                      "(int8 reads the bytes as fp16, Q14)", "PPU_DATA_FORMAT")
    prec = PRECISIONS[fmt["PROC_PRECISION"]]
    mode = r.fields("PPU_OPERATION_MODE_CFG")
    if not mode["FLYING_MODE"] or fmt["DPU_FLYIN"] or Block.PPU_RDMA not in blocks:
        raise r.error(UnsupportedError, "only the standalone pool (FLYING_MODE=1, DPU_FLYIN=0, PPU_RDMA "
                      "enabled) is modelled", "PPU_OPERATION_MODE_CFG")
    if mode["INDEX_EN"]:
        raise r.error(UnsupportedError, "INDEX_EN (argmax output) is not modelled", "PPU_OPERATION_MODE_CFG")
    method = METHODS.get(mode["POOLING_METHOD"])
    if method is None:
        raise r.error(FieldError, f"POOLING_METHOD={mode['POOLING_METHOD']} is reserved", "PPU_OPERATION_MODE_CFG")
    misc = r.fields("PPU_MISC_CTRL")
    if misc["BURST_LEN"] not in BURST_LENS:
        raise r.error(FieldError, f"BURST_LEN={misc['BURST_LEN']} is reserved (3, 7 or 15)", "PPU_MISC_CTRL")
    if misc["MC_SURF_OUT"] or misc["NONALIGN"]:
        raise r.error(UnsupportedError, "MC_SURF_OUT / NONALIGN are not modelled", "PPU_MISC_CTRL")

    iw = r.field("PPU_DATA_CUBE_IN_WIDTH", "CUBE_IN_WIDTH") + 1
    ih = r.field("PPU_DATA_CUBE_IN_HEIGHT", "CUBE_IN_HEIGHT") + 1
    ic = r.field("PPU_DATA_CUBE_IN_CHANNEL", "CUBE_IN_CHANNEL") + 1
    ow = r.field("PPU_DATA_CUBE_OUT_WIDTH", "CUBE_OUT_WIDTH") + 1
    oh = r.field("PPU_DATA_CUBE_OUT_HEIGHT", "CUBE_OUT_HEIGHT") + 1
    oc = r.field("PPU_DATA_CUBE_OUT_CHANNEL", "CUBE_OUT_CHANNEL") + 1
    rdma = (r.field("PPU_RDMA_RDMA_CUBE_IN_WIDTH", "CUBE_IN_WIDTH") + 1,
            r.field("PPU_RDMA_RDMA_CUBE_IN_HEIGHT", "CUBE_IN_HEIGHT") + 1,
            r.field("PPU_RDMA_RDMA_CUBE_IN_CHANNEL", "CUBE_IN_CHANNEL") + 1)
    if rdma != (iw, ih, ic) or oc != ic:
        raise r.error(GeometryError, f"PPU_RDMA cube {rdma}, PPU input {(iw, ih, ic)}, output channels {oc}: "
                      "must agree", "PPU_DATA_CUBE_IN_WIDTH")
    for n, what in ((iw, "width"), (ih, "height"), (ic, "channels")):
        if n > quirks.max_dpu_cube:
            raise r.error(QuirkRejection, f"pool cube {what} {n} exceeds {quirks.max_dpu_cube} (Q6)",
                          "PPU_DATA_CUBE_IN_WIDTH")
    k = r.fields("PPU_POOLING_KERNEL_CFG")
    kw, kh = k["KERNEL_WIDTH"] + 1, k["KERNEL_HEIGHT"] + 1
    sx, sy = k["KERNEL_STRIDE_WIDTH"] + 1, k["KERNEL_STRIDE_HEIGHT"] + 1
    p = r.fields("PPU_POOLING_PADDING_CFG")
    pl, pt, pr, pb = p["PAD_LEFT"], p["PAD_TOP"], p["PAD_RIGHT"], p["PAD_BOTTOM"]
    if (iw + pl + pr - kw) // sx + 1 != ow or (ih + pt + pb - kh) // sy + 1 != oh:
        raise r.error(GeometryError, f"a {kw}x{kh} window, stride {sx}x{sy}, padding L{pl} T{pt} R{pr} B{pb} over "
                      f"{iw}x{ih} gives {(iw + pl + pr - kw) // sx + 1}x{(ih + pt + pb - kh) // sy + 1}, not "
                      f"{ow}x{oh}", "PPU_POOLING_KERNEL_CFG")
    if max(pl, pr) >= kw or max(pt, pb) >= kh:
        raise r.error(GeometryError, "pooling padding must be smaller than the window", "PPU_POOLING_PADDING_CFG")

    in_bytes = RDMA_SIZES.get(r.field("PPU_RDMA_RDMA_DATA_FORMAT", "IN_PRECISION"))
    if in_bytes != prec.itemsize:
        raise r.error(QuirkRejection, "PPU_RDMA IN_PRECISION must be 16-bit (fp16 pools, Q14)",
                      "PPU_RDMA_RDMA_DATA_FORMAT")
    src = r.value("PPU_RDMA_RDMA_SRC_BASE_ADDR")
    line = r.value("PPU_RDMA_RDMA_SRC_LINE_STRIDE")
    if src % ATOM:
        raise r.error(AlignmentError, f"{src:#x} is not 16-byte aligned", "PPU_RDMA_RDMA_SRC_BASE_ADDR")
    if line < iw * ATOM:
        raise r.error(GeometryError, f"SRC_LINE_STRIDE={line} bytes is shorter than a {iw}-atom line",
                      "PPU_RDMA_RDMA_SRC_LINE_STRIDE")
    c2 = prec.c2
    surfaces = -(-ic // c2)
    try:
        raw = mem.strided(src, r.walk(extents.ppu_read), prec.storage, "PPU_RDMA read")
    except SimError as exc:
        raise exc.located(register="PPU_RDMA_RDMA_SRC_BASE_ADDR", entry=r.entry("PPU_RDMA_RDMA_SRC_BASE_ADDR"))
    x = raw.astype(np.float32).transpose(0, 3, 1, 2).reshape(-1, ih, iw)
    stats.dma_read["PPU_RDMA"] += surfaces * ih * iw * ATOM

    pad_bits = r.value("PPU_PADDING_VALUE_1_CFG") & 0xFFFF
    pad = float(np.array([pad_bits], np.uint16).view(np.float16)[0])
    xp = np.full((x.shape[0], ih + pt + pb, iw + pl + pr), pad, np.float32)
    xp[:, pt:pt + ih, pl:pl + iw] = x
    wins = [xp[:, ky:ky + sy * (oh - 1) + 1:sy, kx:kx + sx * (ow - 1) + 1:sx]
            for ky in range(kh) for kx in range(kw)]
    if method == "max":
        y = np.maximum.reduce(wins)
    elif method == "min":
        y = np.minimum.reduce(wins)
    else:
        rw = _recip(r, "PPU_RECIP_KERNEL_WIDTH", "RECIP_KERNEL_WIDTH")
        rh = _recip(r, "PPU_RECIP_KERNEL_HEIGHT", "RECIP_KERNEL_HEIGHT")
        y = np.add.reduce(wins) * np.float32(rw * rh * 2.0 ** -32)
    stats.macs += x.shape[0] * oh * ow * kh * kw

    dst = r.value("PPU_DST_BASE_ADDR")
    if dst % ATOM:
        raise r.error(AlignmentError, f"{dst:#x} is not 16-byte aligned", "PPU_DST_BASE_ADDR")
    out = np.zeros((surfaces * c2, oh, ow), np.float32)
    out[:ic] = y[:ic]
    native = out.astype(np.float16).reshape(surfaces, c2, oh, ow).transpose(0, 2, 3, 1)
    try:
        view = mem.strided(dst, r.walk(extents.ppu_write), np.float16, "PPU write-back", writable=True)
    except SimError as exc:
        raise exc.located(register="PPU_DST_BASE_ADDR", entry=r.entry("PPU_DST_BASE_ADDR"))
    view[...] = native
    stats.dma_written["PPU_WDMA"] += surfaces * oh * ow * ATOM


def _recip(r: TaskRegisters, reg: str, field: str) -> float:
    v = r.field(reg, field)
    if v >> 16:
        raise r.error(FieldError, f"{field}={v:#x}: the reciprocal is an fp16 bit pattern (16 bits)", reg)
    value = float(np.array([v], np.uint16).view(np.float16)[0])
    if not np.isfinite(value) or value <= 0:
        raise r.error(FieldError, f"{field}={v:#x} is not a positive fp16 reciprocal (k=1 overflows: 65536/1)", reg)
    return value
