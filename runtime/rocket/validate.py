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
  the DPU (or the PPU, on a kernel with kernel/patches/0005's interrupt
  mask), and every non-zero address field points into a live BO;
* for a chained submission, each tail links to the next task of the job.

Decoding is vectorised with numpy: a model's regcmd is validated on every
submit, so it must cost microseconds, not a Python loop per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from rkc.ir.npu import regcmd
from rkc.ir.npu.registers import OP_ENABLE_BITS, REGISTERS, Block, register
from rkc.runtime.device import BufferObject, Job, Task
from rkc.runtime.rocket.errors import JobRejected

_KNOWN_TARGETS = np.array(sorted({0, regcmd.TARGET_MARKER, regcmd.TARGET_OP_ENABLE}
                                 | {b.target for b in Block}), dtype=np.uint64)
_DPU_BIT = OP_ENABLE_BITS[Block.DPU]
# op-enable bits of the blocks whose interrupt ends a task: stock rocket, or with kernel/patches/0005
_COMPLETING_BITS = {False: _DPU_BIT, True: _DPU_BIT | OP_ENABLE_BITS[Block.PPU]}


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


class TaskCache:
    """Tasks already validated, keyed by (regcmd IOVA, entry count) and the
    write generation of the BO holding the regcmd. The device bumps a BO's
    generation at finish_cpu_access (the only way new CPU writes reach the NPU)
    and clears the cache when a BO is freed (an address may now dangle); so a
    model's regcmd is decoded once, not at every submit."""

    def __init__(self) -> None:
        self._valid: dict[tuple[int, int], tuple[int, int]] = {}
        self.generation: dict[int, int] = {}  # BO handle -> writes handed to the NPU

    def wrote(self, bo: BufferObject) -> None:
        self.generation[bo.handle] = self.generation.get(bo.handle, 0) + 1

    def freed(self, bo: BufferObject) -> None:
        self.generation.pop(bo.handle, None)
        self._valid.clear()

    def _key(self, task: Task, bo: BufferObject) -> tuple[tuple[int, int], tuple[int, int]]:
        return (task.regcmd_iova, task.regcmd_count), (bo.handle, self.generation.get(bo.handle, 0))

    def known(self, task: Task, bo: BufferObject) -> bool:
        key, stamp = self._key(task, bo)
        return self._valid.get(key) == stamp

    def add(self, task: Task, bo: BufferObject) -> None:
        key, stamp = self._key(task, bo)
        self._valid[key] = stamp


def check_jobs(jobs: Sequence[Job], addresses: AddressMap, is_live: Callable[[BufferObject], bool],
               chained: bool, cache: TaskCache | None = None, ppu_completes: bool = False) -> None:
    """Raise JobRejected (naming the job and task) if the NPU or the kernel
    would not run every job of `jobs` as meant. `ppu_completes`: the kernel
    ends a task on the PPU's interrupt too (kernel/patches/0005's irq_mask)."""
    pending: list[tuple[str, int, Task, BufferObject]] = []
    for i, job in enumerate(jobs):
        name = job_name(job, i)
        if not job.tasks:
            raise JobRejected(f"{name}: has no tasks (the kernel would drop it)")
        if not job.out_bos:
            raise JobRejected(f"{name}: lists no output BO, so nothing orders it or waits for it")
        for kind, bos in (("input", job.in_bos), ("output", job.out_bos)):
            for bo in bos:
                if not is_live(bo):
                    raise JobRejected(f"{name}: {kind} {bo!r} is not a live BO of this device")
    flat = [(job_name(job, i), t, task) for i, job in enumerate(jobs) for t, task in enumerate(job.tasks)]
    for (name, t, task), bo in zip(flat, _task_bos(flat, addresses)):
        if cache is None or not cache.known(task, bo):
            pending.append((name, t, task, bo))
    _check_entries(pending, addresses, _COMPLETING_BITS[ppu_completes])
    if cache is not None:
        for _, _, task, bo in pending:
            cache.add(task, bo)
    if chained:
        for i, job in enumerate(jobs):
            _check_links(job_name(job, i), job.tasks, addresses)


def check_job(job: Job, index: int, addresses: AddressMap, is_live: Callable[[BufferObject], bool],
              chained: bool) -> None:
    """One job, uncached (see check_jobs)."""
    named = Job(job.tasks, job.in_bos, job.out_bos, job.lane, job_name(job, index))
    check_jobs([named], addresses, is_live, chained)


def _task_bos(flat: list[tuple[str, int, Task]], addresses: AddressMap) -> list[BufferObject]:
    """The BO holding each task's regcmd fetch; all tasks at once, the scalar
    check below only runs to word the first failure."""
    iovas = np.array([task.regcmd_iova for _, _, task in flat], dtype=np.int64)
    counts = np.array([task.regcmd_count for _, _, task in flat], dtype=np.int64)
    fetch_end = iovas + (counts + (counts & 1)) * regcmd.ENTRY_BYTES
    idx = addresses._index(iovas)
    safe = np.maximum(idx, 0)
    ok = (iovas & 0xF == 0) & (counts >= regcmd.TAIL_ENTRIES) & (counts <= 2 * (regcmd.PC_AMOUNT_MAX + 1)) & \
        (idx >= 0) & (fetch_end <= (addresses.ends[safe] if len(addresses.bos) else 0))
    if not ok.all():
        name, t, task = flat[int(np.argmax(~ok))]
        _task_bo(name, t, task, addresses)  # raises with the reason
    return [addresses.bos[i] for i in idx.tolist()]


def _task_bo(name: str, t: int, task: Task, addresses: AddressMap) -> BufferObject:
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
    return bo


def _entries(task: Task, bo: BufferObject) -> np.ndarray:
    return np.frombuffer(bo.host, dtype="<u8", count=task.regcmd_count, offset=task.regcmd_iova - bo.iova)


# (target << 16 | offset) of every address register, sorted, with its address bits
_ADDRESS_KEYS = np.array(sorted((r.target << 16) | r.offset for r in ADDRESS_REGISTERS), dtype=np.uint64)
_ADDRESS_MASKS = np.array([next(r.mask for r in ADDRESS_REGISTERS if (r.target << 16) | r.offset == k)
                           for k in _ADDRESS_KEYS.tolist()], dtype=np.uint64)
_ADDRESS_NAMES = [next(r.name for r in ADDRESS_REGISTERS if (r.target << 16) | r.offset == k)
                  for k in _ADDRESS_KEYS.tolist()]


def _check_entries(pending: list[tuple[str, int, Task, BufferObject]], addresses: AddressMap,
                   completing: int = _DPU_BIT) -> None:
    """All tasks of `pending` at once: targets, tails, address fields."""
    if not pending:
        return
    parts = [_entries(task, bo) for _, _, task, bo in pending]
    entries = np.concatenate(parts)
    ends = np.cumsum([len(p) for p in parts])
    starts = ends - np.array([len(p) for p in parts])

    def where(i: int) -> tuple[str, int]:
        k = int(np.searchsorted(ends, i, side="right"))
        name, t, _, _ = pending[k]
        return f"{name}: task {t}", i - int(starts[k])

    targets = entries >> np.uint64(48)
    unknown = ~np.isin(targets, _KNOWN_TARGETS)
    if unknown.any():
        i = int(np.argmax(unknown))
        (w, e) = where(i)
        raise JobRejected(f"{w}: entry {e} ({int(entries[i]):#018x}) has unknown target {int(targets[i]):#06x}")

    last = entries[ends - 1]
    marker = entries[ends - 2]
    tail_ok = ((last >> np.uint64(48)) == np.uint64(regcmd.TARGET_OP_ENABLE)) & \
        ((last & np.uint64(0xFFFF)) == np.uint64(regcmd.OP_ENABLE_OFFSET)) & (marker == _MARKER_ENTRY)
    if not tail_ok.all():
        k = int(np.argmax(~tail_ok))
        raise JobRejected(f"{where(int(starts[k]))[0]}: does not end with the tail marker and operation-enable entry")
    enable = (last >> np.uint64(16)) & np.uint64(0xFFFFFFFF)
    no_end = (enable & np.uint64(completing)) == 0
    if no_end.any():
        k = int(np.argmax(no_end))
        if completing == _DPU_BIT:
            raise JobRejected(f"{where(int(starts[k]))[0]}: operation-enable {int(enable[k]):#x} does not start the "
                              f"DPU; the kernel waits for the DPU interrupt, so the job would time out "
                              f"(kernel/patches/0005 lets PPU tasks complete)")
        raise JobRejected(f"{where(int(starts[k]))[0]}: operation-enable {int(enable[k]):#x} starts neither the "
                          f"DPU nor the PPU, so no interrupt ends the task and the job would time out")

    keys = (targets << np.uint64(16)) | (entries & np.uint64(0xFFFF))
    slot = np.minimum(np.searchsorted(_ADDRESS_KEYS, keys), len(_ADDRESS_KEYS) - 1)
    is_address = _ADDRESS_KEYS[slot] == keys
    if not is_address.any():
        return
    values = ((entries[is_address] >> np.uint64(16)) & _ADDRESS_MASKS[slot[is_address]]).astype(np.int64)
    bad = (values != 0) & ~addresses.inside(values)
    if bad.any():
        j = int(np.argmax(bad))
        i = int(np.flatnonzero(is_address)[j])
        w, e = where(i)
        raise JobRejected(f"{w}: entry {e} {_ADDRESS_NAMES[int(slot[i])]}={int(values[j]):#x} points outside "
                          f"every live BO (the NPU would fault)")


_MARKER_ENTRY = np.uint64(regcmd.encode(regcmd.TARGET_MARKER, 0, 0))


def _check_links(name: str, tasks: Sequence[Task], addresses: AddressMap) -> None:
    for t in range(len(tasks) - 1):
        nxt = tasks[t + 1]
        bo = addresses.bo_holding(tasks[t].regcmd_iova, tasks[t].regcmd_count * regcmd.ENTRY_BYTES)
        entries = _entries(tasks[t], bo)
        want_base = regcmd.write_entry(_PC_BASE, nxt.regcmd_iova)
        want_amount = regcmd.write_entry("PC_REGISTER_AMOUNTS", regcmd.link_amount(nxt.regcmd_count))
        if int(entries[-4]) != want_base or int(entries[-3]) != want_amount:
            raise JobRejected(f"{name}: task {t}: tail does not link to task {t + 1} at {nxt.regcmd_iova:#x} "
                              f"({nxt.regcmd_count} entries), so a chained kick would run the wrong program")
