"""Per-core register state and the register values a task may use.

The NPU keeps two register groups per block (ping-pong, S_POINTER = 0xE): a
task's writes land in one group while the other may still be executing, and
the op-enable word starts the blocks on the group just written (TRM ch. 36
S_POINTER; gregordinary/rockchip-npu-notes encodings/regcmd-task-model.md).
A register the task did not write therefore holds whatever that group held two
tasks (or two jobs, or two processes) ago.

The simulator makes that failure impossible to miss: it records which
registers each task wrote, and an enabled block that reads a register this
task did not write raises `StaleRegisterError`. Every task must fully program
what its enabled blocks use (which is also what every known-good stream does:
Mesa and rocket-userspace write a full ~126-entry body per task). The values
still persist per core (`RegisterFile.values`) so the model stays faithful to
a register file that is never reset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Callable, Mapping

from rkc.ir.npu.extents import Undecided, Walk
from rkc.ir.npu.regcmd import Decoded, decode_entry
from rkc.ir.npu.registers import BY_NAME, Register
from rkc.runtime.sim.errors import FieldError, StaleRegisterError


@lru_cache(maxsize=1 << 16)
def decode_cached(raw: int) -> Decoded:
    """decode_entry without the index (streams repeat the same words a lot)."""
    return decode_entry(raw, 0)


@lru_cache(maxsize=1 << 14)
def _unpacked(name: str, value: int) -> Mapping[str, int]:
    """A register value split into its fields (tasks repeat the same values)."""
    return MappingProxyType(BY_NAME[name].unpack(value))


@dataclass
class TaskRegisters:
    """The registers one task wrote before its op-enable word, by name."""

    values: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)  # name -> index of the last write

    def record(self, reg: Register, value: int, entry: int) -> None:
        self.values[reg.name] = value
        self.entries[reg.name] = entry

    def written(self, name: str) -> bool:
        return name in self.values

    def value(self, name: str) -> int:
        try:
            return self.values[name]
        except KeyError:
            raise StaleRegisterError(
                "an enabled block uses this register but the task did not write it "
                "(the hardware would use a stale ping-pong group value)", register=name) from None

    def fields(self, name: str) -> Mapping[str, int]:
        return _unpacked(name, self.value(name))

    def field(self, name: str, field_name: str) -> int:
        try:
            return _unpacked(name, self.value(name))[field_name]
        except KeyError:
            BY_NAME[name].field(field_name)  # raises naming the register's fields
            raise

    def signed(self, name: str, field_name: str | None = None) -> int:
        """A field (default: the whole register) read as two's complement."""
        reg = BY_NAME[name]
        if field_name is None:
            value, width = self.value(name), 32
        else:
            f = reg.field(field_name)
            value, width = f.extract(self.value(name)), f.width
        return value - (1 << width) if value >> (width - 1) else value

    def entry(self, name: str) -> int | None:
        return self.entries.get(name)

    def error(self, cls, what: str, name: str):
        """An error of `cls` located at the last write of register `name`."""
        return cls(what, register=name, entry=self.entries.get(name))

    def walk(self, extent: Callable[["TaskRegisters"], Walk | None]) -> Walk | None:
        """What one DMA of this task covers (ir/npu/extents.py, the function the
        load-time proof uses); a geometry field without a known meaning is a FieldError."""
        try:
            return extent(self)
        except Undecided as exc:
            raise self.error(FieldError, str(exc), exc.register) from None

    def require(self, name: str, field_name: str, allowed, meaning: str = "") -> int:
        """A field value that must be one of `allowed` (FieldError otherwise)."""
        v = self.field(name, field_name)
        if v not in allowed:
            extra = f" ({meaning})" if meaning else ""
            raise self.error(FieldError, f"{field_name}={v} is not one of {sorted(allowed)}{extra}", name)
        return v


class RegisterFile:
    """One core's register values, persisting across tasks, kicks and jobs."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def write(self, reg: Register, value: int) -> None:
        self.values[reg.name] = value
