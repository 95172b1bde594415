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
from rkc.ir.npu import footprint, layout
from rkc.ir.npu.perf import JobCost
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
             merge_jobs: bool = False, resolve: Resolver = _identity, independent: bool = False,
             by_dependencies: bool = False) -> Assembly:
    """`merge_jobs`: consecutive operations that each run as one job on the same
    lane become one job (one chained kick for a whole run of ops). `independent`:
    no operation reads what another writes (an LLM segment's products), so every
    lane's jobs, in operation order, become one job (one chained kick per core).
    `by_dependencies`: an operation's job joins its lane's last job wherever it
    reads nothing a later-submitted job writes (`_dependency_groups`): consecutive
    layers split into the same row bands chain on each core."""
    if align % 16 or align <= 0:
        raise RegisterError(f"tasks must be 16-byte aligned, got align={align}")
    groups = job_groups(results, merge_jobs, independent, by_dependencies)
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


def job_groups(results: Sequence[api.EmitResult], merge_jobs: bool = False, independent: bool = False,
               by_dependencies: bool = False) -> list[list[tuple[int, int]]]:
    """The final jobs as lists of (result, job), as `assemble` groups them."""
    if by_dependencies and not independent:
        return _dependency_groups(results)
    groups: list[list[tuple[int, int]]] = []
    if independent:
        _check_independent(results)
        by_lane: dict[int, list[tuple[int, int]]] = {}
        for ri, res in enumerate(results):
            for ji, job in enumerate(res.jobs):
                by_lane.setdefault(job.lane, []).append((ri, ji))
        return list(by_lane.values())
    for ri, res in enumerate(results):
        for ji, job in enumerate(res.jobs):
            prev = groups[-1] if groups else None
            if merge_jobs and prev is not None and len(res.jobs) == 1 and len(results[prev[-1][0]].jobs) == 1 \
                    and results[prev[-1][0]].jobs[prev[-1][1]].lane == job.lane and not results[prev[-1][0]].cpu:
                prev.append((ri, ji))
            else:
                groups.append([(ri, ji)])
    return groups


def job_costs(results: Sequence[api.EmitResult], groups: Sequence[Sequence[tuple[int, int]]],
              chained: bool) -> list[JobCost]:
    """The jobs `groups` forms, as the performance model sees them (one kick a job when chained)."""
    out = []
    for g in groups:
        tasks = [results[ri].tasks[t].cost() for ri, ji in g for t in results[ri].jobs[ji].tasks]
        out.append(JobCost(results[g[0][0]].jobs[g[0][1]].lane, 1 if chained else len(tasks), tasks))
    return out


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


def _dependency_groups(results: Sequence[api.EmitResult]) -> list[list[tuple[int, int]]]:
    """The final jobs as lists of (result, job): each operation's job joins the last
    job of its lane when every task of it depends (reads what was written, or writes
    what was read or written) only on tasks of that job or of jobs submitted before
    it; otherwise it starts a new job. Every dependency then runs from an earlier job
    to a later one (or in order within one job), so the jobs in submission order are
    a valid order: the device's BO fences and the simulator's in-order execution both
    keep it. An operation with CPU steps, or a task whose bytes are unknown, is a
    barrier: it and what follows start new jobs.

    An operation whose jobs are independent of each other places them oldest lane job
    first: after a layer every core waits for (a channel split), the core whose job is
    the newest continues it, and that core changes from layer to layer."""
    groups: list[list[tuple[int, int]]] = []
    open_on: dict[int, int] = {}  # lane -> its last job (index into groups)
    history = _Accesses()
    floor = 0  # no job may join a job before this one (after a barrier)
    for ri, res in enumerate(results):
        accesses = [[_access(res.tasks[t], job) for t in job.tasks] for job in res.jobs]
        barrier = bool(res.cpu) or any(a is None for job in accesses for a in job)
        order = list(range(len(res.jobs)))
        if not barrier and _independent(accesses):
            order.sort(key=lambda ji: open_on.get(res.jobs[ji].lane, -1))
        for ji in order:
            lane = res.jobs[ji].lane
            last = open_on.get(lane)
            if barrier or last is None or max({floor} | history.depended_on(accesses[ji])) > last:
                groups.append([])
                last = open_on[lane] = len(groups) - 1
            groups[last].append((ri, ji))
            if barrier:  # what follows runs after it: in its job (same lane) or a later one
                open_on.clear()
                if not res.cpu:
                    open_on[lane] = last
                floor = last if not res.cpu else last + 1
            else:
                history.record(accesses[ji], last)
    return groups


class _Accesses:
    """The spans read and written so far, each with the job that does it."""

    def __init__(self) -> None:
        self.written: dict[str, list[tuple[footprint.Span, int]]] = {}
        self.read: dict[str, list[tuple[footprint.Span, int]]] = {}

    def depended_on(self, accesses: Sequence[footprint.Access]) -> set[int]:
        """The jobs whose tasks these accesses must follow."""
        deps: set[int] = set()
        for a in accesses:
            for s in a.reads:
                deps.update(g for w, g in self.written.get(s.buffer, ()) if w.overlaps(s))
            for s in a.writes:
                deps.update(g for w, g in (*self.written.get(s.buffer, ()), *self.read.get(s.buffer, ()))
                            if w.overlaps(s))
        return deps

    def record(self, accesses: Sequence[footprint.Access], job: int) -> None:
        for a in accesses:
            for s in a.reads:
                self.read.setdefault(s.buffer, []).append((s, job))
            for s in a.writes:
                self.written.setdefault(s.buffer, []).append((s, job))


def _independent(jobs: Sequence[Sequence[footprint.Access]]) -> bool:
    """Whether no job writes what another reads or writes (any order is valid)."""
    for i, mine in enumerate(jobs):
        others = _Accesses()
        for j, theirs in enumerate(jobs):
            if j != i:
                others.record(theirs, j)
        if any(others.depended_on([footprint.Access((), a.writes)]) for a in mine):
            return False
    return True


def _access(task: api.Task, job: api.JobPlan) -> footprint.Access | None:
    """The task's exact access, or its touched ranges: written where the job
    names the buffer among its writes (read too, for all this knows), else read."""
    if task.access is not None:
        return task.access
    if not task.touches:
        return None
    spans = [(footprint.Span(b, start, end - start), b in job.writes) for b, start, end in task.touches]
    return footprint.Access(tuple(s for s, _ in spans), tuple(s for s, w in spans if w))
