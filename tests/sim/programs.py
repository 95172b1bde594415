"""Small, explicit NPU task programs for the simulator's tests and benchmarks.

Written from the register recipes in hw-matmul.md 3.2 and the captured
rocket-userspace / Mesa streams (the same values the golden captures carry),
by register and field name through RegcmdBuilder. It is deliberately a plain
reference program, independent of the simulator's code, so tests can change
one register and check the simulator's reaction. rkc's real emitters live in
compiler/npu.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from rkc.ir.npu import layout
from rkc.ir.npu.regcmd import RegcmdBuilder, decode_entry, link_tail, write_entry
from rkc.runtime.device import BufferObject, Job, Task

PREC = {"int8": 0, "int16": 1, "fp16": 2, "bf16": 3, "int32": 4, "fp32": 5}
ITEM = {"int8": 1, "int16": 2, "fp16": 2, "bf16": 2, "int32": 4, "fp32": 4}
PASS = {("int8", False): 16, ("int8", True): 32, ("fp16", False): 8, ("fp16", True): 16, ("bf16", False): 8}
BANK = 32 * 1024
CONV_ENABLE = 0x1D  # CNA | CORE | DPU | DPU_RDMA


@dataclass
class Ref:
    """An address operand: a BO and a byte offset in it."""

    bo: BufferObject
    offset: int = 0

    @property
    def iova(self) -> int:
        return self.bo.iova + self.offset


@dataclass
class Stage:
    """One BS or BN stage programmed explicitly: ALU -> MUL (shift) -> ReLU. An
    operand left None comes per channel from the stage's DMA (BRDMA / NRDMA)."""

    alu: int | None = None  # ALU_ALGO (0 max, 1 min, 2 add, 4 minus); None: ALU bypassed
    alu_operand: int | None = None  # register operand, raw 32 bits
    mul: bool = False
    mul_operand: int | None = None  # register operand, raw 16 bits
    shift: int = 0  # MUL_SHIFT_VALUE (non-negative products)
    shift_neg: int = 0  # DATA_FORMAT *_MUL_SHIFT_VALUE_NEG (negative products)
    relu: bool = False
    data_use: int | None = None  # the DMA's DATA_USE; default: 1 ALU, 4 MUL, 7 (64-byte groups) both

    @property
    def use(self) -> int:
        if self.data_use is not None:
            return self.data_use
        alu = self.alu is not None and self.alu_operand is None
        mul = self.mul and self.mul_operand is None
        return 7 if alu and mul else (1 if alu else 0) | (4 if mul else 0)


@dataclass
class ConvSpec:
    prec: str  # "int8" | "fp16"
    channels: int  # C (input channels; multiple of the atom)
    height: int
    width: int
    kernels: int  # K (ignored for depthwise: = channels)
    kh: int = 1
    kw: int = 1
    stride: int = 1
    pad_top: int = 0
    pad_left: int = 0
    depthwise: bool = False
    out: str = "int32"  # output precision
    out_h: int | None = None  # default: what the padding/stride imply with right/bottom pad = left/top
    out_w: int | None = None
    # DPU epilogue
    bias: bool = False  # BS ALU add of a per-channel operand (int32 / fp32) from BRDMA
    relu: bool = False  # BS ReLU
    relux: int | None = None  # BS ReLU clamped at this value
    bn_mul_shift: int | None = None  # BN MUL by a per-channel int16 operand from NRDMA, then >> shift
    out_scale: int = 1
    out_shift: int = 0
    out_offset: int = 0
    ow_op: int = 0  # CPEND operand (integer paths)
    ow_src: bool = False  # CPEND operand per channel from the BS groups (OW_SRC=1)
    bs: Stage | None = None  # explicit BS stage (replaces bias / relu / relux)
    bn: Stage | None = None  # explicit BN stage (replaces bn_mul_shift)
    residual: str | None = None  # None | "add": EW add of a per-pixel operand (COMB_USE=5 pairing)
    residual_dtype: str = "int8"
    ew_scale: int = 1
    ew_shift: int = 0
    ew_offset: int = 0
    pad_value: int = 0

    @property
    def kernel_count(self) -> int:
        return 1 if self.depthwise else self.kernels

    @property
    def out_channels(self) -> int:
        return self.channels if self.depthwise else self.kernels

    @property
    def oh(self) -> int:
        return self.out_h or (self.height + 2 * self.pad_top - self.kh) // self.stride + 1

    @property
    def ow(self) -> int:
        return self.out_w or (self.width + 2 * self.pad_left - self.kw) // self.stride + 1

    @property
    def per_pass(self) -> int:
        return PASS[self.prec, self.depthwise]

    @property
    def written_channels(self) -> int:
        return -(-self.out_channels // self.per_pass) * self.per_pass

    @property
    def size_e(self) -> int:
        return self.per_pass * ITEM[self.out] // 8 - 1

    def out_bytes(self) -> int:
        c2 = 16 // ITEM[self.out]
        return -(-self.written_channels // c2) * self.oh * self.ow * 16


def conv_task(s: ConvSpec, x: Ref, w: Ref, y: Ref, bias: Ref | None = None, ew: Ref | None = None,
              enable: int = CONV_ENABLE, bn: Ref | None = None) -> RegcmdBuilder:
    """One CNA+CORE+DPU(+RDMA) task in the order of the captured streams."""
    p = PREC[s.prec]
    e = ITEM[s.prec]
    c2 = 16 // e
    c1 = -(-s.channels // c2)
    oh, ow = s.oh, s.ow
    b = RegcmdBuilder()
    b.write("DPU_S_POINTER", 0xE)
    b.write("DPU_RDMA_RDMA_S_POINTER", 0xE)
    b.write("CNA_CONV_CON1", PROC_PRECISION=p, IN_PRECISION=p, CONV_MODE=3 if s.depthwise else 0)
    b.write("CNA_CONV_CON2", FEATURE_GRAINS=min(1023, max(s.height + 1, s.stride + s.kh + 1)))
    b.write("CNA_CONV_CON3", CONV_X_STRIDE=s.stride, CONV_Y_STRIDE=s.stride)
    b.write("CNA_DATA_SIZE0", DATAIN_WIDTH=s.width, DATAIN_HEIGHT=s.height)
    b.write("CNA_DATA_SIZE1", DATAIN_CHANNEL_REAL=s.channels - 1, DATAIN_CHANNEL=s.channels)
    b.write("CNA_DATA_SIZE2", DATAOUT_WIDTH=ow)
    b.write("CNA_DATA_SIZE3", DATAOUT_ATOMICS=ow * oh)
    per_kernel = s.kh * s.kw * s.channels * e
    b.write("CNA_WEIGHT_SIZE0", WEIGHT_BYTES=per_kernel * s.kernel_count)
    b.write("CNA_WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=per_kernel)
    b.write("CNA_WEIGHT_SIZE2", WEIGHT_WIDTH=s.kw, WEIGHT_HEIGHT=s.kh, WEIGHT_KERNELS=s.kernel_count)
    entries = -(-s.width * c1 * 16 // 64)  # one input row in 64-byte CBUF entries
    data_bytes = s.height * entries * 64
    banks = -(-data_bytes // BANK) + (1 if s.prec == "int8" and s.width == 1 else 0)
    b.write("CNA_CBUF_CON0", DATA_BANK=banks, WEIGHT_BANK=12 - banks)
    b.write("CNA_CBUF_CON1", DATA_ENTRIES=entries)
    b.write("CNA_CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=1)
    for i in range(1, 5):
        b.write(f"CNA_CVT_CON{i}", **{f"CVT_SCALE{i - 1}": 1})
    b.write("CNA_FC_CON0", 0)
    b.write("CNA_FC_CON1", 0)
    b.write("CNA_PAD_CON0", PAD_LEFT=s.pad_left, PAD_TOP=s.pad_top)
    b.address("CNA_FEATURE_DATA_ADDR", x.bo, x.offset)
    b.write("CNA_FC_CON2", 0)
    b.write("CNA_DMA_CON0", WEIGHT_BURST_LEN=15, DATA_BURST_LEN=15)
    b.write("CNA_DMA_CON1", LINE_STRIDE=4 * s.width)
    surf = s.width * s.height - 4 * s.width  # surface step = SURF_STRIDE + LINE_STRIDE (Q3)
    b.write("CNA_DMA_CON2", SURF_STRIDE=surf & 0xFFFFFFF)
    b.write("CNA_FC_DATA_SIZE0", DMA_WIDTH=s.width, DMA_HEIGHT=s.height)
    b.write("CNA_FC_DATA_SIZE1", DMA_CHANNEL=s.channels)
    b.write("CNA_DCOMP_CTRL", 0)
    b.write("CNA_DCOMP_REGNUM", 0)
    b.address("CNA_DCOMP_ADDR0", w.bo, w.offset)
    for i in range(16):
        b.write(f"CNA_DCOMP_AMOUNT{i}", 0)
    b.write("CNA_CVT_CON5", 0)
    b.write("CNA_PAD_CON1", s.pad_value & 0xFFFFFFFF)
    b.write("CORE_MISC_CFG", PROC_PRECISION=p, DW_EN=int(s.depthwise), QD_EN=1)
    b.write("CORE_DATAOUT_SIZE_0", DATAOUT_HEIGHT=oh - 1, DATAOUT_WIDTH=ow - 1)
    b.write("CORE_DATAOUT_SIZE_1", DATAOUT_CHANNEL=s.out_channels - 1)
    b.write("CORE_CLIP_TRUNCATE", 0)
    b.write("UNNAMED_0x3030", 0)
    mode = 3 if s.depthwise else 0
    b.write("DPU_FEATURE_MODE_CFG", BURST_LEN=15, CONV_MODE=mode, OUTPUT_MODE=2)
    b.write("DPU_DATA_FORMAT", OUT_PRECISION=PREC[s.out], IN_PRECISION=p, PROC_PRECISION=p,
            BS_MUL_SHIFT_VALUE_NEG=s.bs.shift_neg if s.bs else 0,
            BN_MUL_SHIFT_VALUE_NEG=s.bn.shift_neg if s.bn else s.bn_mul_shift or 0)
    b.write("DPU_OFFSET_PEND", 0)
    b.address("DPU_DST_BASE_ADDR", y.bo, y.offset)
    b.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=oh * ow)
    b.write("DPU_DATA_CUBE_WIDTH", WIDTH=ow - 1)
    b.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=oh - 1)
    b.write("DPU_DATA_CUBE_NOTCH_ADDR", 0)
    b.write("DPU_DATA_CUBE_CHANNEL", ORIG_CHANNEL=s.out_channels - 1, CHANNEL=s.out_channels - 1)
    relu = s.relu or s.relux is not None
    if s.bs:
        _write_stage(b, "BS", s.bs)
    elif s.bias or relu:
        b.write("DPU_BS_CFG", BS_ALU_ALGO=2 if s.bias else 0, BS_ALU_SRC=int(s.bias), BS_RELU_BYPASS=int(not relu),
                BS_RELUX_EN=int(s.relux is not None), BS_MUL_BYPASS=1, BS_ALU_BYPASS=int(not s.bias))
    else:
        b.write("DPU_BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1, BS_BYPASS=1)
    if not s.bs:
        b.write("DPU_BS_ALU_CFG", 0)
        b.write("DPU_BS_MUL_CFG", 0)
    b.write("DPU_BS_RELUX_CMP_VALUE", (s.relux or 0) & 0xFFFFFFFF)
    b.write("DPU_BS_OW_CFG", SIZE_E_2=s.size_e, SIZE_E_1=s.size_e, SIZE_E_0=s.size_e, OW_SRC=int(s.ow_src),
            OD_BYPASS=int(s.ow_op == 0 and not s.ow_src))
    b.write("DPU_BS_OW_OP", OW_OP=s.ow_op & 0xFFFF)
    b.write("DPU_WDMA_SIZE_0", CHANNEL_WDMA=s.out_channels - 1)
    b.write("DPU_WDMA_SIZE_1", HEIGHT_WDMA=oh - 1, WIDTH_WDMA=ow - 1)
    if s.bn:
        _write_stage(b, "BN", s.bn)
    elif s.bn_mul_shift is not None:
        b.write("DPU_BN_CFG", BN_RELU_BYPASS=1, BN_ALU_BYPASS=1)
        b.write("DPU_BN_ALU_CFG", 0)
        b.write("DPU_BN_MUL_CFG", BN_MUL_SHIFT_VALUE=s.bn_mul_shift, BN_MUL_SRC=1)
    else:
        b.write("DPU_BN_CFG", BN_RELU_BYPASS=1, BN_MUL_BYPASS=1, BN_ALU_BYPASS=1, BN_BYPASS=1)
        b.write("DPU_BN_ALU_CFG", 0)
        b.write("DPU_BN_MUL_CFG", 0)
    b.write("DPU_BN_RELUX_CMP_VALUE", 0)
    if s.residual:
        size = {1: 1, 2: 2, 4: 3}[ITEM[s.residual_dtype]]
        b.write("DPU_EW_CFG", EW_CVT_TYPE=1, EW_DATA_MODE=1, EDATA_SIZE=size, EW_ALU_ALGO=2, EW_RELU_BYPASS=1,
                EW_LUT_BYPASS=1, EW_OP_SRC=1, EW_OP_CVT_BYPASS=int(s.prec != "int8"))
    else:
        b.write("DPU_EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_BYPASS=1, EW_BYPASS=1)
    b.write("DPU_EW_CVT_OFFSET_VALUE", s.ew_offset & 0xFFFFFFFF)
    b.write("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SHIFT=s.ew_shift, EW_OP_CVT_SCALE=s.ew_scale)
    b.write("DPU_EW_RELUX_CMP_VALUE", 0)
    b.write("DPU_OUT_CVT_OFFSET", s.out_offset & 0xFFFFFFFF)
    b.write("DPU_OUT_CVT_SCALE", FP32TOFP16_EN=int(s.out == "fp16"), OUT_CVT_SCALE=s.out_scale)
    b.write("DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=s.out_shift)
    for i in range(8):
        b.write(f"DPU_EW_OP_VALUE_{i}", 0)
    b.write("DPU_SURFACE_ADD", SURF_ADD=oh * ow * (s.size_e + 1))
    b.write("UNNAMED_0x40c4", 0)
    for name in ("ACCESS_CFG", "ACCESS_DATA", "CFG", "INFO", "LE_START", "LE_END", "LO_START", "LO_END",
                 "LE_SLOPE_SCALE", "LE_SLOPE_SHIFT", "LO_SLOPE_SCALE", "LO_SLOPE_SHIFT"):
        b.write(f"DPU_LUT_{name}", 0)
    b.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=ow - 1)
    b.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=oh - 1)
    b.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=s.out_channels - 1)
    if s.residual:
        b.address("DPU_RDMA_RDMA_SRC_BASE_ADDR", ew.bo, ew.offset)
    else:
        b.write("DPU_RDMA_RDMA_SRC_BASE_ADDR", 0)
    bs_use = s.bs.use if s.bs else (1 if s.bias else 0)
    b.write("DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=bs_use)
    if bs_use:
        b.address("DPU_RDMA_RDMA_BS_BASE_ADDR", bias.bo, bias.offset)
    else:
        b.write("DPU_RDMA_RDMA_BS_BASE_ADDR", 0)
    bn_use = s.bn.use if s.bn else (4 if s.bn_mul_shift is not None else 0)  # 4: the MUL operand
    if bn_use:
        b.write("DPU_RDMA_RDMA_NRDMA_CFG", NRDMA_DATA_USE=bn_use)
        b.address("DPU_RDMA_RDMA_BN_BASE_ADDR", bn.bo, bn.offset)
    else:
        b.write("DPU_RDMA_RDMA_NRDMA_CFG", 0)
        b.write("DPU_RDMA_RDMA_BN_BASE_ADDR", 0)
    surface = oh * ow
    if s.residual:
        size = {1: 1, 2: 2, 4: 3}[ITEM[s.residual_dtype]]
        b.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=1, ERDMA_DATA_SIZE=size)
        b.address("DPU_RDMA_RDMA_EW_BASE_ADDR", ew.bo, ew.offset + surface * 16)
        b.write("DPU_RDMA_RDMA_EW_SURF_STRIDE", EW_SURF_STRIDE=surface)
        b.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", BURST_LEN=15, COMB_USE=5, CONV_MODE=mode)
    else:
        b.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
        b.write("DPU_RDMA_RDMA_EW_BASE_ADDR", 0)
        b.write("DPU_RDMA_RDMA_EW_SURF_STRIDE", 0)
        b.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", BURST_LEN=15, MRDMA_DISABLE=1, CONV_MODE=mode)
    b.write("DPU_RDMA_RDMA_SRC_DMA_CFG", 0)
    b.write("DPU_RDMA_RDMA_SURF_NOTCH", SURF_NOTCH_ADDR=surface if s.residual else 0)
    b.write("DPU_RDMA_RDMA_PAD_CFG", 0)
    b.write("DPU_RDMA_RDMA_WEIGHT", E_WEIGHT=1, N_WEIGHT=1, B_WEIGHT=1, M_WEIGHT=1)
    b.write("DPU_RDMA_RDMA_EW_SURF_NOTCH", EW_SURF_NOTCH=surface if s.residual else 0)
    b.finish(enable)
    return b


def _write_stage(b: RegcmdBuilder, name: str, st: Stage) -> None:
    p = name + "_"
    on = st.alu is not None or st.mul or st.relu
    b.write(f"DPU_{name}_CFG", **{p + "ALU_ALGO": st.alu or 0, p + "ALU_SRC": int(st.alu is not None and
                                                                               st.alu_operand is None),
                                   p + "RELU_BYPASS": int(not st.relu), p + "MUL_BYPASS": int(not st.mul),
                                   p + "ALU_BYPASS": int(st.alu is None), p + "BYPASS": int(not on)})
    b.write(f"DPU_{name}_ALU_CFG", (st.alu_operand or 0) & 0xFFFFFFFF)
    b.write(f"DPU_{name}_MUL_CFG", **{p + "MUL_OPERAND": (st.mul_operand or 0) & 0xFFFF,
                                       p + "MUL_SHIFT_VALUE": st.shift,
                                       p + "MUL_SRC": int(st.mul and st.mul_operand is None)})


def operand_groups(alu: np.ndarray, mul: np.ndarray, cpend: np.ndarray | None = None) -> np.ndarray:
    """DATA_USE=7 operands: per 8 channels a 64-byte group, int32 A @0, int16 B
    (CPEND) @32, int16 C (MUL) @48 (rockchip-npu-notes out-cvt-converter.md)."""
    n = len(alu)
    groups = -(-n // 8)
    buf = np.zeros((groups, 64), np.uint8)
    for values, off, dt in ((alu, 0, "<i4"), (cpend, 32, "<i2"), (mul, 48, "<i2")):
        if values is not None:
            v = np.zeros(groups * 8, dt)
            v[:n] = values
            buf[:, off:off + 8 * v.itemsize] = v.view(np.uint8).reshape(groups, -1)
    return buf.reshape(-1)


def gemm_spec(m: int, k: int, n: int, prec: str = "int8", out: str | None = None) -> ConvSpec:
    """C[M,N] = A[M,K] @ B[K,N] as a 1x1 convolution: C=K, H=M, W=1, N kernels."""
    return ConvSpec(prec, channels=k, height=m, width=1, kernels=n,
                    out=out or ("int32" if prec == "int8" else "fp32"))


# -- placing programs on a device -----------------------------------------------------
@dataclass
class Program:
    """Tasks placed in one regcmd BO, ready to submit as one job."""

    regcmd: BufferObject
    tasks: list[Task]
    in_bos: list[BufferObject] = field(default_factory=list)
    out_bos: list[BufferObject] = field(default_factory=list)

    def job(self, lane: int = 0, label: str = "test") -> Job:
        return Job(self.tasks, self.in_bos, self.out_bos, lane=lane, label=label)


def resolve(b: RegcmdBuilder) -> np.ndarray:
    entries = b.array().copy()
    for index, bo, offset in b.relocations:
        reg = decode_entry(int(entries[index])).register
        entries[index] = write_entry(reg, bo.iova + offset)
    return entries


def place(dev, builders: Sequence[RegcmdBuilder], chain: bool = False, in_bos=(), out_bos=(),
          slot_align: int = 64) -> Program:
    """Copy the tasks into one regcmd BO (each at a 64-byte aligned slot), link
    their tails for a hardware chain if asked."""
    streams = [resolve(b) for b in builders]
    offsets, pos = [], 0
    for s in streams:
        offsets.append(pos)
        pos += -(-s.size * 8 // slot_align) * slot_align
    bo = dev.create_bo(pos)
    dev.prepare_cpu_access(bo)
    for i, s in enumerate(streams):
        if chain and i + 1 < len(streams):
            link_tail(s, bo.iova + offsets[i + 1], streams[i + 1].size)
        bo.host[offsets[i]:offsets[i] + s.size * 8] = s.view(np.uint8)
    dev.finish_cpu_access(bo)
    tasks = [Task(bo.iova + o, s.size) for o, s in zip(offsets, streams)]
    if not in_bos and not out_bos:  # the lists rocket orders by: what the tasks' addresses point into
        in_bos, out_bos = touched_bos(builders)
    return Program(bo, tasks, list(in_bos), list(out_bos))


def touched_bos(builders: Sequence[RegcmdBuilder]) -> tuple[list[BufferObject], list[BufferObject]]:
    """(read BOs, written BOs) of the builders' relocated address registers."""
    from rkc.ir.npu.addresses import ADDRESS_USE

    reads: dict[int, BufferObject] = {}
    writes: dict[int, BufferObject] = {}
    for b in builders:
        for index, bo, _ in b.relocations:
            direction = ADDRESS_USE[decode_entry(int(b.entries[index])).register.name].direction
            if direction in ("read", "write"):
                (writes if direction == "write" else reads)[bo.handle] = bo
    return [bo for h, bo in reads.items() if h not in writes], list(writes.values())


def upload(dev, data: np.ndarray, size: int | None = None) -> BufferObject:
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    bo = dev.create_bo(max(size or 0, raw.size, 1))
    dev.prepare_cpu_access(bo)
    bo.host[:raw.size] = raw
    dev.finish_cpu_access(bo)
    return bo


# -- ready-made GEMM ------------------------------------------------------------------
def gemm_buffers(dev, a: np.ndarray, b: np.ndarray, out: str):
    """A[M,K], B[K,N] -> (A ref, B ref, C ref) with A/B packed in the native layouts."""
    m, k = a.shape
    n = b.shape[1]
    a_bo = upload(dev, layout.pack_gemm_a(a))
    w_bo = upload(dev, layout.pack_gemm_b(b))
    spec = gemm_spec(m, k, n, "int8" if a.dtype == np.int8 else "fp16", out)
    c_bo = dev.create_bo(spec.out_bytes())
    return spec, Ref(a_bo), Ref(w_bo), Ref(c_bo)


def read_gemm(dev, c: Ref, spec: ConvSpec) -> np.ndarray:
    dev.prepare_cpu_access(c.bo)
    dt = {"int32": np.int32, "fp32": np.float32, "fp16": np.float16, "int8": np.int8}[spec.out]
    c2 = 16 // np.dtype(dt).itemsize
    surfaces = -(-spec.written_channels // c2)
    raw = c.bo.host[c.offset:c.offset + surfaces * spec.height * 16].view(dt).reshape(surfaces, spec.height, 1, c2)
    out = layout.unpack_gemm_c(raw, spec.kernels)
    dev.finish_cpu_access(c.bo)
    return out


def run_gemm(dev, a: np.ndarray, b: np.ndarray, out: str | None = None, chained: bool = False) -> np.ndarray:
    spec, x, w, y = gemm_buffers(dev, a, b, out or ("int32" if a.dtype == np.int8 else "fp32"))
    prog = place(dev, [conv_task(spec, x, w, y)], in_bos=[x.bo, w.bo], out_bos=[y.bo])
    dev.run([prog.job()], chained=chained)
    return read_gemm(dev, y, spec)


# -- a flying (DPU-only) LUT activation, fp16 (dpu-lut-activation.md) -----------------------
def lut_tables(f, index_scale: float, lo: float = 0.0, s_exp: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """LE/LO tables of q = (f(x) - lo) / 2^s_exp in unsigned Q0.15 (kept >= 1)."""
    step = 32.0 / index_scale
    le_x = -(512 - np.arange(513)) * step
    lo_x = np.arange(513) * step
    q = lambda x: np.clip(np.rint((f(x) - lo) / 2.0 ** s_exp * 32768), 1, 32767).astype(np.int16)
    return q(le_x), q(lo_x)


def flying_lut_task(x: Ref, y: Ref, atoms: int, le: np.ndarray, lo: np.ndarray, index_scale: float,
                    lo_value: float = 0.0, s_exp: int = 0) -> RegcmdBuilder:
    """y = f(x) for `atoms` 8-channel fp16 atoms laid out as one line (H=1)."""
    c, h, w = 8, 1, atoms
    b = RegcmdBuilder()
    b.write("DPU_S_POINTER", 0xE)
    b.write("DPU_RDMA_RDMA_S_POINTER", 0xE)
    b.write("DPU_FEATURE_MODE_CFG", BURST_LEN=15, OUTPUT_MODE=2, FLYING_MODE=1)
    b.write("DPU_DATA_FORMAT", OUT_PRECISION=2, IN_PRECISION=2, PROC_PRECISION=2)
    b.write("DPU_OFFSET_PEND", 0)
    b.address("DPU_DST_BASE_ADDR", y.bo, y.offset)
    b.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=w * h)
    b.write("DPU_DATA_CUBE_WIDTH", WIDTH=w - 1)
    b.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=h - 1)
    b.write("DPU_DATA_CUBE_NOTCH_ADDR", 0)
    b.write("DPU_DATA_CUBE_CHANNEL", ORIG_CHANNEL=c - 1, CHANNEL=c - 1)
    b.write("DPU_BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1, BS_BYPASS=1)
    for n in ("DPU_BS_ALU_CFG", "DPU_BS_MUL_CFG", "DPU_BS_RELUX_CMP_VALUE", "DPU_BS_OW_OP"):
        b.write(n, 0)
    b.write("DPU_BS_OW_CFG", SIZE_E_2=1, SIZE_E_1=1, SIZE_E_0=1, OD_BYPASS=1)
    b.write("DPU_WDMA_SIZE_0", CHANNEL_WDMA=c - 1)
    b.write("DPU_WDMA_SIZE_1", HEIGHT_WDMA=h - 1, WIDTH_WDMA=w - 1)
    b.write("DPU_BN_CFG", BN_ALU_ALGO=2, BN_RELU_BYPASS=1)
    b.write("DPU_BN_ALU_CFG", 0x80000000)  # fp32 -0.0: a no-op add
    b.write("DPU_BN_MUL_CFG", BN_MUL_OPERAND=int(np.array(index_scale, np.float16).view(np.uint16)))
    b.write("DPU_BN_RELUX_CMP_VALUE", 0)
    b.write("DPU_EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1)
    b.write("DPU_EW_CVT_OFFSET_VALUE", 0)
    b.write("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
    b.write("DPU_EW_RELUX_CMP_VALUE", 0)
    b.write("DPU_OUT_CVT_OFFSET", round(lo_value * 32768 / 2.0 ** s_exp) & 0xFFFFFFFF)
    b.write("DPU_OUT_CVT_SCALE", FP32TOFP16_EN=1, OUT_CVT_SCALE=1)
    b.write("DPU_OUT_CVT_SHIFT", CVT_TYPE=1, MINUS_EXP=15 - s_exp)
    for i in range(8):
        b.write(f"DPU_EW_OP_VALUE_{i}", 0)
    b.write("DPU_SURFACE_ADD", SURF_ADD=w * h * 2)
    b.write("UNNAMED_0x40c4", 0)
    for table, values in ((0, le), (1, lo)):
        b.write("DPU_LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table, LUT_ADDR=0)
        for v in values:
            b.write("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(v) & 0xFFFF)
    b.write("DPU_LUT_CFG", LUT_HYBRID_PRIORITY=1, LUT_OFLOW_PRIORITY=1, LUT_LO_LE_MUX=2)
    b.write("DPU_LUT_INFO", LUT_LO_INDEX_SELECT=5, LUT_LE_INDEX_SELECT=5)
    b.write("DPU_LUT_LE_START", (-16384) & 0xFFFFFFFF)
    b.write("DPU_LUT_LE_END", 0)
    b.write("DPU_LUT_LO_START", 0)
    b.write("DPU_LUT_LO_END", 16384)
    for n in ("LE_SLOPE_SCALE", "LE_SLOPE_SHIFT", "LO_SLOPE_SCALE", "LO_SLOPE_SHIFT"):
        b.write(f"DPU_LUT_{n}", 0)
    b.write("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=w - 1)
    b.write("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT", HEIGHT=h - 1)
    b.write("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=c - 1)
    b.address("DPU_RDMA_RDMA_SRC_BASE_ADDR", x.bo, x.offset)
    for n in ("BRDMA_CFG", "BS_BASE_ADDR", "NRDMA_CFG", "BN_BASE_ADDR", "EW_BASE_ADDR", "EW_SURF_STRIDE",
              "SRC_DMA_CFG", "SURF_NOTCH", "PAD_CFG", "EW_SURF_NOTCH"):
        b.write(f"DPU_RDMA_RDMA_{n}", 0)
    b.write("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1)
    b.write("DPU_RDMA_RDMA_FEATURE_MODE_CFG", IN_PRECISION=2, BURST_LEN=15, PROC_PRECISION=2,
            MRDMA_FP16TOFP32_EN=1, FLYING_MODE=1)
    b.write("DPU_RDMA_RDMA_WEIGHT", E_WEIGHT=1, N_WEIGHT=1, B_WEIGHT=1, M_WEIGHT=1)
    b.finish(0x18)  # DPU | DPU_RDMA
    return b


# -- a standalone fp16 pool (ppu-pooling.md) ------------------------------------------------
def pool_task(x: Ref, y: Ref, c: int, h: int, w: int, k: int, stride: int, method: str,
              pad: int = 0) -> RegcmdBuilder:
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    b = RegcmdBuilder()
    b.write("PPU_S_POINTER", 0xE)
    b.write("PPU_RDMA_RDMA_S_POINTER", 0xE)
    b.write("PPU_DATA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=w - 1)
    b.write("PPU_DATA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=h - 1)
    b.write("PPU_DATA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=c - 1)
    b.write("PPU_DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=ow - 1)
    b.write("PPU_DATA_CUBE_OUT_HEIGHT", CUBE_OUT_HEIGHT=oh - 1)
    b.write("PPU_DATA_CUBE_OUT_CHANNEL", CUBE_OUT_CHANNEL=c - 1)
    b.write("PPU_OPERATION_MODE_CFG", FLYING_MODE=1, POOLING_METHOD={"avg": 0, "max": 1, "min": 2}[method])
    b.write("PPU_POOLING_KERNEL_CFG", KERNEL_STRIDE_HEIGHT=stride - 1, KERNEL_STRIDE_WIDTH=stride - 1,
            KERNEL_HEIGHT=k - 1, KERNEL_WIDTH=k - 1)
    recip = int(np.array(65536.0 / k, np.float16).view(np.uint16)) if method == "avg" else 0
    b.write("PPU_RECIP_KERNEL_WIDTH", RECIP_KERNEL_WIDTH=recip)
    b.write("PPU_RECIP_KERNEL_HEIGHT", RECIP_KERNEL_HEIGHT=recip)
    b.write("PPU_POOLING_PADDING_CFG", PAD_BOTTOM=pad, PAD_RIGHT=pad, PAD_TOP=pad, PAD_LEFT=pad)
    b.write("PPU_PADDING_VALUE_1_CFG", 0xFC00 if method == "max" else 0)
    b.write("PPU_PADDING_VALUE_2_CFG", 0)
    b.address("PPU_DST_BASE_ADDR", y.bo, y.offset)
    b.write("PPU_DST_SURF_STRIDE", DST_SURF_STRIDE=oh * ow)
    b.write("PPU_DATA_FORMAT", INDEX_ADD=oh * ow, PROC_PRECISION=2)
    b.write("PPU_MISC_CTRL", BURST_LEN=3)
    b.write("PPU_RDMA_RDMA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=w - 1)
    b.write("PPU_RDMA_RDMA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=h - 1)
    b.write("PPU_RDMA_RDMA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=c - 1)
    b.address("PPU_RDMA_RDMA_SRC_BASE_ADDR", x.bo, x.offset)
    b.write("PPU_RDMA_RDMA_SRC_LINE_STRIDE", SRC_LINE_STRIDE=w)
    b.write("PPU_RDMA_RDMA_SRC_SURF_STRIDE", SRC_SURF_STRIDE=w * h)
    b.write("PPU_RDMA_RDMA_DATA_FORMAT", IN_PRECISION=2)
    b.finish(0x60)
    return b
