"""Check a job in userspace before SUBMIT.

The rocket kernel drops an invalid job silently (SUBMIT still returns 0), and it
never looks inside a regcmd: a task that points the NPU at an address outside
every BO faults in the IOMMU, and a task without a DPU write-back never raises
the interrupt the kernel waits for, so the core is reset after 500 ms
(docs/hw-rocket-and-mesa.md §1.3-1.4). Everything either would catch too late
is refused here, with the job's label and the task in the message:

* the job has tasks and at least one output BO; every listed BO is live;
* each task's regcmd is 16-byte aligned (the low PC_BASE_ADDRESS bits are not
  address bits), its entry count fits the 16-bit PC amount, and the whole
  fetch (the PC reads whole 128-bit units) lies inside one live BO;
* decoded with ir/npu/regcmd.py's entry format: every entry has a known target,
  the task ends with the tail marker and an operation-enable word that starts
  the DPU, and every non-zero address field points into a live BO;
* for a chained submission, each tail links to the next task of the job.

Decoding is vectorised with numpy: a model's regcmd is validated on every
submit, so it must cost microseconds, not a Python loop per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from ir.npu import regcmd
from ir.npu.registers import OP_ENABLE_BITS, REGISTERS, Block, register
from runtime.device import BufferObject, Job, Task
from runtime.rocket.errors import JobRejected

_KNOWN_TARGETS = np.array(sorted({0, regcmd.TARGET_MARKER, regcmd.TARGET_OP_ENABLE}
                                 | {b.target for b in Block}), dtype=np.uint64)
_DPU_BIT = OP_ENABLE_BITS[Block.DPU]


@dataclass(frozen=True)
class _AddressRegister:
    name: str
    target: int
    offset: int
    mask: int  # the address bits of the value (e.g. 31-4 for PC_BASE_ADDRESS)


def _address_registers() -> tuple[_AddressRegister, ...]:
    regs = []
    for r in REGISTERS:
        if r.is_address:
            widest = max(r.fields, key=lambda f: f.width)
            regs.append(_AddressRegister(r.name, r.block.target, r.offset, widest.mask))
    return tuple(regs)


ADDRESS_REGISTERS = _address_registers()
_PC_BASE = register("PC_BASE_ADDRESS")


class AddressMap:
    """IOVA ranges of the live BOs, sorted, for vectorised lookups."""

    def __init__(self, bos: Iterable[BufferObject]) -> None:
        ordered = sorted(bos, key=lambda b: b.iova)
        self.bos = ordered
        self.starts = np.array([b.iova for b in ordered], dtype=np.int64)
        self.ends = np.array([b.iova + b.size for b in ordered], dtype=np.int64)

    def _index(self, addresses: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.starts, addresses, side="right") - 1
        inside = (idx >= 0) & (addresses < self.ends[np.maximum(idx, 0)]) if len(self.bos) else idx < -1
        return np.where(inside, idx, -1)

    def inside(self, addresses: np.ndarray) -> np.ndarray:
        return self._index(np.asarray(addresses, dtype=np.int64)) >= 0

    def bo_holding(self, start: int, length: int) -> BufferObject | None:
        """The BO that holds all of [start, start + length), or None."""
        (i,) = self._index(np.array([start], dtype=np.int64))
        if i < 0:
            return None
        bo = self.bos[i]
        return bo if start + length <= bo.iova + bo.size else None


def fetch_entries(count: int) -> int:
    """Entries the PC reads for a task of `count` entries: whole 128-bit units."""
    return count + (count & 1)


def job_name(job: Job, index: int) -> str:
    return job.label or f"job {index}"


def check_job(job: Job, index: int, addresses: AddressMap, is_live: Callable[[BufferObject], bool],
              chained: bool) -> None:
    """Raise JobRejected if the NPU or the kernel would not run `job` as meant."""
    name = job_name(job, index)
    if not job.tasks:
        raise JobRejected(f"{name}: has no tasks (the kernel would drop it)")
    if not job.out_bos:
        raise JobRejected(f"{name}: lists no output BO, so nothing orders it or waits for it")
    for kind, bos in (("input", job.in_bos), ("output", job.out_bos)):
        for bo in bos:
            if not is_live(bo):
                raise JobRejected(f"{name}: {kind} {bo!r} is not a live BO of this device")
    for t, task in enumerate(job.tasks):
        entries = _task_entries(name, t, task, addresses)
        _check_entries(name, t, entries, addresses)
    if chained:
        _check_links(name, job.tasks, addresses)


def _task_entries(name: str, t: int, task: Task, addresses: AddressMap) -> np.ndarray:
    where = f"{name}: task {t}"
    if task.regcmd_iova & 0xF:
        raise JobRejected(f"{where}: regcmd at {task.regcmd_iova:#x} is not 16-byte aligned")
    if task.regcmd_count < regcmd.TAIL_ENTRIES:
        raise JobRejected(f"{where}: {task.regcmd_count} regcmd entries, fewer than the "
                          f"{regcmd.TAIL_ENTRIES}-entry tail")
    try:
        regcmd.pc_amount_for(task.regcmd_count)
    except Exception:
        raise JobRejected(f"{where}: {task.regcmd_count} entries do not fit the 16-bit PC amount") from None
    nbytes = fetch_entries(task.regcmd_count) * regcmd.ENTRY_BYTES
    bo = addresses.bo_holding(task.regcmd_iova, nbytes)
    if bo is None:
        raise JobRejected(f"{where}: regcmd [{task.regcmd_iova:#x}, +{nbytes:#x}) is not inside one live BO")
    offset = task.regcmd_iova - bo.iova
    return np.frombuffer(bo.host, dtype="<u8", count=task.regcmd_count, offset=offset)


def _check_entries(name: str, t: int, entries: np.ndarray, addresses: AddressMap) -> None:
    where = f"{name}: task {t}"
    targets = entries >> np.uint64(48)
    offsets = entries & np.uint64(0xFFFF)
    values = (entries >> np.uint64(16)) & np.uint64(0xFFFFFFFF)

    unknown = ~np.isin(targets, _KNOWN_TARGETS)
    if unknown.any():
        i = int(np.argmax(unknown))
        raise JobRejected(f"{where}: entry {i} ({int(entries[i]):#018x}) has unknown target {int(targets[i]):#06x}")

    marker, enable = regcmd.decode_entry(int(entries[-2])), regcmd.decode_entry(int(entries[-1]))
    if marker.kind is not regcmd.EntryKind.MARKER or enable.kind is not regcmd.EntryKind.OP_ENABLE:
        raise JobRejected(f"{where}: does not end with the tail marker and operation-enable entry")
    if not enable.value & _DPU_BIT:
        raise JobRejected(f"{where}: operation-enable {enable.value:#x} does not start the DPU; the kernel "
                          f"waits for the DPU interrupt, so the job would time out")

    for reg in ADDRESS_REGISTERS:
        hit = (targets == np.uint64(reg.target)) & (offsets == np.uint64(reg.offset))
        if not hit.any():
            continue
        addrs = (values[hit] & np.uint64(reg.mask)).astype(np.int64)
        used = addrs != 0  # 0 = not programmed; no live BO sits at IOVA 0 (the device's guard page does)
        bad = used & ~addresses.inside(addrs)
        if bad.any():
            i = int(np.flatnonzero(hit)[int(np.argmax(bad))])
            raise JobRejected(f"{where}: entry {i} {reg.name}={int(addrs[np.argmax(bad)]):#x} points outside "
                              f"every live BO (the NPU would fault)")


def _check_links(name: str, tasks: Sequence[Task], addresses: AddressMap) -> None:
    for t in range(len(tasks) - 1):
        nxt = tasks[t + 1]
        bo = addresses.bo_holding(tasks[t].regcmd_iova, tasks[t].regcmd_count * regcmd.ENTRY_BYTES)
        entries = np.frombuffer(bo.host, dtype="<u8", count=tasks[t].regcmd_count,
                                offset=tasks[t].regcmd_iova - bo.iova)
        want_base = regcmd.write_entry(_PC_BASE, nxt.regcmd_iova)
        want_amount = regcmd.write_entry("PC_REGISTER_AMOUNTS", regcmd.link_amount(nxt.regcmd_count))
        if int(entries[-4]) != want_base or int(entries[-3]) != want_amount:
            raise JobRejected(f"{name}: task {t}: tail does not link to task {t + 1} at {nxt.regcmd_iova:#x} "
                              f"({nxt.regcmd_count} entries), so a chained kick would run the wrong program")
