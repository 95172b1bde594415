"""What runs a kick inside the emulated kernel: the NPU side of the emulation.

The emulated kernel programs a kick the way rocket_job_hw_submit does (first
task's regcmd address, PC amount, TASK_NUMBER) and hands it to `run_kick`, which
models the program counter: it fetches each task's regcmd through the job's
IOMMU domain (whole 128-bit units), follows the tail link to the next task when
TASK_NUMBER asks for more than one, and passes every task to an executor.

Executors see NPU memory only through `NpuMemory`, i.e. through the IOVAs of the
job's file; an address no BO maps there is an IOMMU fault, as on the board.

* `TraceExecutor` checks what the hardware needs to even start a task (every
  address field mapped, operation-enable present and starting the DPU) and
  records the tasks; it computes nothing.
* `SimExecutor` (runtime/rocket/sim_executor.py, once the simulator exists)
  computes the task with runtime.sim.

Both raise `NpuHang` or `IommuFault` for what would hang the board; the kernel
turns that into a job timeout and a reset, like rocket_job_timedout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rkc.ir.npu import regcmd
from rkc.ir.npu.registers import OP_ENABLE_BITS, Block, register
from rkc.runtime.rocket.validate import ADDRESS_REGISTERS, fetch_entries

PAGE = 4096
_PC_BASE = register("PC_BASE_ADDRESS")
_PC_AMOUNTS = register("PC_REGISTER_AMOUNTS")


class NpuFault(Exception):
    """The job cannot complete on the board: the core hangs or faults, and the
    kernel resets it after its job timeout."""


class IommuFault(NpuFault):
    """The NPU touched an IOVA the job's IOMMU domain does not map."""


class NpuHang(NpuFault):
    """The task would never raise the interrupt the kernel waits for."""


class PageTable(Protocol):
    def lookup(self, page: int) -> tuple[bytearray, int] | None:
        """(backing store, byte offset of the page in it) or None if unmapped."""

    def mappings(self) -> list[tuple[int, int, bytearray]]:
        """Every mapped object: (IOVA, mapped bytes, backing store)."""


class NpuMemory:
    """Byte access to NPU memory through one IOMMU domain."""

    def __init__(self, table: PageTable) -> None:
        self.table = table

    def _page(self, iova: int) -> tuple[bytearray, int]:
        hit = self.table.lookup(iova // PAGE)
        if hit is None:
            raise IommuFault(f"IOMMU fault at IOVA {iova:#x}")
        store, base = hit
        return store, base + iova % PAGE

    def mapped(self, iova: int) -> bool:
        return self.table.lookup(iova // PAGE) is not None

    def read(self, iova: int, n: int) -> bytes:
        out = bytearray()
        while n > 0:
            store, off = self._page(iova)
            take = min(n, PAGE - iova % PAGE)
            out += store[off: off + take]
            iova, n = iova + take, n - take
        return bytes(out)

    def write(self, iova: int, data: bytes) -> None:
        data = memoryview(bytes(data))
        while len(data):
            store, off = self._page(iova)
            take = min(len(data), PAGE - iova % PAGE)
            store[off: off + take] = data[:take]
            iova, data = iova + take, data[take:]


class Executor(Protocol):
    """Task level: what one task does, given the PC model of `PcModel`."""

    def run_task(self, memory: NpuMemory, iova: int, entries: np.ndarray,
                 irq_blocks: tuple[str, ...] = ("DPU",)) -> None:
        """Execute one task's regcmd (as fetched) against `memory`; the kernel
        completes it on the interrupt of one of `irq_blocks`."""


class NpuModel(Protocol):
    """Job level: what the emulated kernel hands a job to."""

    def run_job(self, table: PageTable, core: int, tasks: list[tuple[int, int]], kicks: list[int],
                label: str, irq_blocks: tuple[str, ...] | None = None) -> None:
        """Run `tasks` [(regcmd IOVA, entries)] on `core` as kicks of `kicks[i]`
        tasks each, through the IOMMU domain `table`; a kick ends on the
        interrupt of one of `irq_blocks` (None: the stock kernel's, the DPU's); raise
        NpuFault if the board would hang or fault."""


class PcModel:
    """An NpuModel from a task-level executor and `run_kick`'s PC model."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def run_job(self, table: PageTable, core: int, tasks: list[tuple[int, int]], kicks: list[int],
                label: str, irq_blocks: tuple[str, ...] | None = None) -> None:
        memory = NpuMemory(table)
        first = 0
        for number in kicks:
            iova, count = tasks[first]
            run_kick(self.executor, memory, iova, count, number, irq_blocks or ("DPU",))
            first += number


@dataclass
class TaskRecord:
    iova: int
    entries: np.ndarray


@dataclass
class TraceExecutor:
    """Checks that a task could start, records it, computes nothing."""

    tasks: list[TaskRecord] = field(default_factory=list)

    def run_task(self, memory: NpuMemory, iova: int, entries: np.ndarray,
                 irq_blocks: tuple[str, ...] = ("DPU",)) -> None:
        check_startable(memory, entries, irq_blocks)
        self.tasks.append(TaskRecord(iova, entries.copy()))


def check_startable(memory: NpuMemory, entries: np.ndarray, irq_blocks: tuple[str, ...] = ("DPU",)) -> None:
    """What the board needs to run a task to an interrupt the kernel waits for
    (stock rocket: the DPU's; with kernel/ patch 0005 the job's irq_mask)."""
    nonzero = np.flatnonzero(entries)
    last = regcmd.decode_entry(int(entries[nonzero[-1]])) if len(nonzero) else None
    if last is None or last.kind is not regcmd.EntryKind.OP_ENABLE:
        raise NpuHang("task has no operation-enable entry, nothing starts")
    if not any(last.value & OP_ENABLE_BITS[Block[b]] for b in irq_blocks):
        raise NpuHang(f"operation-enable {last.value:#x} does not start the {' or '.join(irq_blocks)}, "
                      f"no interrupt the kernel waits for")
    targets = entries >> np.uint64(48)
    offsets = entries & np.uint64(0xFFFF)
    values = (entries >> np.uint64(16)) & np.uint64(0xFFFFFFFF)
    for reg in ADDRESS_REGISTERS:
        hit = (targets == np.uint64(reg.target)) & (offsets == np.uint64(reg.offset))
        for value in (values[hit] & np.uint64(reg.mask)):
            if int(value) and not memory.mapped(int(value)):
                raise IommuFault(f"{reg.name}={int(value):#x} is not mapped in this file's IOMMU domain")


def run_kick(executor: Executor, memory: NpuMemory, iova: int, count: int, task_number: int,
             irq_blocks: tuple[str, ...] = ("DPU",)) -> int:
    """Model the PC for one kick; returns the number of tasks run.

    The kernel programs PC_REGISTER_AMOUNTS = (count + 1) / 2 - 1, so the PC
    fetches whole 128-bit units. With TASK_NUMBER > 1 each tail's
    PC_BASE_ADDRESS / PC_REGISTER_AMOUNTS pair (amount + 1 units) gives the
    next task; a tail without a link ends the chain early, so the PC never
    reaches TASK_NUMBER and the interrupt never comes."""
    fetch = fetch_entries(count)
    for k in range(task_number):
        raw = memory.read(iova, fetch * regcmd.ENTRY_BYTES)
        entries = np.frombuffer(raw, dtype="<u8")
        executor.run_task(memory, iova, entries, irq_blocks)
        if k + 1 == task_number:
            break
        iova, fetch = _link(entries)
    return task_number


def _link(entries: np.ndarray) -> tuple[int, int]:
    """Next (IOVA, entries to fetch) from a task's tail: the two entries before
    the marker that precedes the (last) operation-enable word."""
    enables = np.flatnonzero((entries >> np.uint64(48)) == np.uint64(regcmd.TARGET_OP_ENABLE))
    if not len(enables) or enables[-1] < 3:
        raise NpuHang("chained kick: a task has no tail, the PC stops before TASK_NUMBER")
    end = int(enables[-1])
    base = regcmd.decode_entry(int(entries[end - 3]))
    amount = regcmd.decode_entry(int(entries[end - 2]))
    if base.register is not _PC_BASE or amount.register is not _PC_AMOUNTS or not base.value:
        raise NpuHang("chained kick: a tail does not link to a next task, the PC stops before TASK_NUMBER")
    return base.value & ~0xF, (amount.value + 1) * 2
