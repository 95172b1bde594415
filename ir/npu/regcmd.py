"""The 64-bit regcmd entry codec, a builder for task programs, and a decoder.

Entry format (rocket driver + Mesa, docs/hardware-facts.md §2):
``target << 48 | value << 16 | offset``, little-endian in memory. `target` is
``block id + 1`` for a register write, 0x0041 for the marker the TRM requires
before the operation-enable word, and 0x0081 for the operation-enable word
itself (offset 0x0008, value = block mask). An all-zero entry is a no-op slot.

Every task ends with a 4-entry tail: next-task address (PC_BASE_ADDRESS),
next-task fetch amount (PC_REGISTER_AMOUNTS), the 0x0041 marker and the
operation-enable word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping

import numpy as np

from rkc.ir.errors import RegisterError
from rkc.ir.npu.registers import (
    BY_OFFSET,
    OP_ENABLE_BITS,
    OP_ENABLE_MASK,
    Block,
    Register,
    block_of_offset,
    register,
)

TARGET_MARKER = 0x0041  # "must precede op-enable" (TRM, quoted by Mesa)
TARGET_OP_ENABLE = 0x0081
OP_ENABLE_OFFSET = 0x0008
TAIL_ENTRIES = 4
ENTRY_BYTES = 8
# The PC fetches regcmd in 128-bit units (two entries); PC_DATA_AMOUNT is 16 bits.
PC_FETCH_ENTRIES = 2
PC_AMOUNT_MAX = 0xFFFF


def encode(target: int, offset: int, value: int) -> int:
    if not 0 <= target <= 0xFFFF:
        raise RegisterError(f"regcmd target {target:#x} does not fit 16 bits")
    if not 0 <= offset <= 0xFFFF:
        raise RegisterError(f"regcmd offset {offset:#x} does not fit 16 bits")
    if not 0 <= value <= 0xFFFFFFFF:
        raise RegisterError(f"regcmd value {value:#x} does not fit 32 bits")
    return (target << 48) | (value << 16) | offset


def split(entry: int) -> tuple[int, int, int]:
    """-> (target, offset, value)"""
    entry = int(entry)
    return (entry >> 48) & 0xFFFF, entry & 0xFFFF, (entry >> 16) & 0xFFFFFFFF


def write_entry(reg: Register | str, value: int) -> int:
    reg = register(reg) if isinstance(reg, str) else reg
    return encode(reg.block.target, reg.offset, value)


def op_enable_value(blocks: Iterable[Block]) -> int:
    value = 0
    for b in blocks:
        if b in OP_ENABLE_BITS:
            value |= OP_ENABLE_BITS[b]
    return value


def pc_amount_for(entry_count: int) -> int:
    """PC_REGISTER_AMOUNTS value the kernel programs for a task of `entry_count`
    entries, tail included: 128-bit fetch units minus one (rocket_job.c)."""
    units = (entry_count + PC_FETCH_ENTRIES - 1) // PC_FETCH_ENTRIES
    if not 1 <= units <= PC_AMOUNT_MAX + 1:
        raise RegisterError(f"task of {entry_count} entries does not fit the 16-bit PC amount")
    return units - 1


class EntryKind(Enum):
    WRITE = "write"
    NOP = "nop"
    MARKER = "marker"
    OP_ENABLE = "op_enable"
    UNKNOWN_TARGET = "unknown_target"
    UNKNOWN_REGISTER = "unknown_register"


@dataclass(frozen=True)
class Decoded:
    """One regcmd entry taken apart."""

    index: int
    raw: int
    kind: EntryKind
    target: int
    offset: int
    value: int
    block: Block | None = None
    register: Register | None = None
    fields: Mapping[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.register is not None:
            return self.register.name
        return {
            EntryKind.NOP: "(zero)",
            EntryKind.MARKER: "MARKER_0x0041",
            EntryKind.OP_ENABLE: "OPERATION_ENABLE",
        }.get(self.kind, f"UNKNOWN_{self.offset:#06x}")


def decode_entry(entry: int, index: int = 0) -> Decoded:
    target, offset, value = split(entry)
    if entry == 0:
        return Decoded(index, 0, EntryKind.NOP, 0, 0, 0)
    if target == TARGET_MARKER:
        problems = () if (offset, value) == (0, 0) else ("marker entry carries data",)
        return Decoded(index, entry, EntryKind.MARKER, target, offset, value, problems=problems)
    if target == TARGET_OP_ENABLE:
        problems = []
        if offset != OP_ENABLE_OFFSET:
            problems.append(f"op-enable at offset {offset:#06x}, expected 0x0008")
        if value & ~OP_ENABLE_MASK:
            problems.append(f"op-enable sets undefined bits {value & ~OP_ENABLE_MASK:#x}")
        fields = {b.name: 1 for b, bit in OP_ENABLE_BITS.items() if value & bit}
        return Decoded(index, entry, EntryKind.OP_ENABLE, target, offset, value,
                       fields=fields, problems=tuple(problems))
    try:
        block = Block(target - 1) if target & 1 else None
    except ValueError:
        block = None
    if block is None:
        return Decoded(index, entry, EntryKind.UNKNOWN_TARGET, target, offset, value,
                       problems=(f"unknown target {target:#06x}",))
    reg = BY_OFFSET.get(offset)
    if reg is None:
        return Decoded(index, entry, EntryKind.UNKNOWN_REGISTER, target, offset, value, block,
                       problems=(f"no register at {offset:#06x}",))
    problems = []
    if reg.block is not block:
        problems.append(f"{reg.name} belongs to {reg.block.name}, written with target {target:#06x}")
    if value & reg.reserved_mask:
        problems.append(f"reserved bits {value & reg.reserved_mask:#x} set")
    return Decoded(index, entry, EntryKind.WRITE, target, offset, value, block, reg,
                   reg.unpack(value), tuple(problems))


def decode(entries: Iterable[int] | np.ndarray) -> list[Decoded]:
    return [decode_entry(int(e), i) for i, e in enumerate(entries)]


def block_for_offset(offset: int) -> Block | None:
    return block_of_offset(offset)


class RegcmdBuilder:
    """Accumulates one task's register writes by name and field.

    ``b.write("CNA_CBUF_CON0", DATA_BANK=1, WEIGHT_BANK=11)`` packs the fields
    (raising if one does not fit) and appends the entry. ``b.address(...)``
    writes an address register as 0 and records where a relocation must land.
    ``b.finish(op_enable)`` appends the 4-entry tail.
    """

    def __init__(self) -> None:
        self.entries: list[int] = []
        self.relocations: list[tuple[int, object, int]] = []

    def write(self, name: str, value: int | None = None, /, **fields: int) -> int:
        reg = register(name)
        if value is not None and fields:
            raise RegisterError(f"{name}: give a raw value or fields, not both")
        word = reg.pack(fields) if value is None else int(value)
        if not 0 <= word <= 0xFFFFFFFF:
            raise RegisterError(f"{name}={word:#x} does not fit 32 bits")
        self.entries.append(write_entry(reg, word))
        return len(self.entries) - 1

    def address(self, name: str, target: object, offset: int = 0) -> int:
        """Write an address register whose value is filled by relocation
        (`target` names the buffer; the final value is base(target) + offset)."""
        reg = register(name)
        if not reg.is_address:
            raise RegisterError(f"{name} is not an address register")
        index = self.write(name, 0)
        self.relocations.append((index, target, offset))
        return index

    def nop(self) -> int:
        self.entries.append(0)
        return len(self.entries) - 1

    def finish(self, enable: Iterable[Block] | int) -> int:
        """Append the tail; returns the index of its PC_BASE_ADDRESS slot.

        The link slots start as "end of chain" (a zero entry and amount 0);
        `link_tail` turns them into a link to a following task."""
        value = enable if isinstance(enable, int) else op_enable_value(enable)
        start = self.nop()
        self.write("PC_REGISTER_AMOUNTS", 0)
        self.entries.append(encode(TARGET_MARKER, 0, 0))
        self.entries.append(encode(TARGET_OP_ENABLE, OP_ENABLE_OFFSET, value))
        return start

    def array(self) -> np.ndarray:
        return np.asarray(self.entries, dtype=np.uint64)


def link_amount(next_entry_count: int) -> int:
    """PC_DATA_AMOUNT a tail programs to fetch the next task of a hardware chain:
    like the kernel's kick, 128-bit units minus one, covering the whole task.

    This is the RKNN/vendor rule ceil(body/2) + 1 (hw-matmul.md 3.3). Mesa's
    ALIGN((count - 4) / 2, 2) (rkt_ml.c, see `mesa_link_amount`) agrees for its
    130-entry tasks but fetches short for other counts (e.g. 1099 entries)."""
    return pc_amount_for(next_entry_count)


def mesa_link_amount(next_entry_count: int) -> int:
    """Mesa's in-stream link amount, ALIGN((next_count - 4) / 2, 2) (rkt_ml.c);
    only the Mesa-compatible emitter uses it, to reproduce Mesa byte for byte."""
    body_units = (next_entry_count - TAIL_ENTRIES) // 2
    value = (body_units + 1) & ~1
    if value > PC_AMOUNT_MAX:
        raise RegisterError(f"next task of {next_entry_count} entries does not fit the PC amount")
    return value


def link_tail(entries: np.ndarray, next_iova: int, next_entry_count: int) -> None:
    """Point a task's tail at the next task (in place). `entries` is the task."""
    if next_iova & 0xF:
        raise RegisterError(f"next task address {next_iova:#x} is not 16-byte aligned")
    n = len(entries)
    entries[n - 4] = write_entry("PC_BASE_ADDRESS", next_iova)
    entries[n - 3] = write_entry("PC_REGISTER_AMOUNTS", link_amount(next_entry_count))


def as_entries(raw: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """View little-endian bytes as regcmd entries."""
    if isinstance(raw, np.ndarray) and raw.dtype == np.uint64:
        return raw
    buf = bytes(raw)
    if len(buf) % ENTRY_BYTES:
        raise RegisterError(f"regcmd dump of {len(buf)} bytes is not a whole number of 8-byte entries")
    return np.frombuffer(buf, dtype="<u8")
