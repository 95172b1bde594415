"""The DPU's per-channel stages: CPEND, BS and BN (NVDLA SDP X1 / X2), and the
operands BRDMA / NRDMA fetch for them.

Each of BS and BN runs ALU -> MUL (with its shift) -> ReLU / ReLU-X, on a
register operand or one per output channel from its DMA (NVDLA cmod
nvdla/hw cmod/hls/sdp/sdp_x.cpp @ 9e5648d0; TRM ch. 36 DPU_BS_* / DPU_BN_*).
CPEND, before BS, adds OW_OP (or a per-channel operand) times the sum of the
input window (Q17). What the DMAs fetch is set by DATA_USE (bits: 1 ALU,
2 CPEND, 4 MUL) and laid out as `LAYOUTS` says (Q21). Integer datapaths work on
exact int64 values, float datapaths on float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.ir.npu import extents
from rkc.runtime.sim import dpu_rdma
from rkc.runtime.sim.errors import FieldError, HangError, QuirkRejection, SimError, UnsupportedError
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.numerics import INT_RANGE, shift_round
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import TaskRegisters

ALU, CPEND, MUL = dpu_rdma.DATA_USE_ALU, dpu_rdma.DATA_USE_CPEND, dpu_rdma.DATA_USE_MUL

# ALU_ALGO -> operation (NVDLA: 0 max, 1 min, 2 sum; TRM: 4 minus); which of them a
# task may use is Quirks.bs_bn_alu_algos (Q11)
ALU_OPS = {0: np.maximum, 1: np.minimum, 2: np.add, 4: np.subtract}
ALU_NAMES = {0: "max", 1: "min", 2: "add", 4: "minus"}


@dataclass(frozen=True)
class Layout:
    """How one DATA_USE value lays the per-channel operands out in memory."""

    feeds: int  # DATA_USE bits the DMA delivers
    group_channels: int  # channels per group (0: dense vectors, one operand kind only)
    group_bytes: int = 0
    offsets: tuple[tuple[int, int, str], ...] = ()  # (DATA_USE bit, byte offset in a group, dtype)


# Dense vectors (1: Mesa's int32 bias; 4: an int16 / fp16 multiplier, unmeasured), and
# the 64-byte groups of 8 channels measured on RK3588 for BS (Q21: rockchip-npu-notes
# encodings/out-cvt-converter.md @ 224b1390, sdp-stage-precision.md).
LAYOUTS = {
    ALU: Layout(ALU, 0),
    MUL: Layout(MUL, 0),
    ALU | CPEND | MUL: Layout(ALU | CPEND | MUL, 8, 64, ((ALU, 0, "<i4"), (CPEND, 32, "<i2"), (MUL, 48, "<i2"))),
}
GROUPED = ALU | CPEND | MUL


@dataclass
class Operands:
    """Per-channel operands one stage reads from memory ([C] arrays), and the bytes read."""

    alu: np.ndarray | None = None
    cpend: np.ndarray | None = None
    mul: np.ndarray | None = None
    nbytes: int = 0


_DMA = {"BS": ("DPU_RDMA_RDMA_BRDMA_CFG", "BRDMA_DATA_USE", "DPU_RDMA_RDMA_BS_BASE_ADDR"),
        "BN": ("DPU_RDMA_RDMA_NRDMA_CFG", "NRDMA_DATA_USE", "DPU_RDMA_RDMA_BN_BASE_ADDR")}
_EXTENT = {"BS": extents.bs_operand, "BN": extents.bn_operand}
DMA_NAME = {"BS": "BRDMA", "BN": "NRDMA"}  # for the traffic counters


def operands(r: TaskRegisters, mem: IovaSpace, quirks: Quirks, stage: str, is_float: bool,
             channels: int) -> Operands:
    """Check the stage's DATA_USE against what the stage consumes, and fetch."""
    rdma_reg, use_field, base_reg = _DMA[stage]
    use = r.field(rdma_reg, use_field)
    p = stage + "_"
    cfg = r.fields(f"DPU_{stage}_CFG")
    if cfg[p + "BYPASS"]:
        if use:
            raise r.error(HangError, f"{stage} is bypassed but its RDMA is told to fetch operands "
                          f"(DATA_USE={use}) nobody consumes", rdma_reg)
        return Operands()
    mul_cfg = r.fields(f"DPU_{stage}_MUL_CFG")
    wants = ((ALU if not cfg[p + "ALU_BYPASS"] and cfg[p + "ALU_SRC"] else 0)
             | (MUL if not cfg[p + "MUL_BYPASS"] and mul_cfg[p + "MUL_SRC"] else 0)
             | (CPEND if stage == "BS" and _cpend_from_dma(r) else 0))
    if use == GROUPED:
        _check_grouped(r, quirks, stage, is_float, wants, rdma_reg)
    elif use != wants:
        raise r.error(HangError, f"{stage} reads operands {wants:#x} from memory but DATA_USE={use:#x} "
                      "(an unfed or unconsumed operand DMA stalls the DPU)", rdma_reg)
    if not use:
        return Operands()
    layout = LAYOUTS.get(use)
    if layout is None:
        raise r.error(UnsupportedError, f"{stage} operands DATA_USE={use:#x}: their layout in memory is not "
                      "modelled (known: 1 ALU, 4 MUL, 7 the 64-byte groups of Q21)", rdma_reg)
    try:
        if layout.group_channels:
            return _grouped(r, mem, layout, stage, channels, wants)
        dtype = np.dtype((np.float32 if is_float else np.int32) if use == ALU else
                         (np.float16 if is_float else np.int16))
        vec = dpu_rdma.read(r, mem, base_reg, _EXTENT[stage], dtype, f"DPU {stage} operand DMA").copy()
        value = vec.astype(np.float32 if is_float else np.int64)
        return Operands(alu=value, nbytes=vec.nbytes) if use == ALU else Operands(mul=value, nbytes=vec.nbytes)
    except SimError as exc:
        raise exc.located(register=base_reg, entry=r.entry(base_reg))


def _cpend_from_dma(r: TaskRegisters) -> bool:
    ow = r.fields("DPU_BS_OW_CFG")
    return bool(ow["OW_SRC"]) and not ow["OD_BYPASS"]


def _check_grouped(r: TaskRegisters, quirks: Quirks, stage: str, is_float: bool, wants: int,
                   rdma_reg: str) -> None:
    """DATA_USE=7 as measured: BS with ALU and MUL both reading the groups (CPEND
    reads its part only with OW_SRC=1); the same on BN hung every task (Q21)."""
    measured = wants & (ALU | MUL) == ALU | MUL
    if stage not in quirks.grouped_operand_stages:
        if measured:
            raise r.error(HangError, f"{stage} with ALU and MUL operands from DATA_USE=7 groups: every such "
                          "task hung on RK3588 (Q21)", rdma_reg)
        raise r.error(UnsupportedError, f"{stage} operands in DATA_USE=7 groups are not modelled (Q21)", rdma_reg)
    if is_float:
        raise r.error(UnsupportedError, "DATA_USE=7 operand groups on a float datapath are not modelled (measured "
                      "on int8 only, Q21)", rdma_reg)
    if not measured:
        raise r.error(UnsupportedError, f"DATA_USE=7 with {stage} operands {wants:#x} from memory: measured only "
                      "with the ALU and the MUL both reading the groups (Q21)", rdma_reg)


def _grouped(r: TaskRegisters, mem: IovaSpace, layout: Layout, stage: str, channels: int,
             wants: int) -> Operands:
    groups = -(-channels // layout.group_channels)
    addr = dpu_rdma.address(r, _DMA[stage][2])
    region = mem.region(addr, r.walk(_EXTENT[stage]).span()[1], "DPU operand DMA (groups)")

    def decode() -> np.ndarray:
        raw = region.data().reshape(groups, layout.group_bytes)
        n = layout.group_channels
        cols = [np.ascontiguousarray(raw[:, off:off + n * np.dtype(dt).itemsize]).view(dt).reshape(-1)[:channels]
                for _, off, dt in layout.offsets]
        return np.stack(cols).astype(np.int64)  # rows in LAYOUT order

    table = mem.decoded(region, ("operand groups", layout.feeds, channels), decode)
    rows = {bit: table[i] for i, (bit, _, _) in enumerate(layout.offsets)}
    return Operands(alu=rows[ALU] if wants & ALU else None, cpend=rows[CPEND] if wants & CPEND else None,
                    mul=rows[MUL] if wants & MUL else None, nbytes=region.nbytes)


def cpend(r: TaskRegisters, x: np.ndarray, window_sum: np.ndarray | None, is_float: bool,
          ops: Operands) -> np.ndarray:
    """x + OW x (input window sum): OW is BS_OW_OP, or per channel (the CPEND part of
    the BS groups) with OW_SRC=1 (Q17, Q21)."""
    ow = r.fields("DPU_BS_OW_CFG")
    if ow["RGP_CNTER"] or ow["TP_ORG_EN"]:
        raise r.error(UnsupportedError, "RGP_CNTER / TP_ORG_EN are not modelled", "DPU_BS_OW_CFG")
    if ow["OD_BYPASS"]:
        return x
    if is_float:
        # CPEND adds the weight zero-point term of quantized convolutions; on the fp16
        # datapath it is inert (rocket-userspace gen_conv2d_dw_fp16 writes OW_OP=0x80
        # with OD_BYPASS=0 and is HW-validated bit-exact, npu_regcmd.c @ e0677862)
        return x
    if window_sum is None:
        raise r.error(HangError, "CPEND (OD_BYPASS=0) needs the input window sums the CORE computes with "
                      "QD_EN=1 and a convolution feeding the DPU", "DPU_BS_OW_CFG")
    s = window_sum  # direct: [H, W] over all input channels; depthwise: [C, H, W]
    n = s.shape[0] if s.ndim == 3 else x.shape[0]
    if ow["OW_SRC"]:
        op = ops.cpend[:n].reshape((n,) + (1,) * (x.ndim - 1))
        what, reg = "a per-channel CPEND operand (OW_SRC=1)", "DPU_BS_OW_CFG"
        nonzero = bool(op.any())
    else:
        op = r.signed("DPU_BS_OW_OP", "OW_OP")
        what, reg = "OW_OP != 0", "DPU_BS_OW_OP"
        nonzero = op != 0
    if nonzero and r.field("CORE_CLIP_TRUNCATE", "CLIP_TRUNCATE"):
        raise r.error(QuirkRejection, f"CPEND ({what}) together with CORE CLIP_TRUNCATE: whether the window-sum "
                      "term is truncated with the accumulator is unknown (Q17)", reg)
    out = x.copy()
    out[:n] += op * s
    return out


def stage(r: TaskRegisters, quirks: Quirks, x: np.ndarray, stage: str, is_float: bool,
          ops: Operands) -> np.ndarray:
    """BS or BN: ALU -> MUL (shift, PReLU) -> ReLU(X)."""
    cfg_reg = f"DPU_{stage}_CFG"
    cfg = r.fields(cfg_reg)
    p = stage + "_"
    if cfg[p + "BYPASS"]:
        return x
    per_channel = (-1,) + (1,) * (x.ndim - 1)
    if not cfg[p + "ALU_BYPASS"]:
        algo = cfg[p + "ALU_ALGO"]
        if algo not in quirks.bs_bn_alu_algos or algo not in ALU_OPS:
            raise r.error(QuirkRejection, f"{p}ALU_ALGO={algo} is not a known operation (0 max, 1 min, 2 add, "
                          "4 minus; Q11)", cfg_reg)
        if cfg[p + "ALU_SRC"]:
            operand = ops.alu.reshape(per_channel)
        else:
            raw = r.value(f"DPU_{stage}_ALU_CFG")
            operand = (np.array([raw], np.uint32).view(np.float32)[0] if is_float
                       else r.signed(f"DPU_{stage}_ALU_CFG"))
        x = ALU_OPS[algo](x, operand)

    if not cfg[p + "MUL_BYPASS"]:
        mul_cfg = r.fields(f"DPU_{stage}_MUL_CFG")
        if mul_cfg[p + "TRUNCATE_SRC"]:
            raise r.error(UnsupportedError, f"{p}TRUNCATE_SRC=1 (shift from memory) is not modelled",
                          f"DPU_{stage}_MUL_CFG")
        if mul_cfg[p + "MUL_SRC"]:
            m = ops.mul.reshape(per_channel)
        elif is_float:
            m = np.float32(np.array([mul_cfg[p + "MUL_OPERAND"]], np.uint16).view(np.float16)[0])
        else:
            m = r.signed(f"DPU_{stage}_MUL_CFG", p + "MUL_OPERAND")
        shift_pos = mul_cfg[p + "MUL_SHIFT_VALUE"]
        shift_neg = r.field("DPU_DATA_FORMAT", f"{p}MUL_SHIFT_VALUE_NEG")
        if is_float:
            if shift_pos or shift_neg:
                raise r.error(UnsupportedError, f"{p}MUL shifts on a float datapath are not modelled",
                              f"DPU_{stage}_MUL_CFG")
            y = x * m
        else:
            y = _int_mul(x, m, shift_pos, shift_neg, quirks)
        x = np.where(x < 0, y, x) if cfg[p + "MUL_PRELU"] else y

    if not cfg[p + "RELU_BYPASS"]:
        if cfg[p + "RELUX_EN"]:
            raw = r.value(f"DPU_{stage}_RELUX_CMP_VALUE")
            cap = np.array([raw], np.uint32).view(np.float32)[0] if is_float else r.signed(
                f"DPU_{stage}_RELUX_CMP_VALUE")
            x = np.clip(x, 0, cap)
        else:
            x = np.maximum(x, 0)
    elif cfg[p + "RELUX_EN"]:
        raise r.error(FieldError, f"{p}RELUX_EN with {p}RELU_BYPASS: the clamp needs the ReLU", cfg_reg)
    return x


def _int_mul(x: np.ndarray, m, shift_pos: int, shift_neg: int, quirks: Quirks) -> np.ndarray:
    """The integer multiplier as measured on BS (Q21): the product held wide, shifted
    right by the positive or the negative shift field according to its sign,
    rounded (half to even), saturated to int32."""
    prod = x * m
    mode = quirks.bs_bn_mul_rounding
    y = np.where(prod >= 0, shift_round(prod, shift_pos, mode), shift_round(prod, shift_neg, mode))
    lo, hi = INT_RANGE[4]
    return np.clip(y, lo, hi)
