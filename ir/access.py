"""An rkbin is untrusted input: prove, before any device sees it, that every
address its tasks program comes from a relocation into a region the task's job
lists, in the direction the job allows.

For every task of every NPU step (decoded from the regcmd blob, before the
loader writes any address):

* each address-register entry (ir/npu/addresses.py) either carries a
  relocation or holds 0 and is not one the task's operation-enable surely uses;
  a raw non-zero address is refused (the file never holds one);
* a relocation of a "write" register targets a scratch or io region in the
  job's writes (never weights, regcmd or host); of a "read" register a region
  in the job's reads or writes; of the tail link the task's own regcmd region;
* every relocation patches an address register of some task, once (two
  relocations of one entry: which wins would be the loader's accident);
* a job's reads and writes are exactly what its tasks touch (rocket orders
  jobs by those lists, so a wrong list is a race on the board), it writes no
  weights/regcmd/host region, and its lane names one of the NPU's cores.

* the whole extent of each relocated access lies in the region it targets:
  the walk of ir/npu/extents.py (base plus the sizes and strides programmed in
  the same task; the simulator performs its DMAs through the same functions),
  from the relocation's offset, within the region's declared size; a relocated
  access whose geometry fields hold values without a known meaning, or that a
  task enabling the block leaves unwritten (`extents.Undecided`), is refused,
  since nothing on a board would bound it.

What this cannot see statically, the device sees at run time: whether a stage
reads an operand whose use depends on stage fields (an unrelocated 0 there; the
loader maps a guard BO at IOVA 0 that no job lists, refused by the simulator).
"""

from __future__ import annotations

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.npu import extents
from rkc.ir.npu.addresses import ADDRESS_USE
from rkc.ir.npu.hw import CORES
from rkc.ir.npu.regcmd import ENTRY_BYTES, TARGET_OP_ENABLE
from rkc.ir.npu.registers import OP_ENABLE_BITS, REGISTERS
from rkc.ir.program import Module, Relocation

WRITABLE_KINDS = ("scratch", "io")  # what an NPU write may land in
READABLE_KINDS = ("weights", "scratch", "io")

_BY_KEY = {(r.block.target << 16) | r.offset: r.name for r in REGISTERS if r.is_address}
_KEYS = np.array(sorted(_BY_KEY), dtype=np.uint64)
_NAMES = [_BY_KEY[int(k)] for k in _KEYS]
_EVERY_KEY = {(r.block.target << 16) | r.offset: r.name for r in REGISTERS}


def _regcmd_entries(module: Module, blobs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every regcmd region as 64-bit entries (the blob zero-padded to the region)."""
    out = {}
    for r in module.regions:
        if r.kind == "regcmd":
            data = np.zeros(r.size - r.size % ENTRY_BYTES, np.uint8)
            if r.blob is not None:
                blob = blobs[r.blob][:data.size]
                data[:blob.size] = blob
            out[r.name] = data.view("<u8")
    return out


def _relocation_index(module: Module) -> dict[tuple[str, int], tuple[int, Relocation]]:
    index: dict[tuple[str, int], tuple[int, Relocation]] = {}
    for i, rel in enumerate(module.relocations):
        key = (rel.region, rel.entry)
        if key in index:
            raise FormatError(f"relocations {index[key][0]} and {i} both patch entry {rel.entry} of regcmd "
                              f"region {rel.region!r}")
        index[key] = (i, rel)
    return index


def _enable_bits(entries: np.ndarray) -> int:
    last = int(entries[-1]) if entries.size else 0
    return (last >> 16) & 0xFFFFFFFF if last >> 48 == TARGET_OP_ENABLE else 0


def check_accesses(module: Module, blobs: dict[str, np.ndarray]) -> None:
    """Raise FormatError naming program, step, job, task, entry and register of
    the first address that is not provably the job's own. Module.validate must
    have passed (regions, tasks and relocations in range)."""
    kinds = {r.name: r.kind for r in module.regions}
    sizes = {r.name: r.size for r in module.regions}
    walks = _Walks()
    regcmd = _regcmd_entries(module, blobs)
    keys = {name: ((e >> np.uint64(48)) << np.uint64(16)) | (e & np.uint64(0xFFFF)) for name, e in regcmd.items()}
    relocations = _relocation_index(module)
    used: set[tuple[str, int]] = set()
    for prog in module.programs:
        for step in prog.steps:
            if step.kind != "npu":
                continue
            for j, job in enumerate(step.jobs):
                where = f"program {prog.name!r} step {step.name!r} job {j}"
                if not 0 <= job.lane < CORES:
                    raise FormatError(f"{where}: lane {job.lane} is not one of the NPU's {CORES} cores")
                if not job.writes:
                    raise FormatError(f"{where}: lists no written region (nothing orders it or waits for it)")
                for name in job.writes:
                    if kinds[name] not in WRITABLE_KINDS:
                        raise FormatError(f"{where}: lists {kinds[name]} region {name!r} as written; the NPU "
                                          f"writes only {' or '.join(WRITABLE_KINDS)} regions")
                for name in job.reads:
                    if kinds[name] not in READABLE_KINDS:
                        raise FormatError(f"{where}: lists {kinds[name]} region {name!r} as read")
                reads, writes = set(), set()
                for t, task in enumerate(job.tasks):
                    _check_task(f"{where} task {t}", task, job, kinds, regcmd, keys, relocations, used,
                                reads, writes)
                    _check_extents(f"{where} task {t}", task, sizes, regcmd, keys, relocations, walks)
                for name in job.writes:
                    if name not in writes:
                        raise FormatError(f"{where}: lists region {name!r} as written, but no task writes it")
                for name in job.reads:
                    if name not in reads and name not in writes:
                        raise FormatError(f"{where}: lists region {name!r} as read, but no task touches it")
    for key, (i, rel) in relocations.items():
        if key not in used:
            raise FormatError(f"relocation {i} patches entry {rel.entry} of region {rel.region!r}, which is not "
                              "an address register of any task")


def _task_addresses(task, regcmd, keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the task's entries, indices of its address-register entries, their slots in _KEYS)."""
    span = slice(task.entry, task.entry + task.count)
    task_keys = keys[task.region][span]
    slot = np.minimum(np.searchsorted(_KEYS, task_keys), len(_KEYS) - 1)
    return regcmd[task.region][span], np.flatnonzero(_KEYS[slot] == task_keys), slot


def _check_task(where: str, task, job, kinds, regcmd, keys, relocations, used, reads, writes) -> None:
    entries, hits, slot = _task_addresses(task, regcmd, keys)
    if not hits.size:
        return
    enable = _enable_bits(entries)
    for i in hits.tolist():
        name = _NAMES[int(slot[i])]
        use = ADDRESS_USE[name]
        entry = task.entry + i
        at = f"{where} entry {entry} {name}"
        found = relocations.get((task.region, entry))
        if found is None:
            value = (int(entries[i]) >> 16) & 0xFFFFFFFF
            if value:
                raise FormatError(f"{at}: raw address {value:#x} without a relocation (an rkbin holds none)")
            surely = (use.needed_by is not None and enable & OP_ENABLE_BITS[use.needed_by]
                      and not (use.unless is not None and enable & OP_ENABLE_BITS[use.unless]))
            if surely:
                raise FormatError(f"{at}: unrelocated address (0), but the task's operation-enable "
                                  f"{enable:#x} uses it")
            continue
        used.add((task.region, entry))
        target = found[1].target
        if use.direction == "kernel":
            raise FormatError(f"{at}: the kernel programs this register per kick; a regcmd may not")
        if use.direction == "link":
            if target != task.region:
                raise FormatError(f"{at}: the tail links into region {target!r}, not the task's regcmd "
                                  f"{task.region!r}")
        elif use.direction == "write":
            if kinds[target] not in WRITABLE_KINDS:
                raise FormatError(f"{at}: writes into {kinds[target]} region {target!r}")
            if target not in job.writes:
                raise FormatError(f"{at}: writes region {target!r}, which the job does not list as written")
            writes.add(target)
        else:
            if kinds[target] not in READABLE_KINDS:
                raise FormatError(f"{at}: reads {kinds[target]} region {target!r}")
            if target not in job.reads and target not in job.writes:
                raise FormatError(f"{at}: reads region {target!r}, which the job does not list")
            reads.add(target)


class _Walks:
    """Each task's walks by its registers' values with the addresses left out
    (what a walk depends on): a model repeats the same geometry per layer."""

    def __init__(self) -> None:
        self._seen: dict[bytes, dict[str, extents.Walk | extents.Undecided | None]] = {}

    def of(self, entries: np.ndarray, address_at: np.ndarray,
           enable: int) -> dict[str, extents.Walk | extents.Undecided | None]:
        masked = entries.copy()
        masked[address_at] &= np.uint64(0xFFFF_0000_0000_FFFF)
        key = masked.tobytes()
        found = self._seen.get(key)
        if found is None:
            values = {}
            for raw in masked.tolist():
                name = _EVERY_KEY.get(((raw >> 48) << 16) | (raw & 0xFFFF))
                if name is not None:
                    values[name] = (raw >> 16) & 0xFFFFFFFF  # the last write wins, as on the core
            regs = extents.ProgrammedRegisters(values)
            found = {}
            for name, (block, walk) in extents.WALKS.items():
                if enable & OP_ENABLE_BITS[block]:
                    try:
                        found[name] = walk(regs)
                    except extents.Undecided as why:
                        # a geometry field without a known meaning, or left unwritten by a task that
                        # enables the block (the core would use a stale value): the extent cannot be
                        # bounded, so it is refused; on a board nothing else would stop it
                        found[name] = why
            self._seen[key] = found
        return found


def _check_extents(where: str, task, sizes, regcmd, keys, relocations, walks: _Walks) -> None:
    """Every relocated read or write of the task stays inside its target region
    over the whole walk the task programs (ir/npu/extents.py)."""
    entries, hits, slot = _task_addresses(task, regcmd, keys)
    if not hits.size:
        return
    by_register = walks.of(entries, hits, _enable_bits(entries))
    for i in hits.tolist():
        name = _NAMES[int(slot[i])]
        found = relocations.get((task.region, task.entry + i))
        walk = by_register.get(name)
        if found is None or walk is None:
            continue
        if isinstance(walk, extents.Undecided):
            raise FormatError(f"{where} entry {task.entry + i} {name}: the extent of the access cannot be proven "
                              f"({walk.register} {walk})")
        lo, hi = walk.span()
        if lo == hi:
            continue
        rel = found[1]
        start, end, size = rel.offset + lo, rel.offset + hi, sizes[rel.target]
        if start < 0 or end > size:
            side = f"{-start} bytes before its start" if start < 0 else f"{end - size} bytes past its end"
            raise FormatError(f"{where} entry {task.entry + i} {name}: the access reaches bytes [{start}, {end}) of "
                              f"region {rel.target!r} ({size} bytes), {side} (walk {walk.shape} with strides "
                              f"{walk.strides})")
