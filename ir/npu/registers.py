"""Typed view of the register table: blocks, registers, bit fields, and packing.

A register value is built from named fields (`Register.pack`) and taken apart
again (`Register.unpack`). Packing refuses a value that does not fit its field:
the emitter must never truncate silently (Mesa's helpers mask; rkc checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Mapping

from rkc.ir.errors import RegisterError
from rkc.ir.npu.register_table import TABLE


class Block(IntEnum):
    """Hardware block ids (registers.xml `enum target`). A regcmd register write
    carries ``id + 1`` in its top 16 bits (the low bit's meaning is unknown;
    every emitter sets it)."""

    PC = 0x0100
    CNA = 0x0200
    CORE = 0x0800
    DPU = 0x1000
    DPU_RDMA = 0x2000
    PPU = 0x4000
    PPU_RDMA = 0x8000

    @property
    def target(self) -> int:
        return int(self) + 1

    @property
    def base(self) -> int:
        """Core-relative offset of the block's register window."""
        return _BLOCK_BASE[self]


_BLOCK_BASE = {
    Block.PC: 0x0000,
    Block.CNA: 0x1000,
    Block.CORE: 0x3000,
    Block.DPU: 0x4000,
    Block.DPU_RDMA: 0x5000,
    Block.PPU: 0x6000,
    Block.PPU_RDMA: 0x7000,
}

# Bit layout of the operation-enable word (target 0x0081, GLOBAL OPERATION_ENABLE
# layout in registers.xml): which blocks a task starts.
OP_ENABLE_BITS: Mapping[Block, int] = {
    Block.CNA: 1 << 0,
    Block.CORE: 1 << 2,
    Block.DPU: 1 << 3,
    Block.DPU_RDMA: 1 << 4,
    Block.PPU: 1 << 5,
    Block.PPU_RDMA: 1 << 6,
}
OP_ENABLE_MASK = 0x7F


@dataclass(frozen=True)
class Field:
    name: str
    lo: int
    hi: int

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    @property
    def mask(self) -> int:
        return ((1 << self.width) - 1) << self.lo

    def extract(self, value: int) -> int:
        return (value >> self.lo) & ((1 << self.width) - 1)


@dataclass(frozen=True)
class Register:
    block: Block
    offset: int
    name: str
    fields: tuple[Field, ...]
    is_address: bool = False

    @cached_property
    def field_map(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields}

    @cached_property
    def reserved_mask(self) -> int:
        used = 0
        for f in self.fields:
            used |= f.mask
        return 0xFFFFFFFF & ~used

    def field(self, name: str) -> Field:
        try:
            return self.field_map[name]
        except KeyError:
            raise RegisterError(
                f"{self.name} has no field {name!r} (fields: {', '.join(self.field_map)})"
            ) from None

    def pack(self, fields: Mapping[str, int] | None = None, /, **kw: int) -> int:
        """Pack named field values into a 32-bit register value.

        Negative values are accepted for a field only if they fit it as two's
        complement (e.g. a signed offset); anything wider raises."""
        values = dict(fields or {}, **kw)
        word = 0
        for name, v in values.items():
            f = self.field(name)
            v = int(v)
            if v < 0:
                if v < -(1 << (f.width - 1)):
                    raise RegisterError(f"{self.name}.{name}={v} does not fit {f.width} bits")
                v &= (1 << f.width) - 1
            elif v >> f.width:
                raise RegisterError(f"{self.name}.{name}={v:#x} does not fit {f.width} bits")
            word |= v << f.lo
        return word

    def unpack(self, value: int) -> dict[str, int]:
        return {f.name: f.extract(value) for f in self.fields}


def _parse_table(text: str) -> tuple[Register, ...]:
    regs = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        block, offset, name, flag, *specs = line.split()
        fields = []
        for spec in specs:
            fname, bits = spec.split(":")
            hi, _, lo = bits.partition("-")
            fields.append(Field(fname, int(lo or hi), int(hi)))
        regs.append(Register(Block[block], int(offset, 16), name, tuple(fields), flag == "addr"))
    return tuple(regs)


REGISTERS: tuple[Register, ...] = _parse_table(TABLE)
BY_OFFSET: Mapping[int, Register] = {r.offset: r for r in REGISTERS}
BY_NAME: Mapping[str, Register] = {r.name: r for r in REGISTERS}


def register(name_or_offset: str | int) -> Register:
    """Look a register up by full name (``CNA_CBUF_CON0``) or offset (0x1040)."""
    table = BY_OFFSET if isinstance(name_or_offset, int) else BY_NAME
    try:
        return table[name_or_offset]
    except KeyError:
        what = f"{name_or_offset:#06x}" if isinstance(name_or_offset, int) else repr(name_or_offset)
        raise RegisterError(f"unknown NPU register {what}") from None


def block_of_offset(offset: int) -> Block | None:
    """The block whose register window holds `offset` (None if none does)."""
    for block, base in _BLOCK_BASE.items():
        if base <= offset < base + 0x1000:
            return block
    return None
