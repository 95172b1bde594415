"""CNA: convolution front end — feature DMA, input conversion, padding,
weight fetch (TRM ch. 36 'CNA' registers 0x1000-0x1184).

`fetch_conv` reads what the CNA registers of one task describe and returns the
padded input cube and the weights, in the values the MAC array multiplies.
Layout facts (NC1HWC2 features, 1 KiB weight tiles) come from ir/npu/layout.py;
the stride model is open question Q3 (runtime/sim/quirks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.ir.npu import extents, layout
from rkc.runtime.sim.errors import (AlignmentError, FieldError, GeometryError, QuirkRejection, SimError,
                                UnsupportedError)
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.numerics import PRECISIONS, TIE_RULES, Precision, shift_round, to_compute
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import TaskRegisters

ATOM = 16
CONV_MODES = {0: "direct", 3: "depthwise"}
CNA_PRECISIONS = (0, 1, 2, 3, 6)  # int8, int16, fp16, bf16, int4 (tf32 7 not modelled yet)
INT4 = 6
BURST_LENS = (3, 7, 15)  # TRM DMA_CON0: burst 4, 8, 16
ARGB_ONE_CHANNEL = 8


@dataclass
class ConvInput:
    """What the CNA hands the MAC array for one task."""

    prec: Precision
    mode: str  # "direct" | "depthwise"
    x: np.ndarray  # padded input [C, Hp, Wp] (int8/int16 values, or float32)
    weights: np.ndarray  # direct [K, kh, kw, C]; depthwise [kh, kw, C] (int8/int16, or float32)
    kernels: int
    channels: int
    kh: int
    kw: int
    sy: int
    sx: int
    out_h: int
    out_w: int
    in_h: int
    in_w: int
    feature_bytes: int  # DMA traffic
    weight_bytes: int
    weight_key: tuple  # identifies the weights in CBUF (address, bytes, banks)
    data_banks: int
    weight_banks: int
    weight_reuse: bool
    data_reuse: bool


def _dims(r: TaskRegisters) -> dict[str, int]:
    d = {}
    for name in ("CNA_DATA_SIZE0", "CNA_DATA_SIZE1", "CNA_DATA_SIZE2", "CNA_DATA_SIZE3",
                 "CNA_FC_DATA_SIZE0", "CNA_FC_DATA_SIZE1", "CNA_WEIGHT_SIZE0", "CNA_WEIGHT_SIZE1",
                 "CNA_WEIGHT_SIZE2", "CNA_CONV_CON3", "CNA_PAD_CON0", "CNA_CBUF_CON0",
                 "CNA_CBUF_CON1", "CNA_CONV_CON2"):
        d.update(r.fields(name))
    return d


def precision_of(r: TaskRegisters) -> Precision:
    ip = r.require("CNA_CONV_CON1", "IN_PRECISION", CNA_PRECISIONS, "int8/int16/fp16/bf16/int4")
    pp = r.field("CNA_CONV_CON1", "PROC_PRECISION")
    if pp != ip:
        raise r.error(FieldError, f"PROC_PRECISION={pp} differs from IN_PRECISION={ip} "
                      "(input conversion between precisions is not modelled)", "CNA_CONV_CON1")
    return PRECISIONS[ip]


def fetch_conv(r: TaskRegisters, mem: IovaSpace, quirks: Quirks) -> ConvInput:
    con1 = r.fields("CNA_CONV_CON1")
    prec = precision_of(r)
    mode = CONV_MODES.get(con1["CONV_MODE"])
    if mode is None:
        raise r.error(FieldError, f"CONV_MODE={con1['CONV_MODE']} is reserved (0 direct, 3 depthwise)",
                      "CNA_CONV_CON1")
    if con1["DECONV"]:
        raise r.error(UnsupportedError, "DECONV is not modelled (Q24; lower deconvolution to a "
                      "zero-inserted direct convolution)", "CNA_CONV_CON1")
    d = _dims(r)
    _check_static(r, d, quirks)
    if prec.code == INT4:
        _check_int4(r, d, mode, con1)

    in_w, in_h = d["DMA_WIDTH"], d["DMA_HEIGHT"]
    channels = d["DATAIN_CHANNEL"]
    argb = con1["ARGB_IN"]
    if argb:
        x = _fetch_argb(r, mem, prec, in_w, in_h, channels)
        feature_bytes = in_h * r.field("CNA_DMA_CON1", "LINE_STRIDE")
    else:
        if con1["NONALIGN_DMA"]:
            raise r.error(UnsupportedError, "NONALIGN_DMA without ARGB input is not modelled",
                          "CNA_CONV_CON1")
        x, feature_bytes = _fetch_feature(r, mem, prec, in_w, in_h, channels,
                                          group_line=not con1["GROUP_LINE_OFF"])

    kh, kw, kernels = d["WEIGHT_HEIGHT"], d["WEIGHT_WIDTH"], d["WEIGHT_KERNELS"]
    sy, sx = d["CONV_Y_STRIDE"], d["CONV_X_STRIDE"]
    out_w = d["DATAOUT_WIDTH"]
    atomics = d["DATAOUT_ATOMICS"]
    if out_w == 0 or atomics % out_w:
        raise r.error(GeometryError, f"DATAOUT_ATOMICS={atomics} is not a multiple of "
                      f"DATAOUT_WIDTH={out_w}", "CNA_DATA_SIZE3")
    out_h = atomics // out_w
    pad_top, pad_left = d["PAD_TOP"], d["PAD_LEFT"]
    _check_window(r, "height", in_h, out_h, sy, kh, pad_top, "PAD_TOP", "CONV_Y_STRIDE")
    _check_window(r, "width", in_w, out_w, sx, kw, pad_left, "PAD_LEFT", "CONV_X_STRIDE")
    if quirks.feature_grains_min and d["FEATURE_GRAINS"] < sy + kh + 1:
        raise r.error(QuirkRejection, f"FEATURE_GRAINS={d['FEATURE_GRAINS']} is below the TRM's "
                      f"y_stride + kernel_h + 1 = {sy + kh + 1} (Q6)", "CNA_CONV_CON2")
    if in_h < quirks.min_feature_rows:
        raise r.error(QuirkRejection, f"input has {in_h} rows; fewer than "
                      f"{quirks.min_feature_rows} rows compute wrongly on hardware (Q2: pad M to 4)",
                      "CNA_FC_DATA_SIZE0")

    pad_value = _pad_value(r, prec)
    xp = _pad(x, pad_top, pad_left, (out_h - 1) * sy + kh, (out_w - 1) * sx + kw, pad_value)

    weights, weight_bytes = _fetch_weights(r, mem, prec, mode, d, channels)
    reuse = r.fields("CNA_CBUF_CON0")
    return ConvInput(
        prec=prec, mode=mode, x=xp, weights=weights, kernels=kernels, channels=channels,
        kh=kh, kw=kw, sy=sy, sx=sx, out_h=out_h, out_w=out_w, in_h=in_h, in_w=in_w,
        feature_bytes=feature_bytes, weight_bytes=weight_bytes,
        weight_key=(r.value("CNA_DCOMP_ADDR0"), d["WEIGHT_BYTES"], d["WEIGHT_BANK"], d["DATA_BANK"]),
        data_banks=d["DATA_BANK"], weight_banks=d["WEIGHT_BANK"],
        weight_reuse=bool(reuse["WEIGHT_REUSE"]), data_reuse=bool(reuse["DATA_REUSE"]))


def _check_static(r: TaskRegisters, d: dict[str, int], quirks: Quirks) -> None:
    """Field values that are reserved, unsupported or inconsistent."""
    dma0 = r.fields("CNA_DMA_CON0")
    for f in ("WEIGHT_BURST_LEN", "DATA_BURST_LEN"):
        if dma0[f] not in BURST_LENS:
            raise r.error(FieldError, f"{f}={dma0[f]} is reserved (3, 7 or 15)", "CNA_DMA_CON0")
    if d["ATROUS_X_DILATION"] or d["ATROUS_Y_DILATION"] or d["DECONV_X_STRIDE"] or d["DECONV_Y_STRIDE"]:
        raise r.error(QuirkRejection, "atrous dilation / deconvolution strides: the encoding is "
                      "unverified (Q15)", "CNA_CONV_CON3")
    if d["NN_MODE"]:
        raise r.error(UnsupportedError, f"NN_MODE={d['NN_MODE']} (multi-core co-work) is not "
                      "modelled; single-core mode is 0", "CNA_CONV_CON3")
    if not (1 <= d["CONV_X_STRIDE"] and 1 <= d["CONV_Y_STRIDE"]):
        raise r.error(FieldError, "convolution strides must be >= 1", "CNA_CONV_CON3")
    if not (d["WEIGHT_WIDTH"] and d["WEIGHT_HEIGHT"] and d["WEIGHT_KERNELS"]):
        raise r.error(FieldError, "kernel width, height and count must be >= 1", "CNA_WEIGHT_SIZE2")
    if d["KERNEL_GROUP"] or d["CSC_WO_EN"] or d["CSC_DO_EN"] or d["CMD_FIFO_SRST"]:
        raise r.error(UnsupportedError, "CONV_CON2 KERNEL_GROUP/CSC_*_EN/CMD_FIFO_SRST other than 0 "
                      "are not modelled", "CNA_CONV_CON2")
    if d["SURF_MODE"] > 1:
        raise r.error(UnsupportedError, f"SURF_MODE={d['SURF_MODE']} (multi-surface series) is not "
                      "modelled", "CNA_DATA_SIZE3")
    fc0 = r.fields("CNA_FC_CON0")
    if fc0["FC_SKIP_EN"]:
        raise r.error(UnsupportedError, "FC zero-skipping is not modelled", "CNA_FC_CON0")
    if r.value("CNA_DCOMP_CTRL") & 0x7:
        raise r.error(UnsupportedError, "weight decompression (DECOMP_CONTROL != 0) is not modelled",
                      "CNA_DCOMP_CTRL")
    if d["FC_DATA_BANK"]:
        raise r.error(FieldError, "FC_DATA_BANK must be 0 outside FC zero-skipping (TRM)", "CNA_CBUF_CON0")
    if d["DATAIN_CHANNEL"] != d["DMA_CHANNEL"]:
        raise r.error(GeometryError, f"DATAIN_CHANNEL={d['DATAIN_CHANNEL']} differs from "
                      f"DMA_CHANNEL={d['DMA_CHANNEL']}", "CNA_FC_DATA_SIZE1")
    if d["DATAIN_CHANNEL_REAL"] + 1 > d["DATAIN_CHANNEL"]:
        raise r.error(GeometryError, f"DATAIN_CHANNEL_REAL+1={d['DATAIN_CHANNEL_REAL'] + 1} exceeds "
                      f"DATAIN_CHANNEL={d['DATAIN_CHANNEL']}", "CNA_DATA_SIZE1")
    if d["DMA_WIDTH"] > d["DATAIN_WIDTH"] or d["DMA_HEIGHT"] > d["DATAIN_HEIGHT"]:
        raise r.error(GeometryError, f"DMA {d['DMA_WIDTH']}x{d['DMA_HEIGHT']} exceeds the input cube "
                      f"{d['DATAIN_WIDTH']}x{d['DATAIN_HEIGHT']}", "CNA_FC_DATA_SIZE0")
    if not d["DMA_WIDTH"] or not d["DMA_HEIGHT"] or not d["DATAIN_CHANNEL"]:
        raise r.error(GeometryError, "empty input cube", "CNA_FC_DATA_SIZE0")


def _check_int4(r: TaskRegisters, d: dict[str, int], mode: str, con1: dict[str, int]) -> None:
    """int4 is documented for the GEMM only (hw-matmul.md 2.1: 1x1 direct, NC1HWC2 A of
    32-channel atoms, whole 64-kernel weight tiles); anything else has no known layout."""
    if mode != "direct" or (d["WEIGHT_WIDTH"], d["WEIGHT_HEIGHT"]) != (1, 1) or \
            (d["CONV_X_STRIDE"], d["CONV_Y_STRIDE"]) != (1, 1) or d["PAD_TOP"] or d["PAD_LEFT"]:
        raise r.error(UnsupportedError, "int4 is modelled for the GEMM only (1x1 direct convolution, stride 1, "
                      "no padding; hw-matmul.md 2.1)", "CNA_CONV_CON1")
    if con1["ARGB_IN"] or con1["GROUP_LINE_OFF"]:
        raise r.error(UnsupportedError, "int4 features are modelled in the cube layout with group-line fetch",
                      "CNA_CONV_CON1")
    if d["WEIGHT_KERNELS"] % layout.INT4_KERNEL_GROUP:
        raise r.error(QuirkRejection, f"WEIGHT_KERNELS={d['WEIGHT_KERNELS']}: int4 weights are documented in "
                      f"whole tiles of {layout.INT4_KERNEL_GROUP} kernels (N % 64, hw-matmul.md 2.3)",
                      "CNA_WEIGHT_SIZE2")
    if d["DATAIN_CHANNEL"] % layout.CHANNEL_GROUP:
        raise r.error(GeometryError, f"DATAIN_CHANNEL={d['DATAIN_CHANNEL']}: int4 needs K % 32 "
                      "(hw-matmul.md 2.3)", "CNA_DATA_SIZE1")


def _check_window(r: TaskRegisters, axis: str, n_in: int, n_out: int, stride: int, k: int,
                  pad_before: int, pad_reg: str, stride_reg: str) -> None:
    """Padding comes only from PAD_LEFT/PAD_TOP; right/bottom padding is what
    the output size implies. Each must stay below the kernel extent."""
    if pad_before >= k:
        raise r.error(GeometryError, f"{pad_reg}={pad_before} is not smaller than the kernel {axis} {k}",
                      "CNA_PAD_CON0")
    pad_after = (n_out - 1) * stride + k - pad_before - n_in
    if pad_after >= k:
        raise r.error(GeometryError, f"{n_out} outputs along {axis} with {stride_reg}={stride}, kernel "
                      f"{k} and {pad_reg}={pad_before} read {pad_after} positions past the {n_in}-wide "
                      "input (more than the kernel extent)", "CNA_DATA_SIZE3")


def _fetch_feature(r: TaskRegisters, mem: IovaSpace, prec: Precision, w: int, h: int, channels: int,
                   group_line: bool) -> tuple[np.ndarray, int]:
    c2 = prec.c2
    if channels % c2:
        raise r.error(GeometryError, f"DATAIN_CHANNEL={channels} is not a whole number of "
                      f"{c2}-channel atoms", "CNA_DATA_SIZE1")
    line = r.field("CNA_DMA_CON1", "LINE_STRIDE")
    if group_line:
        if line != 4 * w:
            raise r.error(QuirkRejection, f"LINE_STRIDE={line} with group-line fetch: only 4*DMA_WIDTH="
                          f"{4 * w} (dense lines) has a known meaning (Q3)", "CNA_DMA_CON1")
        row_atoms = w
    else:
        row_atoms = line
    if row_atoms < w:
        raise r.error(GeometryError, f"line pitch {row_atoms} atoms is shorter than a line of {w}",
                      "CNA_DMA_CON1")
    addr = r.value("CNA_FEATURE_DATA_ADDR")
    if addr % ATOM:
        raise r.error(AlignmentError, f"feature address {addr:#x} is not 16-byte aligned",
                      "CNA_FEATURE_DATA_ADDR")
    try:
        view = mem.strided(addr, r.walk(extents.cna_feature), np.uint8 if prec.code == INT4 else prec.storage,
                           "CNA feature DMA")
    except SimError as exc:
        raise exc.located(register="CNA_FEATURE_DATA_ADDR", entry=r.entry("CNA_FEATURE_DATA_ADDR"))
    if prec.code == INT4:  # [C/32, H, W, 16 bytes] -> [C/32, H, W, 32 nibbles]
        view = layout.unpack_nibbles(view)
    x = to_compute(view, prec).transpose(0, 3, 1, 2).reshape(channels, h, w)
    return x, channels // c2 * h * w * ATOM


def _fetch_argb(r: TaskRegisters, mem: IovaSpace, prec: Precision, w: int, h: int,
                channels: int) -> np.ndarray:
    """1-channel 8-bit input (ARGB_IN=8): raw bytes, LINE_STRIDE bytes per row,
    converted by the CNA CVT into the int8 processing domain."""
    con1 = r.fields("CNA_CONV_CON1")
    if con1["ARGB_IN"] != ARGB_ONE_CHANNEL:
        raise r.error(QuirkRejection, f"ARGB_IN={con1['ARGB_IN']}: only the 1-channel mode (8) is "
                      "modelled (Q3; a packed image of more channels is Q26)", "CNA_CONV_CON1")
    if prec.code != 0 or not con1["NONALIGN_DMA"] or not con1["GROUP_LINE_OFF"]:
        raise r.error(UnsupportedError, "ARGB input is modelled for int8 with NONALIGN_DMA=1 and "
                      "GROUP_LINE_OFF=1 (the only combination in use)", "CNA_CONV_CON1")
    if channels % prec.c2:
        raise r.error(GeometryError, f"DATAIN_CHANNEL={channels} is not a whole atom", "CNA_DATA_SIZE1")
    line = r.field("CNA_DMA_CON1", "LINE_STRIDE")
    if line < w:
        raise r.error(GeometryError, f"LINE_STRIDE={line} bytes is shorter than a {w}-pixel row",
                      "CNA_DMA_CON1")
    addr = r.value("CNA_FEATURE_DATA_ADDR")
    cvt = r.fields("CNA_CVT_CON0")
    signed = bool(cvt["DATA_SIGN"])
    try:
        raw = mem.strided(addr, r.walk(extents.cna_feature), np.int8 if signed else np.uint8, "CNA feature DMA")
    except SimError as exc:
        raise exc.located(register="CNA_FEATURE_DATA_ADDR", entry=r.entry("CNA_FEATURE_DATA_ADDR"))
    values = raw.astype(np.int64)
    if not cvt["CVT_BYPASS"]:
        if not r.value("CNA_CVT_CON5") & 1:
            raise r.error(UnsupportedError, "CVT enabled but not for channel 0 (PER_CHANNEL_CVT_EN)",
                          "CNA_CVT_CON5")
        values = _cvt(r, values, cvt)
    values = np.clip(values, -128, 127)
    x = np.zeros((channels, h, w), np.int8)
    x[0] = values  # the other channels of the atom carry nothing (Q3)
    return x


def _cvt(r: TaskRegisters, x: np.ndarray, cvt: dict[str, int]) -> np.ndarray:
    """CNA input converter, channel 0 parameters (CVT_CON1)."""
    scale = r.field("CNA_CVT_CON1", "CVT_SCALE0")
    offset = r.signed("CNA_CVT_CON1", "CVT_OFFSET0")
    trunc = cvt["CVT_TRUNCATE_0"]
    if scale & 0x8000:
        raise r.error(FieldError, f"CVT_SCALE0={scale:#x}: the sign of a scale >= 0x8000 is unknown",
                      "CNA_CVT_CON1")
    mode = TIE_RULES[cvt["ROUND_TYPE"]]
    if cvt["CVT_TYPE"]:  # add first, then multiply
        return shift_round((x + offset) * scale, trunc, mode)
    return shift_round(x * scale, trunc, mode) + offset


def _pad_value(r: TaskRegisters, prec: Precision):
    raw = r.value("CNA_PAD_CON1")
    if prec.code == 0:
        v = raw & 0xFF
        return v - 256 if v & 0x80 else v
    if prec.code == 1:
        v = raw & 0xFFFF
        return v - 65536 if v & 0x8000 else v
    bits = np.array([raw & 0xFFFF], np.uint16)
    return float(to_compute(bits.view(prec.storage), prec)[0])


def _pad(x: np.ndarray, top: int, left: int, rows: int, cols: int, value) -> np.ndarray:
    """The input window the MAC array walks: rows [-top, rows - top), cols likewise;
    positions outside the fetched cube hold the pad value."""
    c, h, w = x.shape
    if top == 0 and left == 0 and rows <= h and cols <= w:
        return x[:, :rows, :cols]
    out = np.full((c, rows, cols), value, dtype=x.dtype)
    hh = min(h, rows - top)
    ww = min(w, cols - left)
    out[:, top:top + hh, left:left + ww] = x[:, :hh, :ww]
    return out


def _fetch_weights(r: TaskRegisters, mem: IovaSpace, prec: Precision, mode: str, d: dict[str, int],
                   channels: int) -> tuple[np.ndarray, int]:
    kh, kw, kernels = d["WEIGHT_HEIGHT"], d["WEIGHT_WIDTH"], d["WEIGHT_KERNELS"]
    per_kernel = kh * kw * channels * prec.element_bits // 8
    if d["WEIGHT_BYTES_PER_KERNEL"] != per_kernel:
        raise r.error(GeometryError, f"WEIGHT_BYTES_PER_KERNEL={d['WEIGHT_BYTES_PER_KERNEL']}, but a "
                      f"{kh}x{kw}x{channels} {prec.name} kernel has {per_kernel} bytes", "CNA_WEIGHT_SIZE1")
    total = per_kernel * kernels
    if d["WEIGHT_BYTES"] != total:
        raise r.error(GeometryError, f"WEIGHT_BYTES={d['WEIGHT_BYTES']}, but {kernels} kernels of "
                      f"{per_kernel} bytes are {total}", "CNA_WEIGHT_SIZE0")
    if mode == "depthwise" and kernels != 1:
        raise r.error(GeometryError, f"depthwise weights are one kernel per channel set; "
                      f"WEIGHT_KERNELS={kernels}", "CNA_WEIGHT_SIZE2")
    addr = r.value("CNA_DCOMP_ADDR0")
    if addr % ATOM:
        raise r.error(AlignmentError, f"weight address {addr:#x} is not 16-byte aligned (TRM: "
                      "DECOMPRESS_ADDR0 is bits 31:4)", "CNA_DCOMP_ADDR0")
    try:
        region = mem.region(addr, r.walk(extents.cna_weights).span()[1], "CNA weight DMA")
    except SimError as exc:
        raise exc.located(register="CNA_DCOMP_ADDR0", entry=r.entry("CNA_DCOMP_ADDR0"))

    def decode() -> np.ndarray:
        if prec.code == INT4:  # checked 1x1, whole 64-kernel tiles (_check_int4)
            return layout.unpack_weights_int4(region.data(), kernels, channels,
                                              np.float32).reshape(kernels, 1, 1, channels)
        flat = region.data().view(prec.storage)
        if mode == "depthwise":
            return to_compute(layout.unpack_depthwise_weights(flat, kh, kw, channels), prec, copy=False)
        if prec.is_float:  # reorder the 2-byte elements, then convert (fewer bytes moved)
            return to_compute(layout.unpack_weights(flat, kernels, kh, kw, channels), prec)
        # integers go straight to float32, exact for the chunked BLAS of core.py
        return layout.unpack_weights(flat, kernels, kh, kw, channels, dtype=np.float32)

    # a model runs the same weights again and again: decode them once per content
    w = mem.decoded(region, ("weights", mode, prec.code, kernels, kh, kw, channels), decode)
    return w, total
