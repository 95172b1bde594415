"""One convolution task (a GEMM is the 1x1 case): CNA + CORE + DPU + DPU_RDMA.

`ConvTile` describes the task; `tile_task` turns it into a `Task` (registers in the
common conv order of regfile.CONV_ORDER, relocations, CBUF plan, counters).

Geometry rules and their sources:
* feature strides: LINE_STRIDE = 4 * W and SURF_STRIDE = surface/16 - LINE_STRIDE
  (16-byte units; the CNA fetches rows in groups of four, so the step to the next
  channel surface is SURF_STRIDE + LINE_STRIDE). Mesa's line*(H/4 - 1) and
  rocket-userspace's W*(H-4) are this rule for dense maps; a map with fewer than
  four rows gets a negative (28-bit two's complement) SURF_STRIDE, as happyme531
  programs for H=1 (hw-matmul.md 2.2; open question 1 in docs/npu-emitters.md).
* CBUF_CON1.DATA_ENTRIES = ceil(W * atoms / 4): Mesa's ceil(W*2*ceil(C/16)/8) and
  rocket-userspace's ceil(W*C/64) int8, ceil(W*C/32) fp16 are all this.
* FEATURE_GRAINS = rows + 1 (rocket-userspace, HW-insensitive above the TRM
  minimum kernel_h + stride_y + 1); depthwise keeps Mesa's 50 + stride + 1, which
  rocket-userspace validated for depthwise.
* kernels are programmed in whole groups (32 int8, 16 fp16), zero kernels filling
  the last group: a partial group hangs the int8 direct program (rockchip-npu-notes
  out-cvt-converter.md); the DPU writes only ORIG_CHANNEL + 1 channels (Mesa's
  encoding: ORIG_CHANNEL = real channels - 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from rkc.compiler.npu import api, formats
from rkc.compiler.npu.epilogue import DpuPlan
from rkc.compiler.npu.regfile import CONV_BLOCKS, CONV_ORDER, S_POINTER_FIELDS, RegisterFile, build
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import footprint, hw, layout

BURST_LEN = 15  # DMA burst length every public program uses (Mesa, rocket-userspace)
DW_FEATURE_GRAINS_BASE = 50  # Mesa's depthwise prefetch depth, 50 + stride + 1
BANK_BYTES = hw.CBUF_BANK_BYTES


def kernel_group(in_dtype: str) -> int:
    """Kernels per 1 KiB weight tile: 64 int4, 32 int8, 16 fp16."""
    return 256 // api.BITS[in_dtype]


@dataclass
class ConvTile:
    input: api.Feature  # the rows and channels this task reads (a view)
    output: api.Feature  # the rows and channels it writes (a view)
    weights_buffer: str
    weights_offset: int
    kernels: int  # WEIGHT_KERNELS (whole groups; 1 for depthwise)
    out_channels_hw: int  # CORE/DPU channel count
    kernel: tuple[int, int]  # (kh, kw)
    stride: tuple[int, int]  # (sy, sx)
    pad: tuple[int, int]  # (top, left) of this task
    pad_value: int
    depthwise: bool
    dpu: DpuPlan
    cbuf: api.CbufPlan
    channel0: int = 0  # first output channel of the tile (BS constant offset)
    bs_buffer: str | None = None
    residual: api.Feature | None = None  # the residual tile (a view), if fused
    residual_rows: int = 0  # rows of the whole residual tensor (EW notch)
    label: str = ""
    # fewer input rows compute wrongly on silicon (Q2; EmitOptions.min_input_rows)
    min_input_rows: int = api.DEFAULT_OPTIONS.min_input_rows

    @property
    def in_channels_hw(self) -> int:
        return layout.align(self.input.channels, self.input.c2)

    @property
    def weight_bytes_per_kernel(self) -> int:
        kh, kw = self.kernel
        return kh * kw * self.in_channels_hw * self.input.bits // 8

    @property
    def weight_bytes(self) -> int:
        return self.weight_bytes_per_kernel * self.kernels


def feature_strides(f: api.Feature) -> tuple[int, int]:
    """(LINE_STRIDE, SURF_STRIDE) register values for reading feature `f`."""
    line = 4 * f.width
    return line, f.surface_bytes // layout.ATOM_BYTES - line


CBUF_DATA_ENTRY = 64  # bytes of one CNA_CBUF_CON1 data entry (4 atoms)


def data_entries(f: api.Feature) -> int:
    return -(-f.width * f.surfaces // 4)


def cbuf_row_bytes(width: int, atoms: int) -> int:
    """CBUF bytes one input row occupies: whole 64-byte data entries."""
    return -(-width * atoms // 4) * CBUF_DATA_ENTRY


def tile_registers(t: ConvTile) -> RegisterFile:
    f, o = t.input, t.output
    kh, kw = t.kernel
    sy, sx = t.stride
    check = formats.check
    check(f.width, formats.CNA_SIZE_MAX, f"{t.label}: input width")
    check(f.height, formats.CNA_SIZE_MAX, f"{t.label}: input rows")
    check(o.width, formats.CNA_SIZE_MAX, f"{t.label}: output width")
    check(o.height - 1, formats.CUBE_MAX, f"{t.label}: output rows")
    check(t.out_channels_hw - 1, formats.CUBE_MAX - 1, f"{t.label}: output channels")
    check(f.channels, formats.CNA_CHANNEL_MAX, f"{t.label}: input channels")
    check(t.kernels, formats.KERNELS_MAX, f"{t.label}: kernels")
    check(max(kh, kw), formats.KERNEL_SIZE_MAX, f"{t.label}: kernel size")
    check(max(sy, sx), formats.STRIDE_MAX, f"{t.label}: stride")
    check(max(t.pad), formats.PAD_MAX, f"{t.label}: padding")
    if t.weight_bytes_per_kernel > BANK_BYTES:
        raise UnsupportedError(f"{t.label}: one kernel is {t.weight_bytes_per_kernel} bytes, more than a "
                               f"CBUF bank; split the input channels")
    if f.line_stride is not None or (t.residual is not None and t.residual.line_stride is not None):
        raise UnsupportedError(f"{t.label}: a convolution reads maps with dense rows (no line stride)")
    in_p = formats.PRECISION[f.dtype]
    r = RegisterFile()
    r.set("DPU_S_POINTER", **S_POINTER_FIELDS)
    r.set("DPU_RDMA_RDMA_S_POINTER", **S_POINTER_FIELDS)
    r.set("CNA_CONV_CON1", CONV_MODE=3 if t.depthwise else 0, IN_PRECISION=in_p, PROC_PRECISION=in_p)
    # at least the TRM's minimum kernel_h + stride_y + 1
    grains = (DW_FEATURE_GRAINS_BASE + sy + 1) if t.depthwise else \
        min(max(f.height + 1, kh + sy + 1), formats.FEATURE_GRAINS_MAX)
    if f.height < t.min_input_rows:
        raise UnsupportedError(f"{t.label}: a task reads {f.height} input rows; fewer than {t.min_input_rows} "
                               f"compute wrongly on hardware (pad the map, or run it on the CPU)")
    r.set("CNA_CONV_CON2", FEATURE_GRAINS=grains)
    r.set("CNA_CONV_CON3", CONV_X_STRIDE=sx, CONV_Y_STRIDE=sy)
    r.set("CNA_DATA_SIZE0", DATAIN_WIDTH=f.width, DATAIN_HEIGHT=f.height)
    r.set("CNA_DATA_SIZE1", DATAIN_CHANNEL_REAL=f.channels - 1, DATAIN_CHANNEL=t.in_channels_hw)
    r.set("CNA_DATA_SIZE2", DATAOUT_WIDTH=o.width)
    r.set("CNA_DATA_SIZE3", DATAOUT_ATOMICS=o.width * o.height)
    r.set("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=t.weight_bytes)
    r.set("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=t.weight_bytes_per_kernel)
    r.set("CNA_WEIGHT_SIZE2", WEIGHT_WIDTH=kw, WEIGHT_HEIGHT=kh, WEIGHT_KERNELS=t.kernels)
    c = t.cbuf
    if c.data_banks + c.weight_banks > hw.CBUF_BANKS or c.weight_banks < 1:
        raise UnsupportedError(f"{t.label}: CBUF plan {c.data_banks}+{c.weight_banks} banks does not fit")
    r.set("CNA_CBUF_CON0", WEIGHT_REUSE=int(c.weight_reuse), DATA_REUSE=int(c.data_reuse),
          WEIGHT_BANK=c.weight_banks, DATA_BANK=c.data_banks)
    r.set("CNA_CBUF_CON1", DATA_ENTRIES=data_entries(f))
    r.set("CNA_CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=1)
    for i in range(4):
        r.set(f"CNA_CVT_CON{i + 1}", **{f"CVT_SCALE{i}": 1})
    r.set("CNA_PAD_CON0", PAD_LEFT=t.pad[1], PAD_TOP=t.pad[0])
    r.address("CNA_FEATURE_DATA_ADDR", f.buffer, f.offset)
    r.set("CNA_DMA_CON0", WEIGHT_BURST_LEN=BURST_LEN, DATA_BURST_LEN=BURST_LEN)
    line, surf = feature_strides(f)
    r.set("CNA_DMA_CON1", LINE_STRIDE=line)
    r.set("CNA_DMA_CON2", SURF_STRIDE=surf)
    r.set("CNA_FC_DATA_SIZE0", DMA_WIDTH=f.width, DMA_HEIGHT=f.height)
    r.set("CNA_FC_DATA_SIZE1", DMA_CHANNEL=t.in_channels_hw)
    r.address("CNA_DCOMP_ADDR0", t.weights_buffer, t.weights_offset)
    r.set("CNA_PAD_CON1", PAD_VALUE=t.pad_value & 0xFFFFFFFF)
    # QD_EN: set by Mesa's int8-output and every fp16 program, clear in the
    # HW-validated int8 -> int32 program (rocket-userspace gen_matmul_int8)
    # (the OW weight-zero-point term needs the window sums the CORE makes with QD_EN)
    # (int4 -> int16 passes the raw sum as int8 -> int32 does)
    qd = not (f.dtype in ("int8", "int4") and t.dpu.out_dtype in ("int32", "fp32", "int16")) or t.dpu.ow_op != 0
    r.set("CORE_MISC_CFG", PROC_PRECISION=in_p, DW_EN=int(t.depthwise), QD_EN=int(qd))
    r.set("CORE_DATAOUT_SIZE_0", DATAOUT_HEIGHT=o.height - 1, DATAOUT_WIDTH=o.width - 1)
    r.set("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=t.out_channels_hw - 1)
    _dpu_geometry(t, r)
    t.dpu.write(r, t.bs_buffer, t.channel0)
    return r


def _dpu_geometry(t: ConvTile, r: RegisterFile) -> None:
    o, p = t.output, t.dpu
    if o.dtype != p.out_dtype:
        raise UnsupportedError(f"{t.label}: output tensor is {o.dtype}, the epilogue writes {p.out_dtype}")
    r.set("DPU_FEATURE_MODE_CFG", BURST_LEN=BURST_LEN, OUTPUT_MODE=2, CONV_MODE=3 if t.depthwise else 0)
    r.address("DPU_DST_BASE_ADDR", o.buffer, o.offset)
    surface = o.surface_bytes // layout.ATOM_BYTES
    r.set("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=surface)
    r.set("DPU_DATA_CUBE_WIDTH", WIDTH=o.width - 1)
    r.set("DPU_DATA_CUBE_HEIGHT", HEIGHT=o.height - 1)
    r.set("DPU_DATA_CUBE_CHANNEL", ORIG_CHANNEL=o.channels - 1, CHANNEL=t.out_channels_hw - 1)
    notch = o.line_bytes // layout.ATOM_BYTES - o.width
    if notch:  # a line pitch past the row: (width + NOTCH) atoms per line (Q4)
        r.set("DPU_DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_0=notch, NOTCH_ADDR_1=notch)
    r.set("DPU_WDMA_SIZE_0", CHANNEL_WDMA=t.out_channels_hw - 1)
    r.set("DPU_WDMA_SIZE_1", HEIGHT_WDMA=o.height - 1, WIDTH_WDMA=o.width - 1)
    r.set("DPU_SURFACE_ADD", SURF_ADD=surface * p.writer.surface_add)
    r.set("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=o.width - 1)
    r.set("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=o.height - 1)
    r.set("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=t.out_channels_hw - 1)
    mode = dict(BURST_LEN=BURST_LEN, CONV_MODE=3 if t.depthwise else 0)
    if t.residual is None:
        r.set("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
        # MRDMA must be disabled when nothing feeds it, or the task hangs
        # (rocket-userspace npu_regcmd.c header); fp16 output also sets FP16TOFP32
        # as the HW-validated fp16 -> fp16 program does
        r.set("DPU_RDMA_RDMA_FEATURE_MODE_CFG", MRDMA_DISABLE=1, MRDMA_FP16TOFP32_EN=int(p.narrow_fp16), **mode)
    else:
        _residual_rdma(t, r, mode)
    # equal arbitration weights for the four DPU read DMAs, as every public program
    r.set("DPU_RDMA_RDMA_WEIGHT", E_WEIGHT=1, N_WEIGHT=1, B_WEIGHT=1, M_WEIGHT=1)


def _residual_rdma(t: ConvTile, r: RegisterFile, mode: dict) -> None:
    """Conv-main element-wise operand (Mesa's fused-ADD geometry, rkt_regcmd.c;
    the same words drive rocket-userspace's fp16 K-accumulation): the operand's
    first surface through SRC_BASE, the rest through the ERDMA one surface later."""
    res, o = t.residual, t.output
    stride = res.surface_bytes // layout.ATOM_BYTES
    if stride < formats.EW_STRIDE_MIN:
        raise UnsupportedError(f"{t.label}: residual surfaces of {stride} atoms are below the EW stride "
                               f"floor of {formats.EW_STRIDE_MIN}")
    size = formats.EDATA_SIZE[res.itemsize]
    prec = formats.PRECISION[res.dtype]
    r.address("DPU_RDMA_RDMA_SRC_BASE_ADDR", res.buffer, res.offset)
    r.set("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=1, ERDMA_DATA_SIZE=size)
    r.address("DPU_RDMA_RDMA_EW_BASE_ADDR", res.buffer, res.offset + res.surface_bytes)
    r.set("DPU_RDMA_RDMA_EW_SURF_STRIDE", EW_SURF_STRIDE=stride)
    r.set("DPU_RDMA_RDMA_FEATURE_MODE_CFG", COMB_USE=5, IN_PRECISION=prec, PROC_PRECISION=prec, **mode)
    # MRDMA reads the even operand surfaces, ERDMA the odd ones, each stepping two
    # surfaces: notch = 2 * stride - W * H_tile (Mesa's stride + W*(H_op - H_task) for a
    # dense operand)
    notch = 2 * stride - o.width * o.height
    r.set("DPU_RDMA_RDMA_SURF_NOTCH", SURF_NOTCH_ADDR=notch)
    r.set("DPU_RDMA_RDMA_EW_SURF_NOTCH", EW_SURF_NOTCH=notch)


def tile_task(t: ConvTile) -> api.Task:
    b = build(tile_registers(t), CONV_ORDER, CONV_BLOCKS)
    access = tile_access(t)
    return api.Task(b.array(), [api.Reloc(e, buf, off) for e, buf, off in b.relocations], t.cbuf,
                    tile_counters(t), t.label, footprint.touches(access), access)


def written_channels(t: ConvTile) -> int:
    """Channels the DPU handles: CHANNEL+1 (whole kernel groups or Mesa's
    depthwise count), not just the real ones; the writer emits whole passes of
    (SIZE_E+1) x 8 bytes."""
    per_pass = (t.dpu.writer.size_e + 1) * 8 // t.output.itemsize
    return layout.align(t.out_channels_hw, per_pass)


def written_surfaces(t: ConvTile) -> int:
    return -(-written_channels(t) // t.output.c2)


def tile_access(t: ConvTile) -> footprint.Access:
    """The bytes the task reads and writes: each map one piece per channel surface
    (a row band is one piece in each), weights and per-channel operands one piece."""
    def span(f: api.Feature, surfaces: int | None = None) -> footprint.Span:
        n = f.surfaces if surfaces is None else surfaces
        return footprint.surfaces_span(f.buffer, f.offset, n, f.surface_bytes, f.dense_surface_bytes)

    reads = [span(t.input), footprint.Span(t.weights_buffer, t.weights_offset, t.weight_bytes)]
    if t.residual is not None:  # ERDMA reads whole surfaces of every DPU channel (an int8 depthwise task's 64+)
        reads.append(span(t.residual, max(t.residual.surfaces, -(-t.out_channels_hw // t.residual.c2))))
    if t.bs_buffer is not None and t.dpu.bs_data is not None:
        start = t.dpu.bs_offset(t.channel0)
        per = 8 if t.dpu.bs_groups else 4
        reads.append(footprint.Span(t.bs_buffer, start, layout.align(t.out_channels_hw, 8) * per))
    return footprint.Access(tuple(reads), (span(t.output, written_surfaces(t)),))


def tile_counters(t: ConvTile) -> api.Counters:
    kh, kw = t.kernel
    o, f = t.output, t.input
    # what the MAC array runs: every programmed kernel over the atom-padded input channels
    kernels = t.in_channels_hw if t.depthwise else t.kernels * t.in_channels_hw
    macs = o.width * o.height * kh * kw * kernels
    reads = {}
    if not t.cbuf.data_reuse:
        reads["cna_feature"] = f.surfaces * f.dense_surface_bytes
    if not t.cbuf.weight_reuse:
        reads["cna_weight"] = t.weight_bytes
    if t.dpu.bs_data is not None:  # BRDMA reads an operand for every DPU channel
        reads["dpu_bs"] = t.out_channels_hw * (8 if t.dpu.bs_groups else 4)
    if t.residual is not None:  # ERDMA reads whole surfaces of every DPU channel
        reads["dpu_ew"] = -(-t.out_channels_hw // t.residual.c2) * t.residual.dense_surface_bytes
    # LUT tables travel inside the regcmd (counted with it)
    writes = {"dpu_wdma": written_surfaces(t) * o.height * o.width * layout.ATOM_BYTES}
    return api.Counters(macs, reads, writes, mac_dtype=f.dtype)
