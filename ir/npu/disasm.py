"""Human-readable disassembly of regcmd entries: one line per entry."""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from rkc.ir.npu.regcmd import Decoded, EntryKind, decode


def _field_text(d: Decoded, all_fields: bool) -> str:
    if d.kind is EntryKind.OP_ENABLE:
        return " ".join(d.fields) or "(no block)"
    if d.register is None:
        return ""
    parts = []
    for f in d.register.fields:
        v = d.fields[f.name]
        if v or all_fields:
            parts.append(f"{f.name}={v:#x}" if f.width >= 20 else f"{f.name}={v}")
    return " ".join(parts)


def format_entry(d: Decoded, all_fields: bool = False) -> str:
    block = d.block.name if d.block is not None else {
        EntryKind.MARKER: "-", EntryKind.OP_ENABLE: "PC", EntryKind.NOP: "-",
    }.get(d.kind, "?")
    line = f"{d.index:5d}  {d.raw:016x}  {block:<8} {d.name:<32} {d.value:#010x}  {_field_text(d, all_fields)}"
    if d.problems:
        line += "  !! " + "; ".join(d.problems)
    return line.rstrip()


def disassemble(entries: Iterable[int] | np.ndarray, all_fields: bool = False) -> Iterator[str]:
    for d in decode(entries):
        yield format_entry(d, all_fields)
