"""Lay the tasks of several operations into one regcmd region and link them.

Each job's tasks are placed one after the other, every task at an `align`-byte
boundary (16 is the PC's requirement; Mesa uses 64). Within a job, each task's
tail points at the next task (PC_BASE_ADDRESS through a relocation into the
regcmd region, PC_REGISTER_AMOUNTS = link_amount(next count)); the last task of
a job keeps the end-of-chain tail. The same bytes then run under stock rocket
(the kernel kicks every task itself and ignores the link) and as one
hardware-chained kick per job.

Buffer names in the tasks' relocations are symbolic; `resolve` maps each to
(region, byte offset) of the rkbin (default: a region of the same name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from rkc.compiler.npu import api
from rkc.ir import program
from rkc.ir.errors import RegisterError
from rkc.ir.npu import layout
from rkc.ir.npu.regcmd import ENTRY_BYTES, link_tail

Resolver = Callable[[str], tuple[str, int]]


def _identity(name: str) -> tuple[str, int]:
    return name, 0


@dataclass
class Assembly:
    region: str
    entries: np.ndarray  # uint64, address fields 0 (filled by relocation at load)
    relocations: list[program.Relocation]
    jobs: list[program.Job]
    task_refs: list[list[program.TaskRef]]  # per result, per task
    job_ranges: list[range]  # per result: its jobs' indices in `jobs`
    cpu_steps: list[tuple[api.CpuStep, list[int]]] = field(default_factory=list)  # step, jobs to wait for

    @property
    def nbytes(self) -> int:
        return int(self.entries.nbytes)

    def blob(self) -> bytes:
        return self.entries.astype("<u8").tobytes()


def assemble(results: Sequence[api.EmitResult], region: str = "regcmd", align: int = 64,
             merge_jobs: bool = False, resolve: Resolver = _identity, independent: bool = False) -> Assembly:
    """`merge_jobs`: consecutive operations that each run as one job on the same
    lane become one job (one chained kick for a whole run of ops). `independent`:
    no operation reads what another writes (an LLM segment's products), so every
    lane's jobs, in operation order, become one job (one chained kick per core)."""
    if align % 16 or align <= 0:
        raise RegisterError(f"tasks must be 16-byte aligned, got align={align}")
    # which (result, job) pairs form each final job
    groups: list[list[tuple[int, int]]] = []
    if independent:
        _check_independent(results)
        by_lane: dict[int, list[tuple[int, int]]] = {}
        for ri, res in enumerate(results):
            for ji, job in enumerate(res.jobs):
                by_lane.setdefault(job.lane, []).append((ri, ji))
        groups = list(by_lane.values())
    for ri, res in enumerate(results if not independent else ()):
        for ji, job in enumerate(res.jobs):
            prev = groups[-1] if groups else None
            if merge_jobs and prev is not None and len(res.jobs) == 1 and len(results[prev[-1][0]].jobs) == 1 \
                    and results[prev[-1][0]].jobs[prev[-1][1]].lane == job.lane and not results[prev[-1][0]].cpu:
                prev.append((ri, ji))
            else:
                groups.append([(ri, ji)])
    placed: dict[tuple[int, int], int] = {}  # (result, task) -> first entry
    order: list[list[tuple[int, int]]] = []  # per group: (result, task) in run order
    pos = 0
    for g in groups:
        seq = [(ri, t) for ri, ji in g for t in results[ri].jobs[ji].tasks]
        order.append(seq)
        for ri, t in seq:
            if (ri, t) in placed:
                raise RegisterError(f"task {t} of op {ri} is in two jobs")
            placed[(ri, t)] = pos // ENTRY_BYTES
            pos += layout.align(results[ri].tasks[t].count * ENTRY_BYTES, align)
    entries = np.zeros(pos // ENTRY_BYTES, np.uint64)
    relocs: list[program.Relocation] = []
    jobs: list[program.Job] = []
    job_ranges = [range(0)] * len(results)
    first_job = {}
    for gi, (g, seq) in enumerate(zip(groups, order)):
        for n, (ri, t) in enumerate(seq):
            task = results[ri].tasks[t]
            start = placed[(ri, t)]
            body = task.regcmd.copy()
            if n + 1 < len(seq):
                nri, nt = seq[n + 1]
                nxt = results[nri].tasks[nt]
                link_tail(body, 0, nxt.count)  # the address comes from the relocation below
                relocs.append(program.Relocation(region, start + task.count - 4, region,
                                                 placed[(nri, nt)] * ENTRY_BYTES))
            entries[start:start + task.count] = body
            for r in task.relocations:
                target, base = resolve(r.buffer)
                relocs.append(program.Relocation(region, start + r.entry, target, base + r.offset))
        reads, writes, lane = [], [], results[g[0][0]].jobs[g[0][1]].lane
        for ri, ji in g:
            jp = results[ri].jobs[ji]
            reads += [resolve(b)[0] for b in jp.reads if resolve(b)[0] not in reads]
            writes += [resolve(b)[0] for b in jp.writes if resolve(b)[0] not in writes]
            first_job.setdefault(ri, gi)
            job_ranges[ri] = range(first_job[ri], gi + 1)
        reads = [b for b in reads if b not in writes]  # a BO both read and written goes out-only
        jobs.append(program.Job([program.TaskRef(region, placed[k], results[k[0]].tasks[k[1]].count)
                                 for k in seq], reads, writes, lane))
    refs = [[program.TaskRef(region, placed[(ri, t)], task.count) for t, task in enumerate(res.tasks)]
            for ri, res in enumerate(results)]
    cpu = [(step, [job_ranges[ri][j] for j in (step.after or range(len(res.jobs)))])
           for ri, res in enumerate(results) for step in res.cpu]
    return Assembly(region, entries, relocs, jobs, refs, job_ranges, cpu)


def _check_independent(results: Sequence[api.EmitResult]) -> None:
    """Operations whose jobs may share a core's job in any grouping: none reads a
    buffer another writes, and none has a CPU step waiting on its own jobs."""
    for ri, res in enumerate(results):
        if res.cpu:
            raise RegisterError(f"operation {ri} has a CPU step: its jobs cannot be merged with others'")
        reads = {b for j in res.jobs for b in j.reads}
        for rj, other in enumerate(results):
            written = {b for j in other.jobs for b in j.writes}
            if rj != ri and reads & written:
                raise RegisterError(f"operation {ri} reads {sorted(reads & written)} that operation {rj} writes: "
                                    f"the operations are not independent")
