"""DPU: the data processing unit after the accumulator (TRM ch. 36 'DPU'
0x4000-0x412C; NVDLA SDP lineage: BS = X1, BN = X2, EW = Y stages).

Per element, in order: CPEND (BS_OW: adds OW_OP x the input window sum, the
weight zero-point term of Mesa's uint8 convolutions), BS (ALU, MUL, ReLU), BN
(same) (those three in dpu_x.py), EW (operand conversion, ALU or MUL with the
ERDMA operand, ReLU),
OUT_CVT (scale, shift, offset, saturate), then the WDMA write in NC1HWC2.
Integer processing works on exact int64 values; float processing (fp16/bf16
convolutions) on float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.ir.npu import extents
from rkc.runtime.sim import dpu_rdma, dpu_x, lut
from rkc.runtime.sim.errors import (AlignmentError, FieldError, GeometryError, HangError, QuirkRejection,
                                SimError, UnsupportedError)
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.numerics import INT_RANGE, PRECISIONS, TIE_RULES, Precision, from_float, shift_round
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import TaskRegisters

ATOM = 16
BURST_LENS = (3, 7, 15)
OUT_PRECISIONS_INT = (0, 1, 4, 5)  # int8, int16, int32, fp32 (exact cast) from an integer datapath
OUT_PRECISIONS_FLOAT = (2, 5)  # fp16 (FP32TOFP16_EN), fp32
OUT_FP16 = 2  # fp16 output: from an integer datapath an open question (Q27)
EW_ALU = {0: "max", 1: "min", 2: "add", 4: "minus"}
EDATA_BYTES = {1: 1, 2: 2, 3: 4}


@dataclass
class DpuInput:
    """The DPU's main data and what it needs to know about its producer."""

    data: np.ndarray  # [C, H, W] int64 (integer datapath) or float32
    prec: Precision  # precision of the producer (CORE or MRDMA input)
    mode: str  # "direct" | "depthwise" | "flying"
    valid_channels: int  # channels holding defined data
    window_sum: np.ndarray | None = None


@dataclass
class DpuTraffic:
    read: dict[str, int]
    written: int


def rounding(quirks: Quirks, round_field: int | None) -> str:
    """The tie rule of a DPU shift (Q10): per its round field, or ties up for the EW
    multiplier's truncation, which has none (`round_field` None)."""
    if quirks.out_cvt_rounding == "floor":
        return "floor"
    return "half_up" if round_field is None else TIE_RULES[round_field]


def geometry(r: TaskRegisters, quirks: Quirks) -> tuple[int, int, int, int]:
    """(width, height, channels, original channels) of the DPU cube, checked."""
    w = r.field("DPU_DATA_CUBE_WIDTH", "WIDTH") + 1
    hf = r.fields("DPU_DATA_CUBE_HEIGHT")
    h = hf["HEIGHT"] + 1
    ch = r.fields("DPU_DATA_CUBE_CHANNEL")
    c, orig = ch["CHANNEL"] + 1, ch["ORIG_CHANNEL"] + 1
    if hf["MINMAX_CTL"]:
        raise r.error(UnsupportedError, "MINMAX_CTL is not modelled", "DPU_DATA_CUBE_HEIGHT")
    if orig > c:
        raise r.error(GeometryError, f"ORIG_CHANNEL+1={orig} exceeds CHANNEL+1={c}", "DPU_DATA_CUBE_CHANNEL")
    for n, what, reg in ((w, "width", "DPU_DATA_CUBE_WIDTH"), (h, "height", "DPU_DATA_CUBE_HEIGHT"),
                         (c, "channels", "DPU_DATA_CUBE_CHANNEL")):
        if n > quirks.max_dpu_cube:
            raise r.error(QuirkRejection, f"cube {what} {n} exceeds {quirks.max_dpu_cube}: large 13-bit "
                          "cube dimensions corrupt data on hardware (Q6)", reg)
    wd0 = r.fields("DPU_WDMA_SIZE_0")
    wd1 = r.fields("DPU_WDMA_SIZE_1")
    if (wd0["CHANNEL_WDMA"] + 1, wd1["HEIGHT_WDMA"] + 1, wd1["WIDTH_WDMA"] + 1) != (c, h, w):
        raise r.error(GeometryError, f"WDMA size {wd1['WIDTH_WDMA'] + 1}x{wd1['HEIGHT_WDMA'] + 1}x"
                      f"{wd0['CHANNEL_WDMA'] + 1} differs from the cube {w}x{h}x{c}", "DPU_WDMA_SIZE_0")
    if wd0["SIZE_C_WDMA"] or wd0["TP_PRECISION"]:
        raise r.error(UnsupportedError, "SIZE_C_WDMA / TP_PRECISION (transpose) are not modelled",
                      "DPU_WDMA_SIZE_0")
    return w, h, c, orig


def feature_mode(r: TaskRegisters) -> dict[str, int]:
    f = dict(r.fields("DPU_FEATURE_MODE_CFG"))
    if f["BURST_LEN"] not in BURST_LENS:
        raise r.error(FieldError, f"BURST_LEN={f['BURST_LEN']} is reserved (3, 7 or 15)", "DPU_FEATURE_MODE_CFG")
    for name in ("TP_EN", "RGP_TYPE", "NONALIGN"):
        if f[name]:
            raise r.error(UnsupportedError, f"{name} is not modelled", "DPU_FEATURE_MODE_CFG")
    if f["CONV_MODE"] not in (0, 3):
        raise r.error(FieldError, f"CONV_MODE={f['CONV_MODE']} is reserved", "DPU_FEATURE_MODE_CFG")
    return f


def run(r: TaskRegisters, mem: IovaSpace, quirks: Quirks, main: DpuInput, rdma: dpu_rdma.RdmaMode | None,
        geom: tuple[int, int, int, int], lut_state: tuple[np.ndarray, set]) -> DpuTraffic:
    w, h, c, orig = geom
    fmt = r.fields("DPU_DATA_FORMAT")
    proc = fmt["PROC_PRECISION"]
    if fmt["IN_PRECISION"] != main.prec.code or proc != main.prec.code:
        raise r.error(FieldError, f"IN/PROC_PRECISION {fmt['IN_PRECISION']}/{proc} differ from the main "
                      f"data's {main.prec.code} ({main.prec.name})", "DPU_DATA_FORMAT")
    if fmt["MC_SURF_OUT"]:
        raise r.error(UnsupportedError, "MC_SURF_OUT is not modelled", "DPU_DATA_FORMAT")
    if orig > main.valid_channels:
        raise r.error(GeometryError, f"ORIG_CHANNEL+1={orig} exceeds the {main.valid_channels} channels the "
                      "producer computes", "DPU_DATA_CUBE_CHANNEL")
    if main.data.shape != (c, h, w):
        raise r.error(GeometryError, f"DPU cube {w}x{h}x{c} differs from its input "
                      f"{main.data.shape[2]}x{main.data.shape[1]}x{main.data.shape[0]}", "DPU_DATA_CUBE_WIDTH")
    is_float = main.prec.is_float
    x = main.data
    if main.prec.code == INT4:
        x = _int4_result(r, quirks, x)
    traffic = DpuTraffic({}, 0)
    for stage in ("BS", "BN"):
        ops = dpu_x.operands(r, mem, quirks, stage, is_float, c)
        if ops.nbytes:
            traffic.read[dpu_x.DMA_NAME[stage]] = ops.nbytes
        if stage == "BS":
            x = dpu_x.cpend(r, x, main.window_sum, is_float, ops)
        x = dpu_x.stage(r, quirks, x, stage, is_float, ops)
    x = _ew(r, mem, quirks, x, rdma, main, is_float, (c, h, w), traffic, lut_state)
    out_prec, y = _out_cvt(r, quirks, x, is_float)
    traffic.written = _write(r, mem, quirks, y, out_prec, main, orig, (w, h, c))
    return traffic


INT4 = 6


def _int4_result(r: TaskRegisters, quirks: Quirks, acc: np.ndarray) -> np.ndarray:
    """The int4 datapath as documented (int16 out, size_e 7) and nothing more (Q23):
    every DPU stage bypassed, OUT_CVT the identity, a result within int16 (or the
    board's reading of an overflow, once measured)."""
    checks = (("DPU_BS_CFG", "BS_BYPASS", 1), ("DPU_BN_CFG", "BN_BYPASS", 1), ("DPU_EW_CFG", "EW_BYPASS", 1),
              ("DPU_BS_OW_CFG", "OD_BYPASS", 1), ("DPU_DATA_FORMAT", "OUT_PRECISION", 1),
              ("DPU_OUT_CVT_SCALE", "OUT_CVT_SCALE", 1), ("DPU_OUT_CVT_SCALE", "FP32TOFP16_EN", 0),
              ("DPU_OUT_CVT_SHIFT", "OUT_CVT_SHIFT", 0), ("DPU_OUT_CVT_SHIFT", "MINUS_EXP", 0))
    for reg, name, want in checks:
        if r.field(reg, name) != want:
            raise r.error(QuirkRejection, f"{name}={r.field(reg, name)}: the int4 datapath is documented only as "
                          f"int4 x int4 -> int16 with the DPU passing the sum through ({name}={want}, Q23)", reg)
    if r.value("DPU_OUT_CVT_OFFSET"):
        raise r.error(QuirkRejection, "OUT_CVT_OFFSET on the int4 datapath is undocumented (Q23)",
                      "DPU_OUT_CVT_OFFSET")
    lo, hi = INT_RANGE[1]
    if acc.size and (acc.min() < lo or acc.max() > hi):
        if quirks.int4_int16_overflow == "reject":
            raise r.error(QuirkRejection, f"an int4 sum of {int(acc.min())}..{int(acc.max())} leaves int16: "
                          "saturation, wrap or a wider accumulator is undocumented (Q23; bound K per task)",
                          "CNA_DATA_SIZE1")
        if quirks.int4_int16_overflow == "wrap":
            return ((np.asarray(acc, np.int64) - lo) % (1 << 16)) + lo
    return acc


def _ew(r: TaskRegisters, mem: IovaSpace, quirks: Quirks, x: np.ndarray, rdma: dpu_rdma.RdmaMode | None,
        main: DpuInput, is_float: bool, shape: tuple[int, int, int], traffic: DpuTraffic,
        lut_state: tuple[np.ndarray, set]) -> np.ndarray:
    cfg = r.fields("DPU_EW_CFG")
    erdma = r.fields("DPU_RDMA_RDMA_ERDMA_CFG") if rdma is not None else None
    erdma_on = erdma is not None and not erdma["ERDMA_DISABLE"]
    uses_operand = not cfg["EW_BYPASS"] and not cfg["EW_OP_BYPASS"] and cfg["EW_OP_SRC"]
    if erdma_on != uses_operand:
        if erdma_on:
            raise r.error(HangError, "ERDMA is enabled but the EW stage takes no operand from it (an armed, "
                          "unconsumed ERDMA hangs the job: mrdma-trap corollary)", "DPU_RDMA_RDMA_ERDMA_CFG")
        raise r.error(HangError, "the EW stage takes its operand from ERDMA (EW_OP_SRC=1) but ERDMA is "
                      "disabled", "DPU_EW_CFG")
    if cfg["EW_BYPASS"]:
        return x
    if cfg["EW_EQUAL_EN"] or cfg["EW_BINARY_EN"]:
        raise r.error(UnsupportedError, "EW min/max equal/binary modes are not modelled", "DPU_EW_CFG")
    use_lut = not cfg["EW_LUT_BYPASS"]
    if use_lut:
        if not is_float:
            raise r.error(UnsupportedError, "the LUT on an integer datapath is not modelled (Q22)", "DPU_EW_CFG")
        if uses_operand:
            raise r.error(UnsupportedError, "an ERDMA operand and the LUT in one EW stage: their order is "
                          "unknown (Q18)", "DPU_EW_CFG")
    if not cfg["EW_OP_BYPASS"] and not cfg["EW_OP_SRC"]:
        # the validated LUT programs leave the EW op on with a register operand of 0
        # (EW_CFG = RELU_BYPASS | OP_CVT_BYPASS); on hardware it does not clamp the
        # table index, so exactly that form is treated as inert (Q18)
        operands = [r.value(f"DPU_EW_OP_VALUE_{i}") for i in range(8)]
        inert = (use_lut and not cfg["EW_OP_TYPE"] and cfg["EW_ALU_ALGO"] == 0 and cfg["EW_OP_CVT_BYPASS"]
                 and not any(operands))
        if not inert:
            raise r.error(UnsupportedError, "an EW operation on the EW_OP_VALUE registers (EW_OP_SRC=0) is not "
                          "modelled (only the LUT programs' inert form)", "DPU_EW_CFG")
    elif not cfg["EW_OP_BYPASS"]:
        if main.mode == "flying" and quirks.flying_erdma == "reject":
            raise r.error(QuirkRejection, "an ERDMA operand without a convolution feeding the DPU wrote zeros "
                          "on hardware (Q13); use an identity convolution as the main feed", "DPU_EW_CFG")
        size = cfg["EDATA_SIZE"]
        if size != erdma["ERDMA_DATA_SIZE"] or size not in EDATA_BYTES:
            raise r.error(FieldError, f"EDATA_SIZE={size} / ERDMA_DATA_SIZE={erdma['ERDMA_DATA_SIZE']}: must "
                          "agree and be 8, 16 or 32 bit", "DPU_EW_CFG")
        if cfg["EW_DATA_MODE"] != erdma["ERDMA_DATA_MODE"] or cfg["EW_DATA_MODE"] not in (0, 1):
            raise r.error(FieldError, f"EW_DATA_MODE={cfg['EW_DATA_MODE']} / ERDMA_DATA_MODE="
                          f"{erdma['ERDMA_DATA_MODE']}: must agree and be per channel (0) or per pixel (1)",
                          "DPU_EW_CFG")
        if erdma["ERDMA_SURF_MODE"] or erdma["ERDMA_NONALIGN"]:
            raise r.error(UnsupportedError, "ERDMA surface/non-align modes are not modelled",
                          "DPU_RDMA_RDMA_ERDMA_CFG")
        nbytes = EDATA_BYTES[size]
        if is_float:
            if nbytes == 1:
                raise r.error(FieldError, "an 8-bit EW operand on a float datapath", "DPU_EW_CFG")
            eprec = PRECISIONS[2 if nbytes == 2 else 5]
        else:
            eprec = PRECISIONS[{1: 0, 2: 1, 4: 4}[nbytes]]
            if nbytes == 4 and quirks.ew_int32 == "reject":
                raise r.error(QuirkRejection, "a 32-bit integer EW operation: the EW ALU is reported float-only "
                              "(int32 adds return garbage, Q5)", "DPU_EW_CFG")
        c, h, w = shape
        raw, nread = dpu_rdma.ew_operand(r, mem, rdma, eprec, cfg["EW_DATA_MODE"] == 1, c, h, w)
        traffic.read["ERDMA"] = nread
        e = raw.astype(np.float32) if is_float else raw.astype(np.int64)
        e = _ew_cvt(r, quirks, e, cfg, is_float)
        if cfg["EW_OP_TYPE"]:
            x = _ew_mul(r, quirks, x, e, cfg, is_float)
        else:
            algo = EW_ALU.get(cfg["EW_ALU_ALGO"])
            if algo is None:
                raise r.error(UnsupportedError, f"EW_ALU_ALGO={cfg['EW_ALU_ALGO']} is not modelled "
                              "(0 max, 1 min, 2 add, 4 minus)", "DPU_EW_CFG")
            x = {"max": np.maximum, "min": np.minimum, "add": np.add, "minus": np.subtract}[algo](x, e)
    if use_lut:
        x = lut.apply(r, lut_state[0], lut_state[1], x)
    if not cfg["EW_RELU_BYPASS"]:
        if cfg["EW_RELUX_EN"]:
            raw = r.value("DPU_EW_RELUX_CMP_VALUE")
            cap = np.array([raw], np.uint32).view(np.float32)[0] if is_float else r.signed("DPU_EW_RELUX_CMP_VALUE")
            x = np.clip(x, 0, cap)
        else:
            x = np.maximum(x, 0)
    return x


def _ew_cvt(r: TaskRegisters, quirks: Quirks, e: np.ndarray, cfg, is_float: bool) -> np.ndarray:
    if cfg["EW_OP_CVT_BYPASS"]:
        return e
    sc = r.fields("DPU_EW_CVT_SCALE_VALUE")
    scale, shift = sc["EW_OP_CVT_SCALE"], sc["EW_OP_CVT_SHIFT"]
    offset = r.signed("DPU_EW_CVT_OFFSET_VALUE")
    if scale & 0x8000:
        raise r.error(FieldError, f"EW_OP_CVT_SCALE={scale:#x}: the sign of a scale >= 0x8000 is unknown",
                      "DPU_EW_CVT_SCALE_VALUE")
    if is_float:
        if offset or shift:
            raise r.error(UnsupportedError, "EW operand conversion with offset/shift on a float datapath is "
                          "not modelled", "DPU_EW_CVT_SCALE_VALUE")
        return e * np.float32(scale)
    mode = rounding(quirks, cfg["EW_CVT_ROUND"])
    if cfg["EW_CVT_TYPE"]:  # add first
        return shift_round((e + offset) * scale, shift, mode)
    return shift_round(e * scale, shift, mode) + offset


def _ew_mul(r: TaskRegisters, quirks: Quirks, x, e, cfg, is_float: bool):
    trunc = r.field("DPU_EW_CVT_SCALE_VALUE", "EW_TRUNCATE")
    trunc_neg = r.field("DPU_DATA_FORMAT", "EW_TRUNCATE_NEG")
    if is_float:
        if trunc or trunc_neg:
            raise r.error(UnsupportedError, "EW_TRUNCATE on a float datapath is not modelled",
                          "DPU_EW_CVT_SCALE_VALUE")
        y = x * e
    else:
        prod = x * e
        mode = rounding(quirks, None)
        y = np.where(prod >= 0, shift_round(prod, trunc, mode), shift_round(prod, trunc_neg, mode))
    return np.where(x < 0, y, x) if cfg["EW_MUL_PRELU"] else y


def _out_cvt(r: TaskRegisters, quirks: Quirks, x: np.ndarray, is_float: bool) -> tuple[Precision, np.ndarray]:
    out = r.field("DPU_DATA_FORMAT", "OUT_PRECISION")
    sc = r.fields("DPU_OUT_CVT_SCALE")
    sh = r.fields("DPU_OUT_CVT_SHIFT")
    offset = r.signed("DPU_OUT_CVT_OFFSET")
    scale, shift = sc["OUT_CVT_SCALE"], sh["OUT_CVT_SHIFT"]
    to16 = sc["FP32TOFP16_EN"]
    if is_float:
        if out not in OUT_PRECISIONS_FLOAT:
            raise r.error(UnsupportedError, f"OUT_PRECISION={out} from a float datapath is not modelled "
                          "(fp16 via FP32TOFP16_EN, or fp32)", "DPU_DATA_FORMAT")
        if bool(to16) != (out == 2):
            raise r.error(FieldError, f"FP32TOFP16_EN={to16} with OUT_PRECISION={out}: fp16 output needs the "
                          "fp32->fp16 converter and only fp16 output may use it", "DPU_OUT_CVT_SCALE")
        if shift:
            raise r.error(UnsupportedError, "OUT_CVT_SHIFT on a float datapath is not modelled",
                          "DPU_OUT_CVT_SHIFT")
        f = x.astype(np.float32)
        if sh["CVT_TYPE"]:
            f = (f + np.float32(offset)) * np.float32(scale)
        else:
            f = f * np.float32(scale) + np.float32(offset)
        if sh["MINUS_EXP"]:
            f = f * np.float32(2.0 ** -sh["MINUS_EXP"])
        return PRECISIONS[out], f
    if out == OUT_FP16:
        raise r.error(UnsupportedError, "fp16 output (OUT_PRECISION=2) from an integer datapath is not modelled "
                      "(Q27: measured on small single tiles only, wrong beyond them)", "DPU_DATA_FORMAT")
    if out not in OUT_PRECISIONS_INT:
        raise r.error(UnsupportedError, f"OUT_PRECISION={out} from an integer datapath is not modelled "
                      "(int8, int16, int32 or an fp32 cast)", "DPU_DATA_FORMAT")
    if to16 or sh["MINUS_EXP"]:
        raise r.error(FieldError, "FP32TOFP16_EN / MINUS_EXP belong to the float datapath", "DPU_OUT_CVT_SCALE")
    if shift > 62:
        raise r.error(FieldError, f"OUT_CVT_SHIFT={shift} shifts every value to 0 or -1", "DPU_OUT_CVT_SHIFT")
    mode = rounding(quirks, sh["CVT_ROUND"])
    if sh["CVT_TYPE"]:  # ALU (offset) first, then multiply
        y = shift_round((x + offset) * scale, shift, mode)
    else:
        y = shift_round(x * scale, shift, mode) + offset
    if out == 5:
        return PRECISIONS[5], y.astype(np.float32)
    lo, hi = INT_RANGE[out]
    return PRECISIONS[out], np.clip(y, lo, hi)


def _write(r: TaskRegisters, mem: IovaSpace, quirks: Quirks, y: np.ndarray, out: Precision, main: DpuInput,
           orig: int, dims: tuple[int, int, int]) -> int:
    w, h, c = dims
    ow = r.fields("DPU_BS_OW_CFG")
    sizes = {ow["SIZE_E_0"], ow["SIZE_E_1"], ow["SIZE_E_2"]}
    key = ("depthwise" if main.mode == "depthwise" else "direct", main.prec.code)
    per_pass = quirks.dpu_channels_per_pass.get(key)
    if per_pass is None:
        raise r.error(UnsupportedError, f"no known DPU writer geometry for a {key[0]} {main.prec.name} "
                      "datapath (Q4)", "DPU_BS_OW_CFG")
    size_e = per_pass * out.itemsize // 8 - 1
    if sizes != {size_e}:
        raise r.error(QuirkRejection, f"SIZE_E_0/1/2={ow['SIZE_E_0']}/{ow['SIZE_E_1']}/{ow['SIZE_E_2']}: a "
                      f"{key[0]} {main.prec.name} datapath writing {out.name} passes {per_pass} channels "
                      f"= {per_pass * out.itemsize} bytes, size_e {size_e} (Q4)", "DPU_BS_OW_CFG")
    stride = r.value("DPU_DST_SURF_STRIDE")
    surf_add = r.value("DPU_SURFACE_ADD")
    if surf_add != stride * (size_e + 1):
        raise r.error(QuirkRejection, f"SURFACE_ADD={surf_add:#x} must be DST_SURF_STRIDE x (size_e+1) = "
                      f"{stride * (size_e + 1):#x} (Q4)", "DPU_SURFACE_ADD")
    for name in quirks.unnamed_zero:
        if name.startswith("UNNAMED_0x40") and r.value(name) != 0:
            raise r.error(FieldError, f"{name}={r.value(name):#x}: every known-good stream writes 0 (Q8)", name)
    notch = r.fields("DPU_DATA_CUBE_NOTCH_ADDR")
    if notch["NOTCH_ADDR_0"] != notch["NOTCH_ADDR_1"]:
        raise r.error(QuirkRejection, "NOTCH_ADDR_0 and NOTCH_ADDR_1 differ; only equal values are known "
                      "(Q4)", "DPU_DATA_CUBE_NOTCH_ADDR")
    base = r.value("DPU_DST_BASE_ADDR")
    if base % ATOM:
        raise r.error(AlignmentError, f"destination {base:#x} is not 16-byte aligned (TRM: bits 31:4)",
                      "DPU_DST_BASE_ADDR")
    walk = r.walk(extents.dpu_write)  # whole writer passes (the SIZE_E checked above)
    surfaces, c2 = walk.shape[0], walk.shape[3]
    full = np.empty((surfaces * c2, h, w), y.dtype)
    full[:orig] = y[:orig]
    pend = r.signed("DPU_OFFSET_PEND", "OFFSET_PEND")
    full[orig:] = pend if not out.is_float else np.float32(
        np.array([pend & 0xFFFF], np.uint16).view(np.float16)[0])
    if out.is_float:
        stored = from_float(full, out)
    else:
        stored = full.astype(out.storage)
    native = stored.reshape(surfaces, c2, h, w).transpose(0, 2, 3, 1)
    try:
        view = mem.strided(base, walk, out.storage, "DPU write-back (WDMA)", writable=True)
    except SimError as exc:
        raise exc.located(register="DPU_DST_BASE_ADDR", entry=r.entry("DPU_DST_BASE_ADDR"))
    view[...] = native
    return surfaces * h * w * ATOM
