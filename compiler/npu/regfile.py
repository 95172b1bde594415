"""One task's register values by name, written out in a fixed order.

Emitters fill a `RegisterFile` (field values checked by `Register.pack`;
address registers only as buffer + offset) and then write it through
`RegcmdBuilder` in one of the orders below. Keeping values and order apart
lets the Mesa-compatible mode and rkc's own mode share every block.

The orders are facts: `CONV_ORDER` is the register sequence of a conv/GEMM task
as both Mesa's rocket driver (rkt_regcmd.c @ bminor/mesa-mesa 5b829658) and
rocket-userspace (src/npu_regcmd.c gen_matmul_task @ e0677862) emit it, after
Mesa's 4-entry preamble (`MESA_PREAMBLE`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from rkc.ir.errors import RegisterError
from rkc.ir.npu.regcmd import RegcmdBuilder, write_entry
from rkc.ir.npu.registers import Block, register

_DCOMP_AMOUNTS = tuple(f"CNA_DCOMP_AMOUNT{i}" for i in range(16))
_EW_OP_VALUES = tuple(f"DPU_EW_OP_VALUE_{i}" for i in range(8))

CNA_CORE_ORDER: tuple[str, ...] = (
    "CNA_CONV_CON1", "CNA_CONV_CON2", "CNA_CONV_CON3",
    "CNA_DATA_SIZE0", "CNA_DATA_SIZE1", "CNA_DATA_SIZE2", "CNA_DATA_SIZE3",
    "CNA_WEIGHT_SIZE0", "CNA_WEIGHT_SIZE1", "CNA_WEIGHT_SIZE2",
    "CNA_CBUF_CON0", "CNA_CBUF_CON1",
    "CNA_CVT_CON0", "CNA_CVT_CON1", "CNA_CVT_CON2", "CNA_CVT_CON3", "CNA_CVT_CON4",
    "CNA_FC_CON0", "CNA_FC_CON1", "CNA_PAD_CON0", "CNA_FEATURE_DATA_ADDR", "CNA_FC_CON2",
    "CNA_DMA_CON0", "CNA_DMA_CON1", "CNA_DMA_CON2", "CNA_FC_DATA_SIZE0", "CNA_FC_DATA_SIZE1",
    "CNA_DCOMP_CTRL", "CNA_DCOMP_REGNUM", "CNA_DCOMP_ADDR0", *_DCOMP_AMOUNTS,
    "CNA_CVT_CON5", "CNA_PAD_CON1",
    "CORE_MISC_CFG", "CORE_DATAOUT_SIZE_0", "CORE_DATAOUT_SIZE_1", "CORE_CLIP_TRUNCATE",
    "UNNAMED_0x3030",
)

LUT_ORDER: tuple[str, ...] = (
    "DPU_LUT_ACCESS_CFG", "DPU_LUT_ACCESS_DATA", "DPU_LUT_CFG", "DPU_LUT_INFO",
    "DPU_LUT_LE_START", "DPU_LUT_LE_END", "DPU_LUT_LO_START", "DPU_LUT_LO_END",
    "DPU_LUT_LE_SLOPE_SCALE", "DPU_LUT_LE_SLOPE_SHIFT", "DPU_LUT_LO_SLOPE_SCALE", "DPU_LUT_LO_SLOPE_SHIFT",
)

DPU_ORDER: tuple[str, ...] = (
    "DPU_FEATURE_MODE_CFG", "DPU_DATA_FORMAT", "DPU_OFFSET_PEND", "DPU_DST_BASE_ADDR",
    "DPU_DST_SURF_STRIDE", "DPU_DATA_CUBE_WIDTH", "DPU_DATA_CUBE_HEIGHT", "DPU_DATA_CUBE_NOTCH_ADDR",
    "DPU_DATA_CUBE_CHANNEL",
    "DPU_BS_CFG", "DPU_BS_ALU_CFG", "DPU_BS_MUL_CFG", "DPU_BS_RELUX_CMP_VALUE",
    "DPU_BS_OW_CFG", "DPU_BS_OW_OP", "DPU_WDMA_SIZE_0", "DPU_WDMA_SIZE_1",
    "DPU_BN_CFG", "DPU_BN_ALU_CFG", "DPU_BN_MUL_CFG", "DPU_BN_RELUX_CMP_VALUE",
    "DPU_EW_CFG", "DPU_EW_CVT_OFFSET_VALUE", "DPU_EW_CVT_SCALE_VALUE", "DPU_EW_RELUX_CMP_VALUE",
    "DPU_OUT_CVT_OFFSET", "DPU_OUT_CVT_SCALE", "DPU_OUT_CVT_SHIFT", *_EW_OP_VALUES,
    "DPU_SURFACE_ADD", "UNNAMED_0x40c4", *LUT_ORDER,
)

DPU_RDMA_ORDER: tuple[str, ...] = tuple("DPU_RDMA_RDMA_" + n for n in (
    "DATA_CUBE_WIDTH", "DATA_CUBE_HEIGHT", "DATA_CUBE_CHANNEL", "SRC_BASE_ADDR", "BRDMA_CFG",
    "BS_BASE_ADDR", "NRDMA_CFG", "BN_BASE_ADDR", "ERDMA_CFG", "EW_BASE_ADDR", "EW_SURF_STRIDE",
    "FEATURE_MODE_CFG", "SRC_DMA_CFG", "SURF_NOTCH", "PAD_CFG", "WEIGHT", "EW_SURF_NOTCH"))

S_POINTERS = ("DPU_S_POINTER", "DPU_RDMA_RDMA_S_POINTER")

# A conv / GEMM task: CNA + CORE + DPU + DPU_RDMA (126 entries with the tail).
CONV_ORDER = (*S_POINTERS, *CNA_CORE_ORDER, *DPU_ORDER, *DPU_RDMA_ORDER)
# Mesa writes these four before the common sequence (rkt_regcmd.c fill_first_regcmd).
MESA_PREAMBLE = ("CNA_CBUF_CON0", "CNA_DCOMP_REGNUM", "CNA_DCOMP_CTRL", "CNA_CONV_CON1")
# A standalone DPU task ("flying": the DPU reads its input through DPU_RDMA).
FLYING_ORDER = (*S_POINTERS, *DPU_ORDER, *DPU_RDMA_ORDER)

PPU_ORDER: tuple[str, ...] = (
    "PPU_S_POINTER", "PPU_RDMA_RDMA_S_POINTER",
    "PPU_DATA_CUBE_IN_WIDTH", "PPU_DATA_CUBE_IN_HEIGHT", "PPU_DATA_CUBE_IN_CHANNEL",
    "PPU_DATA_CUBE_OUT_WIDTH", "PPU_DATA_CUBE_OUT_HEIGHT", "PPU_DATA_CUBE_OUT_CHANNEL",
    "PPU_OPERATION_MODE_CFG", "PPU_POOLING_KERNEL_CFG", "PPU_RECIP_KERNEL_WIDTH",
    "PPU_RECIP_KERNEL_HEIGHT", "PPU_POOLING_PADDING_CFG", "PPU_PADDING_VALUE_1_CFG",
    "PPU_PADDING_VALUE_2_CFG", "PPU_DST_BASE_ADDR", "PPU_DST_SURF_STRIDE", "PPU_DATA_FORMAT",
    "PPU_MISC_CTRL",
    "PPU_RDMA_RDMA_CUBE_IN_WIDTH", "PPU_RDMA_RDMA_CUBE_IN_HEIGHT", "PPU_RDMA_RDMA_CUBE_IN_CHANNEL",
    "PPU_RDMA_RDMA_SRC_BASE_ADDR", "PPU_RDMA_RDMA_SRC_LINE_STRIDE", "PPU_RDMA_RDMA_SRC_SURF_STRIDE",
    "PPU_RDMA_RDMA_DATA_FORMAT",
)

# Blocks each kind of task starts (the op-enable word of the tail).
CONV_BLOCKS = (Block.CNA, Block.CORE, Block.DPU, Block.DPU_RDMA)  # 0x1D
FLYING_BLOCKS = (Block.DPU, Block.DPU_RDMA)  # 0x18
PPU_BLOCKS = (Block.PPU, Block.PPU_RDMA)  # 0x60

# S_POINTER = POINTER_PP_EN | EXECUTER_PP_EN | POINTER_PP_MODE: the register ping-pong
# arming every public emitter writes for the DPU-side blocks (the kernel writes the
# CNA/CORE ones); Mesa rkt_regcmd.c, rocket-userspace gen_matmul_task.
S_POINTER_FIELDS = dict(POINTER_PP_MODE=1, EXECUTER_PP_EN=1, POINTER_PP_EN=1)


class RegisterFile:
    """Register values of one task. Unset registers of an order are written as 0."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.addresses: dict[str, tuple[str, int]] = {}
        self.lut_tables: tuple[np.ndarray, np.ndarray] | None = None

    def set(self, name: str, value: int | None = None, /, **fields: int) -> None:
        """Set a register from named fields (checked) or a raw 32-bit value."""
        reg = register(name)
        if reg.is_address:
            raise RegisterError(f"{name} is an address register: use .address()")
        word = reg.pack(fields) if value is None else int(value)
        if not 0 <= word <= 0xFFFFFFFF:
            raise RegisterError(f"{name}={word:#x} does not fit 32 bits")
        self.values[name] = word

    def get(self, name: str) -> int:
        return self.values.get(name, 0)

    def field(self, name: str, field: str) -> int:
        return register(name).field(field).extract(self.get(name))

    def address(self, name: str, buffer: str, offset: int = 0) -> None:
        if not register(name).is_address:
            raise RegisterError(f"{name} is not an address register")
        if offset < 0 or offset >= 1 << 32:
            raise RegisterError(f"{name}: offset {offset} outside the 32-bit address space")
        self.addresses[name] = (buffer, int(offset))

    def write(self, builder: RegcmdBuilder, order: Sequence[str]) -> None:
        """Append the registers of `order` to `builder` (addresses as relocations;
        the LUT access pair expands to the two 513-entry table uploads)."""
        for name in order:
            if name == "DPU_LUT_ACCESS_CFG" and self.lut_tables is not None:
                self._write_lut_tables(builder)
                continue
            if name == "DPU_LUT_ACCESS_DATA" and self.lut_tables is not None:
                continue
            if name in self.addresses:
                builder.address(name, *self.addresses[name])
            else:
                builder.write(name, self.values.get(name, 0))

    def _write_lut_tables(self, builder: RegcmdBuilder) -> None:
        # LUT_ACCESS_CFG selects a table for writing (ACCESS_TYPE=1) at address 0;
        # each LUT_ACCESS_DATA write stores one entry and moves to the next
        # (NVDLA SDP LUT port; rocket-userspace emit_lut_tables).
        for table_id, table in enumerate(self.lut_tables):
            builder.write("DPU_LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table_id, LUT_ADDR=0)
            for v in table:
                builder.write("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(v))


def build(regs: RegisterFile, order: Iterable[str], blocks) -> RegcmdBuilder:
    """A builder holding `regs` in `order` followed by the 4-entry tail."""
    b = RegcmdBuilder()
    regs.write(b, tuple(order))
    b.finish(blocks)
    return b


def unlinked_pc_base_entry() -> int:
    """A tail's first slot written as PC_BASE_ADDRESS = 0 (Mesa's form for the tasks of
    a multi-task operation before linking) instead of a zero entry."""
    return write_entry("PC_BASE_ADDRESS", 0)
