"""Mesa-compatible mode: uint8 per-tensor convolutions exactly as Mesa's rocket driver
lowers them (TFLite semantics), byte for byte.

The rules are facts taken from Mesa `src/gallium/drivers/rocket/` at bminor/mesa-mesa
5b829658f74f8108fef7decf3fae5d317c85fd01 (rkt_task.c task splitting and geometry,
rkt_regcmd.c register values, rkt_coefs.c weights and biases, rkt_ml.c buffers,
input conversion and jobs), written down again here in rkc's own code. The fused
residual ADD follows the newer Mesa arithmetic (sailfishos-mirror/mesa rkt_regcmd.c
@ 72fd7032): 5b829658's table of hand-tuned addend scales is not reproduced.

Two traps are kept on purpose because Mesa has them:
* Mesa calls TFLite dims[1] (H) "width" and dims[2] (W) "height", for features
  and kernels alike; every geometry below uses Mesa's names (`m_width` = dims[1]).
* Mesa's empirical constants. They all live in `MESA` with a note each; none of
  them is used by rkc's own mode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.regfile import (CONV_BLOCKS, CONV_ORDER, MESA_PREAMBLE, S_POINTER_FIELDS,
                                  RegisterFile, build, unlinked_pc_base_entry)
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import hw, layout

FEATURE_ATOM = 16  # int8 channels per feature atom (Mesa FEATURE_ATOMIC_SIZE / ATOMIC_K_SIZE)
WEIGHT_ATOM = 32  # input channels per weight row (Mesa WEIGHT_ATOMIC_SIZE)
CBUF_ENTRY = hw.CBUF_ENTRY_BYTES
CBUF_ENTRIES = hw.CBUF_ENTRIES_PER_BANK
BANKS = hw.CBUF_BANKS

# Mesa's magic numbers, verbatim, with where they come from. rkc's own mode uses none.
MESA = {
    # rkt_regcmd.c: FEATURE_GRAINS = 50 + stride_y + 1, "Magic: Seems to pass the most tests"
    "feature_grains_base": 50,
    # rkt_task.c calc_weights_banks: "Why do we need an extra bank?"
    "extra_weight_bank": 1,
    # rkt_task.c: weights that do not fit leave 7 banks for the input, 5 for the weights
    "streamed_input_banks": 7,
    # rkt_coefs.c rkt_fill_biases: weight scales (float32 bits) for which Mesa truncates the
    # accumulator by one bit; a model-specific list
    "truncate_weight_scales": frozenset({
        0x3A88323F, 0x3C0060DE, 0x3C06022D, 0x3C1642E3, 0x3C1E3F51, 0x3C5C8AA8, 0x3C615E93,
        0x3C7326A2, 0x3C783013, 0x3D1748E6, 0x3D282992, 0x3D2E87AE, 0x3D77F5F6, 0x3A9A5956,
        0x3CAEBC56}),
    # rkt_regcmd.c: single-channel input converter (x - 128) * scale >> truncate
    "cin1_cvt": {"truncate": 14, "scale": 16384, "offset": 65408},
    "cin1_cvt_add": {"truncate": 15, "scale": 32388, "offset": 65408},
    "cin1_per_channel_cvt": 0xFFFF,  # CNA_CVT_CON5 when Cin == 1
    # rkt_regcmd.c CNA_PAD_CON1 special cases (later ones win)
    "pad_value_k3_zp0": 0xFFFF8080,
    "pad_value_add": 0xFFFFFF80,
    "pad_value_dw_zp": (0x8B, 0x0B0B),
    # rkt_task.c fill_task: an 8-wide input next to an ADD is doubled, its line stride
    # halved and its surface stride forced to 112
    "add_w8_surface_stride": 112,
    # rkt_task.c: CBUF data entries forced to 40 for a 40-wide, 40-channel input
    "w40_c40_entries": 40,
    # rkt_regcmd.c: surf_notch forced to 15 for a 3-wide input; EW stride floor 12
    "w3_surf_notch": 15,
    "ew_stride_min": 12,
    # DMA burst lengths and RDMA arbitration weights every task writes
    "burst_len": 15,
    "rdma_weight": 1,
}


def f32(x: float) -> float:
    """Round to float32 (Mesa computes every scale in float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def qnnpack_pair(scale: float, plus_one: bool) -> tuple[int, int]:
    """Mesa's (multiplier, shift) from a float32 scale: the float's exponent gives the
    shift (QNNPACK requantization.h), bits 23..9 the 15-bit multiplier with bit 14
    forced on. Mesa masks bit 23 (the exponent's low bit) in and drops the carry of
    the +1; both kept (rkt_regcmd.c)."""
    bits = f32_bits(scale)
    shift = 127 + 31 - 32 - (bits >> 23) + 16
    mul = ((bits >> 9) & 0x7FFF) + (1 if plus_one else 0)
    if mul < 1 << 14:
        mul |= 1 << 14
    return mul, shift


# -- the operation ---------------------------------------------------------------------
@dataclass(frozen=True)
class MesaTensor:
    """A uint8 tensor as Teflon hands it to Mesa: TFLite dims [N, H, W, C]."""

    buffer: str
    dims: tuple[int, int, int, int]
    scale: float
    zero_point: int


@dataclass(frozen=True, eq=False)
class MesaConv:
    """One convolution after Mesa's lowering (an ADD fused into it, if any).

    `weights` are the raw uint8 TFLite bytes (OHWI; depthwise [1, KH, KW, C]),
    `bias` the int32 TFLite bias. `add` is the addend of a fused ADD and
    `addition_input` marks a conv whose output is such an addend (both change
    Mesa's geometry). Buffer names: `weights_buffer`, `bias_buffer`."""

    input: MesaTensor
    output: MesaTensor
    weights: np.ndarray
    weight_scale: float
    weight_zero_point: int
    bias: np.ndarray
    stride: int = 1
    padding_same: bool = True
    depthwise: bool = False
    add: MesaTensor | None = None
    addition_input: bool = False
    weights_buffer: str = "weights"
    bias_buffer: str = "biases"
    regcmd_buffer: str = "regcmd"
    name: str = "mesa_conv"

    @property
    def add_involved(self) -> bool:
        return self.add is not None or self.addition_input


@dataclass
class MesaTask:
    top: int = 0
    bottom: int = 0
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    input_height: int = 0
    output_width: int = 0
    output_height: int = 0
    input_offset: int = 0
    output_offset: int = 0
    input_banks: int = 0
    weights_banks: int = 0

    @property
    def atomics(self) -> int:
        return self.output_width * self.output_height


@dataclass
class MesaGeometry:
    """Operation-level values of Mesa's `rkt_operation` and `fill_task`."""

    in_w: int  # Mesa input_width = TFLite H
    in_h: int  # Mesa input_height = TFLite W
    cin: int
    out_w: int
    out_h: int
    cout: int
    k_w: int  # Mesa weights_width = kernel dims[1]
    k_h: int
    stride: int
    depthwise: bool
    task_in_w: int = 0  # DATAIN_WIDTH (doubled / widened as Mesa does)
    cin_hw: int = 0
    cout_hw: int = 0
    kernels: int = 0
    line_stride: int = 0
    surface_stride: int = 0
    data_entries: int = 0
    reuse_weights: bool = True
    truncate_bits: int = 0
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    tasks: list[MesaTask] = field(default_factory=list)


def is_depthwise(op: MesaConv) -> bool:
    # rkt_ml.c rkt_is_depthwise: a 1-channel depthwise conv is lowered as a direct one
    return op.depthwise and op.input.dims[3] > 1 and op.output.dims[3] > 1


def geometry(op: MesaConv) -> MesaGeometry:
    n, ih, iw, cin = op.input.dims
    _, oh, ow, cout = op.output.dims
    dw = is_depthwise(op)
    k_w, k_h = int(op.weights.shape[1]), int(op.weights.shape[2])
    if n != 1:
        raise UnsupportedError(f"{op.name}: Mesa handles batch 1 only, got {n}")
    g = MesaGeometry(in_w=ih, in_h=iw, cin=cin, out_w=oh, out_h=ow, cout=cout,
                     k_w=k_w, k_h=k_h, stride=op.stride, depthwise=dw)
    _fill_geometry(op, g)
    g.truncate_bits = 1 if f32_bits(op.weight_scale) in MESA["truncate_weight_scales"] else 0
    g.pads = _explicit_padding(op, g)
    _split_tasks(op, g)
    return g


def _fill_geometry(op: MesaConv, g: MesaGeometry) -> None:
    """rkt_task.c fill_task: the values every task of the operation shares."""
    g.task_in_w = g.in_w * 2 if g.in_w == 8 and op.add_involved else g.in_w
    g.cin_hw = layout.align(max(g.cin, FEATURE_ATOM), FEATURE_ATOM)
    g.cout_hw = layout.align(max(g.cout, 32), 32)
    if g.depthwise:
        if g.cout <= 32:
            g.cout_hw *= 2
        g.cout_hw = layout.align(g.cout_hw, 64)
    if g.cin == 1 and (g.cout > 1 or op.add_involved):
        g.task_in_w = max(g.task_in_w, FEATURE_ATOM)
        g.line_stride = max(g.in_w * FEATURE_ATOM // FEATURE_ATOM, FEATURE_ATOM)
        surface = float(g.line_stride) * (float(g.in_h) - 1)  # Mesa computes this in float
    else:
        g.line_stride = g.in_w * FEATURE_ATOM // 4
        surface = float(g.line_stride) * (float(g.in_h) / 4 - 1)
    if g.task_in_w == 8 and op.add_involved:
        g.line_stride //= 2
        surface = MESA["add_w8_surface_stride"]
    if surface < 0:
        raise UnsupportedError(f"{op.name}: Mesa's surface stride is negative for input height {g.in_h}")
    g.surface_stride = int(surface)
    if g.cin == 1:
        g.data_entries = g.task_in_w * g.in_h
    elif g.task_in_w == 40 and g.cin == 40:
        g.data_entries = MESA["w40_c40_entries"]
    else:
        g.data_entries = -(-(g.task_in_w * 2 * -(-g.cin // FEATURE_ATOM)) // 8)
    g.kernels = 1 if g.depthwise else layout.align(g.cout, 2)


def _explicit_padding(op: MesaConv, g: MesaGeometry) -> tuple[int, int, int, int]:
    """rkt_task.c calc_explicit_padding: TFLite SAME padding from Mesa's swapped axes
    (left/right come from the "height" axis, top/bottom from the "width" axis)."""
    if not (op.padding_same and g.k_w > 1):
        return 0, 0, 0, 0
    along_w = (g.out_w - 1) * g.stride + g.k_w - g.in_w
    along_h = (g.out_h - 1) * g.stride + g.k_h - g.in_h
    if along_w < 0 or along_h < 0:
        raise UnsupportedError(f"{op.name}: SAME padding would be negative (Mesa's unsigned arithmetic wraps)")
    return along_w // 2, along_w - along_w // 2, along_h // 2, along_h - along_h // 2


def _entries_per_slice(g: MesaGeometry) -> int:
    """CBUF entries one input row needs (rkt_task.c calc_entries_per_slice)."""
    atoms_per_entry = CBUF_ENTRY // FEATURE_ATOM
    atoms = -(-g.cin // FEATURE_ATOM)
    last = atoms % atoms_per_entry
    frac = g.in_w if last == 3 else -(-(last * g.in_w) // atoms_per_entry)
    return atoms // atoms_per_entry * g.in_w + frac


def _split_tasks(op: MesaConv, g: MesaGeometry) -> None:
    """rkt_task.c rkt_split_tasks: one task if the input fits the data banks, else
    row slices re-reading the kernel's halo."""
    per_slice = _entries_per_slice(g)
    input_banks = -(-(per_slice * g.in_h) // CBUF_ENTRIES)
    weight_bytes = g.k_w * g.k_h * g.cin * (1 if g.depthwise else g.cout)
    weights_banks = -(-(-(-weight_bytes // CBUF_ENTRY)) // CBUF_ENTRIES) + MESA["extra_weight_bank"]
    avail_weights, avail_input = weights_banks, BANKS - weights_banks
    g.reuse_weights = weights_banks + 1 < BANKS
    if not g.reuse_weights:
        avail_input = MESA["streamed_input_banks"]
        avail_weights = BANKS - avail_input
    pt, pb, pl, pr = g.pads
    if input_banks <= avail_input:
        g.tasks = [MesaTask(0, 0, pt, pb, pl, pr, g.in_h, g.out_w, g.out_h, 0, 0,
                            input_banks, BANKS - input_banks)]
        return
    slices = CBUF_ENTRIES * avail_input // per_slice
    tasks = [MesaTask(top=0, bottom=slices - 1, pad_top=pt, pad_left=pl, pad_right=pr)]
    cursor = g.k_h - pt - 1
    while 0 <= cursor < g.in_h:
        prev = tasks[-1]
        while cursor <= prev.bottom:
            cursor += g.stride
        if cursor > prev.bottom:
            cursor -= g.stride
        top = min(cursor, prev.bottom) - (g.k_h - 1) + g.stride
        task = MesaTask(top=top, bottom=top + slices - 1, pad_left=pl, pad_right=pr)
        if task.bottom >= g.in_h - 1:
            task.bottom, task.pad_bottom = g.in_h - 1, pb
            tasks.append(task)
            break
        cursor = task.top + g.k_h - 1
        tasks.append(task)
    if tasks[-1].top >= g.in_h or tasks[-1].bottom >= g.in_h + pb:
        tasks.pop()
    rows_done = 0
    for t in tasks:
        t.bottom = min(t.bottom, g.in_h - 1)
        t.input_height = t.bottom - t.top + 1
        t.output_width = (g.task_in_w + t.pad_left + t.pad_right - g.k_w) // g.stride + 1
        t.output_height = (t.input_height + t.pad_top + t.pad_bottom - g.k_h) // g.stride + 1
        t.input_offset = g.in_w * FEATURE_ATOM * t.top
        t.output_offset = g.out_w * FEATURE_ATOM * rows_done
        t.input_banks, t.weights_banks = avail_input, avail_weights
        rows_done += t.output_height
    g.tasks = tasks


# -- registers ------------------------------------------------------------------------
def task_registers(op: MesaConv, g: MesaGeometry, index: int) -> RegisterFile:
    """rkt_regcmd.c fill_first_regcmd, for task `index`."""
    t = g.tasks[index]
    r = RegisterFile()
    reuse = index > 0 and g.reuse_weights
    r.set("CNA_CBUF_CON0", WEIGHT_BANK=t.weights_banks, DATA_BANK=t.input_banks, WEIGHT_REUSE=int(reuse))
    cin1 = g.cin == 1
    r.set("CNA_CONV_CON1", NONALIGN_DMA=int(cin1), GROUP_LINE_OFF=int(cin1), ARGB_IN=8 if cin1 else 0,
          CONV_MODE=3 if g.depthwise else 0)
    r.set("DPU_S_POINTER", **S_POINTER_FIELDS)
    r.set("DPU_RDMA_RDMA_S_POINTER", **S_POINTER_FIELDS)
    r.set("CNA_CONV_CON2", FEATURE_GRAINS=MESA["feature_grains_base"] + g.stride + 1)
    r.set("CNA_CONV_CON3", CONV_X_STRIDE=g.stride, CONV_Y_STRIDE=g.stride)
    r.set("CNA_DATA_SIZE0", DATAIN_WIDTH=g.task_in_w, DATAIN_HEIGHT=t.input_height)
    r.set("CNA_DATA_SIZE1", DATAIN_CHANNEL_REAL=g.cin - 1, DATAIN_CHANNEL=g.cin_hw)
    r.set("CNA_DATA_SIZE2", DATAOUT_WIDTH=t.output_width)
    r.set("CNA_DATA_SIZE3", DATAOUT_ATOMICS=t.atomics)
    per_kernel = g.k_w * g.k_h * g.cin_hw
    r.set("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=per_kernel * g.kernels)
    r.set("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=per_kernel)
    r.set("CNA_WEIGHT_SIZE2", WEIGHT_WIDTH=g.k_w, WEIGHT_HEIGHT=g.k_h, WEIGHT_KERNELS=g.kernels)
    r.set("CNA_CBUF_CON1", DATA_ENTRIES=g.data_entries)
    if cin1:
        cvt = MESA["cin1_cvt_add" if op.add_involved else "cin1_cvt"]
        r.set("CNA_CVT_CON0", **{f"CVT_TRUNCATE_{i}": cvt["truncate"] for i in range(4)})
        for i in range(4):
            r.set(f"CNA_CVT_CON{i + 1}", **{f"CVT_SCALE{i}": cvt["scale"], f"CVT_OFFSET{i}": cvt["offset"]})
        r.set("CNA_CVT_CON5", PER_CHANNEL_CVT_EN=MESA["cin1_per_channel_cvt"])
    else:
        r.set("CNA_CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=1)
        for i in range(4):
            r.set(f"CNA_CVT_CON{i + 1}", **{f"CVT_SCALE{i}": 1})
    r.set("CNA_PAD_CON0", PAD_LEFT=t.pad_left, PAD_TOP=t.pad_top)
    r.address("CNA_FEATURE_DATA_ADDR", op.input.buffer, t.input_offset)
    r.set("CNA_DMA_CON0", WEIGHT_BURST_LEN=MESA["burst_len"], DATA_BURST_LEN=MESA["burst_len"])
    r.set("CNA_DMA_CON1", LINE_STRIDE=g.line_stride)
    r.set("CNA_DMA_CON2", SURF_STRIDE=g.surface_stride)
    r.set("CNA_FC_DATA_SIZE0", DMA_WIDTH=g.in_w, DMA_HEIGHT=t.input_height)
    r.set("CNA_FC_DATA_SIZE1", DMA_CHANNEL=g.cin_hw)
    r.address("CNA_DCOMP_ADDR0", op.weights_buffer, 0)
    r.set("CNA_PAD_CON1", PAD_VALUE=_pad_value(op, g))
    r.set("CORE_MISC_CFG", QD_EN=1, DW_EN=int(g.depthwise))
    r.set("CORE_DATAOUT_SIZE_0", DATAOUT_HEIGHT=t.output_height - 1, DATAOUT_WIDTH=t.output_width - 1)
    r.set("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=g.cout_hw - 1)
    r.set("CORE_CLIP_TRUNCATE", CLIP_TRUNCATE=g.truncate_bits)
    _dpu_registers(op, g, t, r)
    return r


def _pad_value(op: MesaConv, g: MesaGeometry) -> int:
    zp = op.input.zero_point
    value = (zp - 0x80) & 0xFFFFFFFF
    if g.k_w >= 3 and zp == 0:
        value = MESA["pad_value_k3_zp0"]
    if op.add_involved:
        value = MESA["pad_value_add"]
    dw_zp, dw_value = MESA["pad_value_dw_zp"]
    if g.depthwise and zp == dw_zp:
        value = dw_value
    return value


def _dpu_registers(op: MesaConv, g: MesaGeometry, t: MesaTask, r: RegisterFile) -> None:
    dw = g.depthwise
    r.set("DPU_FEATURE_MODE_CFG", BURST_LEN=MESA["burst_len"], OUTPUT_MODE=2, CONV_MODE=3 if dw else 0)
    r.address("DPU_DST_BASE_ADDR", op.output.buffer, t.output_offset)
    r.set("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=g.out_w * g.out_h)
    r.set("DPU_DATA_CUBE_WIDTH", WIDTH=t.output_width - 1)
    r.set("DPU_DATA_CUBE_HEIGHT", HEIGHT=t.output_height - 1)
    r.set("DPU_DATA_CUBE_CHANNEL", ORIG_CHANNEL=g.cout - 1, CHANNEL=g.cout_hw - 1)
    r.set("DPU_BS_CFG", BS_ALU_ALGO=2, BS_ALU_SRC=1, BS_RELU_BYPASS=1, BS_MUL_BYPASS=1)
    size_e = 3 if dw else 1
    r.set("DPU_BS_OW_CFG", SIZE_E_2=size_e, SIZE_E_1=size_e, SIZE_E_0=size_e)
    r.set("DPU_BS_OW_OP", OW_OP=(0x80 - op.weight_zero_point) & 0xFFFF)
    r.set("DPU_WDMA_SIZE_0", CHANNEL_WDMA=g.cout_hw - 1)
    r.set("DPU_WDMA_SIZE_1", HEIGHT_WDMA=t.output_height - 1, WIDTH_WDMA=t.output_width - 1)
    r.set("DPU_BN_CFG", BN_RELU_BYPASS=1, BN_MUL_BYPASS=1, BN_ALU_BYPASS=1, BN_BYPASS=1)
    out = op.output
    conv_scale = f32(f32(op.input.scale * op.weight_scale) / out.scale)
    out_mul, out_shift = qnnpack_pair(conv_scale, plus_one=True)
    if g.truncate_bits:
        out_shift -= 1
    if op.add is not None:
        r.set("DPU_EW_CFG", EW_CVT_TYPE=1, EW_DATA_MODE=1, EDATA_SIZE=1, EW_ALU_ALGO=2,
              EW_RELU_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_SRC=1)
        r.set("DPU_EW_CVT_OFFSET_VALUE", EW_OP_CVT_OFFSET=(0x80 - op.add.zero_point) & 0xFFFFFFFF)
        add_scale = f32(op.add.scale / f32(op.input.scale * op.weight_scale))
        add_mul, add_shift = qnnpack_pair(add_scale, plus_one=False)
        r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SHIFT=add_shift - 1, EW_OP_CVT_SCALE=add_mul)
    else:
        r.set("DPU_EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_BYPASS=1,
              EW_BYPASS=1)
        r.set("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
    r.set("DPU_OUT_CVT_OFFSET", OUT_CVT_OFFSET=(out.zero_point - 0x80) & 0xFFFFFFFF)
    r.set("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=out_mul)
    r.set("DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=out_shift - 1)
    r.set("DPU_SURFACE_ADD", SURF_ADD=g.out_w * g.out_h * 2 * (2 if dw else 1))
    r.set("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=t.output_width - 1)
    r.set("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=t.output_height - 1)
    r.set("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=g.cout_hw - 1)
    r.set("DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
    r.address("DPU_RDMA_RDMA_BS_BASE_ADDR", op.bias_buffer, 0)
    ew_stride = max(g.out_w * g.out_h, MESA["ew_stride_min"])
    feature_mode = dict(BURST_LEN=MESA["burst_len"], CONV_MODE=3 if dw else 0)
    if op.add is not None:
        r.address("DPU_RDMA_RDMA_SRC_BASE_ADDR", op.add.buffer, t.output_offset)
        r.set("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=1, ERDMA_DATA_SIZE=1)
        r.address("DPU_RDMA_RDMA_EW_BASE_ADDR", op.add.buffer,
                  t.output_offset + g.out_w * g.out_h * FEATURE_ATOM)
        r.set("DPU_RDMA_RDMA_EW_SURF_STRIDE", EW_SURF_STRIDE=ew_stride)
        r.set("DPU_RDMA_RDMA_FEATURE_MODE_CFG", COMB_USE=5, **feature_mode)
        notch = ew_stride + t.output_width * (g.out_h - t.output_height)
        if g.in_w == 3:
            notch = MESA["w3_surf_notch"]
        r.set("DPU_RDMA_RDMA_SURF_NOTCH", SURF_NOTCH_ADDR=notch)
        r.set("DPU_RDMA_RDMA_EW_SURF_NOTCH", EW_SURF_NOTCH=notch)
    else:
        r.set("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
        r.set("DPU_RDMA_RDMA_FEATURE_MODE_CFG", MRDMA_DISABLE=1, **feature_mode)
    w = MESA["rdma_weight"]
    r.set("DPU_RDMA_RDMA_WEIGHT", E_WEIGHT=w, N_WEIGHT=w, B_WEIGHT=w, M_WEIGHT=w)


def task_regcmd(op: MesaConv, g: MesaGeometry, index: int):
    """One task's RegcmdBuilder in Mesa's order (preamble + conv body + tail)."""
    regs = task_registers(op, g, index)
    b = build(regs, (*MESA_PREAMBLE, *CONV_ORDER), CONV_BLOCKS)
    if len(g.tasks) > 1:
        # a multi-task op writes the next-task slot as PC_BASE_ADDRESS even when unlinked
        b.entries[-4] = unlinked_pc_base_entry()
    return b


# -- buffers --------------------------------------------------------------------------
def pack_weights(op: MesaConv) -> bytes:
    """rkt_coefs.c rkt_fill_weights: OHWI uint8 -> signed tiles of 32 kernels x 32
    input channels (64 for depthwise), the weight zero point in padding channels,
    zero kernels up to an even count; BO size = KW*KH*Cout'*align(Cin',32)*2."""
    g_dw = is_depthwise(op)
    k_w, k_h = int(op.weights.shape[1]), int(op.weights.shape[2])
    cin_real, cout_real = op.input.dims[3], op.output.dims[3]
    cin = max(cin_real, FEATURE_ATOM)
    cout = 1 if g_dw else layout.align(cout_real, 2)
    size = k_w * k_h * cout * layout.align(cin, WEIGHT_ATOM) * 2
    group = WEIGHT_ATOM * (2 if g_dw else 1)
    w = op.weights.astype(np.int16)
    signed = lambda v: (int(v) - 0x80) & 0xFF  # noqa: E731 - Mesa stores every byte as value - 0x80
    zp_byte = signed(op.weight_zero_point)
    out = bytearray()
    for oc1 in range(-(-cout // WEIGHT_ATOM)):
        for ic1 in range(-(-cin // group)):
            for x in range(k_w):
                for y in range(k_h):
                    for oc2 in range(min(cout, WEIGHT_ATOM)):
                        oc = oc1 * WEIGHT_ATOM + oc2
                        if cout_real > 2 and oc >= layout.align(cout_real, 2):
                            continue
                        for ic2 in range(min(cin, group)):
                            ic = ic1 * group + ic2
                            if oc >= cout_real and not g_dw:
                                out.append(0)
                            elif ic >= cin_real:
                                if ic2 < 16 or cin_real % 32 > 16:
                                    out.append(zp_byte)
                            else:
                                v = w[0, x, y, ic] if g_dw else w[oc, x, y, ic]
                                out.append(signed(v))
    if len(out) > size:
        raise UnsupportedError(f"{op.name}: packed weights overrun Mesa's buffer")
    return bytes(out) + bytes(size - len(out))


def truncate_bits(op: MesaConv) -> int:
    return 1 if f32_bits(op.weight_scale) in MESA["truncate_weight_scales"] else 0


def pack_biases(op: MesaConv) -> bytes:
    """rkt_coefs.c rkt_fill_biases: bias - sum_x,y,ic (w - zp_w)(zp_in - 0x80), divided
    (C division) by 2^truncate_bits, int32 per output channel."""
    cout = op.output.dims[3]
    w = op.weights.astype(np.int64) - op.weight_zero_point
    zp = op.input.zero_point - 0x80
    if is_depthwise(op):
        corr = w[0].sum(axis=(0, 1)) * zp
    else:
        corr = w.sum(axis=(1, 2, 3)) * zp
    corr = ((corr + (1 << 31)) % (1 << 32)) - (1 << 31)  # int32 arithmetic
    diff = (op.bias.astype(np.int64)[:cout] - corr[:cout])
    diff = ((diff + (1 << 31)) % (1 << 32)) - (1 << 31)
    shift = 1 << truncate_bits(op)
    q = np.sign(diff) * (np.abs(diff) // shift)  # C division truncates toward zero
    return q.astype("<i4").tobytes()


def convert_input(op: MesaConv, x: np.ndarray) -> bytes:
    """rkt_ml.c rkt_ml_subgraph_invoke: the uint8 NHWC graph input in Mesa's layout
    (a buffer of `input_bytes(op)`): NC1HWC2 signed bytes, or, with one channel, raw
    bytes with every row padded to 16 with the zero point."""
    n, h, w, c = op.input.dims
    x = np.asarray(x, np.uint8).reshape(h, w, c)
    size = input_bytes(op)
    zp = op.input.zero_point
    if c == 1 and op.output.dims[3] == 1 and not op.add_involved:
        raw = x.tobytes()
    elif c == 1:
        rows = np.full((h, max(w, FEATURE_ATOM)), zp, np.uint8)
        rows[:, :w] = x[:, :, 0]
        raw = rows.tobytes()
    else:
        signed = (x.astype(np.int16) - 0x80).astype(np.int8).transpose(2, 0, 1)
        raw = layout.pack_feature(signed, pad_value=zp - 0x80).tobytes()
    return raw + bytes(size - len(raw))


def input_bytes(op: MesaConv) -> int:
    """Size Mesa allocates for the input tensor: twice the C/16-padded map."""
    _, h, w, c = op.input.dims
    return h * w * -(-c // FEATURE_ATOM) * 2 * FEATURE_ATOM


def output_bytes(op: MesaConv) -> int:
    _, h, w, c = op.output.dims
    return h * w * -(-c // FEATURE_ATOM) * 2 * FEATURE_ATOM


# -- emission -------------------------------------------------------------------------
def lower_mesa(op: MesaConv) -> api.EmitResult:
    """Tasks, jobs and buffers of one Mesa operation. Jobs follow Mesa: all tasks in
    one job when the weights stay in CBUF, else one job per task."""
    g = geometry(op)
    tasks = []
    for i, t in enumerate(g.tasks):
        b = task_regcmd(op, g, i)
        cbuf = api.CbufPlan(t.input_banks, t.weights_banks, weights_resident=g.reuse_weights,
                            weight_reuse=i > 0 and g.reuse_weights)
        counters = api.Counters(macs=_macs(g, t), mac_dtype="int8")
        tasks.append(api.Task(b.array(), [api.Reloc(e, buf, off) for e, buf, off in b.relocations],
                              cbuf, counters, label=f"{op.name} task {i}"))
    reads = [op.input.buffer] + ([op.add.buffer] if op.add is not None else [])
    writes = [op.output.buffer]
    if g.reuse_weights:
        jobs = [api.JobPlan(list(range(len(tasks))), 0, reads, writes)]
    else:
        jobs = [api.JobPlan([i], 0, reads, writes) for i in range(len(tasks))]
    consts = [api.ConstBuffer(op.weights_buffer, pack_weights(op)),
              api.ConstBuffer(op.bias_buffer, pack_biases(op))]
    return api.EmitResult(op, tasks, jobs, consts, notes=[
        f"mesa: {len(tasks)} task(s), weights {'resident' if g.reuse_weights else 'streamed'}"])


def _macs(g: MesaGeometry, t: MesaTask) -> int:
    per_out = g.k_w * g.k_h * (1 if g.depthwise else g.cin)
    return t.output_width * t.output_height * per_out * g.cout


def mesa_operations(model: dict, names: dict[str, str] | None = None) -> list[MesaConv]:
    """Mesa's lowering of a captured TFLite-style graph (rkt_ml.c subgraph_create):
    every CONV_2D becomes an operation; an ADD is fused into the conv producing its
    first input, and the producer of its second input is marked `addition_input`.

    Buffers are named as in the capture: tensor:N, weights:opK, biases:opK, regcmd:opK."""
    tensors = {t["index"]: t for t in model["tensors"]}

    def tensor(i: int) -> MesaTensor:
        t = tensors[i]
        return MesaTensor(f"tensor:{i}", tuple(t["pipe_tensor_dims"]), f32(t["scale"]), t["zero_point"])

    def data(i: int, dtype) -> np.ndarray:
        import base64

        return np.frombuffer(base64.b64decode(tensors[i]["data_b64"]), dtype)

    convs: list[dict] = []
    for raw in model["operations"]:
        if raw["type"] in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            if raw.get("dilation_w", 1) != 1 or raw.get("dilation_h", 1) != 1:
                raise UnsupportedError("Mesa's rocket driver does not support dilated convolutions")
            i, w, b = raw["inputs"]
            convs.append(dict(raw=raw, input=i, output=raw["outputs"][0], weights=w, bias=b,
                              add=None, addition_input=False))
        elif raw["type"] == "ADD":
            first, second = raw["inputs"]
            target = next((c for c in convs if c["output"] == first), None)
            source = next((c for c in convs if c["output"] == second), None)
            if target is None:
                raise UnsupportedError("Mesa fuses an ADD only into the convolution producing its first input")
            if source is not None:
                source["addition_input"] = True
            target["add"] = second
            target["output"] = raw["outputs"][0]
        else:
            raise UnsupportedError(f"Mesa's rocket driver does not lower {raw['type']}")
    ops = []
    for k, c in enumerate(convs):
        wt = tensors[c["weights"]]
        dims = tuple(wt["pipe_tensor_dims"])
        raw = c["raw"]
        ops.append(MesaConv(
            input=tensor(c["input"]), output=tensor(c["output"]),
            weights=data(c["weights"], np.uint8).reshape(dims),
            weight_scale=f32(wt["scale"]), weight_zero_point=wt["zero_point"],
            bias=data(c["bias"], "<i4"), stride=raw["stride_w"], padding_same=raw["padding"] == "SAME",
            depthwise=bool(raw.get("depthwise")) or raw["type"] == "DEPTHWISE_CONV_2D",
            add=tensor(c["add"]) if c["add"] is not None else None,
            addition_input=c["addition_input"],
            weights_buffer=f"weights:op{k}", bias_buffer=f"biases:op{k}", regcmd_buffer=f"regcmd:op{k}",
            name=f"op{k}"))
    return ops


def link_operation(result: api.EmitResult, align: int = 64) -> tuple[np.ndarray, list[list[api.Reloc]]]:
    """Mesa's regcmd buffer of one operation (rkt_ml.c compile_operation): tasks at
    64-byte aligned offsets, each non-final task's tail pointing at the next one
    (PC_BASE_ADDRESS through a relocation into the op's regcmd buffer, and
    PC_REGISTER_AMOUNTS = mesa_link_amount(next count)), whatever the job split."""
    from rkc.ir.npu.regcmd import ENTRY_BYTES, mesa_link_amount, write_entry

    op = result.op
    offsets, pos = [], 0
    for t in result.tasks:
        offsets.append(pos)
        pos += layout.align(t.count * ENTRY_BYTES, align)
    blob = np.zeros(pos // ENTRY_BYTES, np.uint64)
    relocs = []
    for i, t in enumerate(result.tasks):
        entries = t.regcmd.copy()
        rel = list(t.relocations)
        if i + 1 < len(result.tasks):
            nxt = result.tasks[i + 1]
            entries[-4] = write_entry("PC_BASE_ADDRESS", 0)
            entries[-3] = write_entry("PC_REGISTER_AMOUNTS", mesa_link_amount(nxt.count))
            rel.append(api.Reloc(t.count - 4, op.regcmd_buffer, offsets[i + 1]))
        start = offsets[i] // ENTRY_BYTES
        blob[start:start + t.count] = entries
        relocs.append(rel)
    return blob, relocs


def task_offsets(result: api.EmitResult, align: int = 64) -> list[int]:
    from rkc.ir.npu.regcmd import ENTRY_BYTES

    out, pos = [], 0
    for t in result.tasks:
        out.append(pos)
        pos += layout.align(t.count * ENTRY_BYTES, align)
    return out


def lower_mesa_with_options(op: MesaConv, options: api.EmitOptions) -> api.EmitResult:
    """`dispatch.emit` entry: Mesa's lowering takes no options (it has its own tiling)."""
    return lower_mesa(op)
