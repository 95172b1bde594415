"""Tasks onto cores: lanes, order within a lane, and CBUF reuse between neighbours.

A `Work` is one task to be: the identity of the feature tile and of the weight
tile it loads into CBUF, and a function building its `Task` once the CBUF plan
(with the reuse bits) is known. `schedule` keeps each lane's works in the given
order and sets DATA_REUSE / WEIGHT_REUSE when the previous task of the same lane
(same job, hence same core) loaded the same tile with the same bank split
(CNA_CBUF_CON0 bits 12/13; the reuse holds only within one job: hw-matmul.md 6).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from rkc.compiler.npu import api
from rkc.ir.npu import hw

def banks_for(nbytes: int) -> int:
    return max(1, -(-nbytes // hw.CBUF_BANK_BYTES))


def data_banks(nbytes: int, slack: int) -> int:
    """Data banks of a feature tile of `nbytes` with `slack` banks kept free
    past it (EmitOptions.slack_banks)."""
    return banks_for(nbytes) + slack


@dataclass
class Work:
    lane: int
    data_key: tuple
    weight_key: tuple
    cbuf: api.CbufPlan
    build: Callable[[api.CbufPlan], api.Task]
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    after: int | None = None  # index of a work that must run first (same lane required)


def schedule(works: Sequence[Work]) -> tuple[list[api.Task], list[api.JobPlan]]:
    """Tasks in lane-major order (each lane one job) with reuse bits set."""
    lanes = sorted({w.lane for w in works})
    tasks: list[api.Task] = []
    jobs: list[api.JobPlan] = []
    for lane in lanes:
        prev: Work | None = None
        job = api.JobPlan([], lane)
        for w in (w for w in works if w.lane == lane):
            same_split = prev is not None and (prev.cbuf.data_banks, prev.cbuf.weight_banks) == \
                (w.cbuf.data_banks, w.cbuf.weight_banks)
            data_reuse = same_split and prev.data_key == w.data_key
            weight_reuse = same_split and prev.weight_key == w.weight_key and w.cbuf.weights_resident \
                and prev.cbuf.weights_resident and not data_reuse
            plan = replace(w.cbuf, data_reuse=data_reuse, weight_reuse=weight_reuse)
            job.tasks.append(len(tasks))
            tasks.append(w.build(plan))
            for b in w.reads:
                if b not in job.reads:
                    job.reads.append(b)
            for b in w.writes:
                if b not in job.writes:
                    job.writes.append(b)
            prev = w
        jobs.append(job)
    return tasks, jobs


def split_evenly(total: int, parts: int, align: int) -> list[tuple[int, int]]:
    """`parts` [start, size) ranges covering `total` (fewer if `total` is small),
    starts multiples of `align`, sizes differing by at most one `align` unit."""
    units = -(-total // align)
    parts = max(1, min(parts, units))
    base, extra = divmod(units, parts)
    out, start = [], 0
    for i in range(parts):
        size = (base + (1 if i < extra else 0)) * align
        out.append((start, min(size, total - start)))
        start += size
    return out


def lane_of(index: int, count: int, cores: int) -> int:
    """Contiguous blocks of `count` items over `cores` lanes."""
    return index * min(cores, count) // count


def pad_constants(consts: Sequence[api.ConstBuffer], tasks: Sequence[api.Task]) -> list[api.ConstBuffer]:
    """Zero-extend each constant to what the tasks read of it (the DPU reads
    per-channel operands for every computed channel, padding channels included)."""
    need: dict[str, int] = {}
    for t in tasks:
        for buf, _, end in t.touches:
            need[buf] = max(need.get(buf, 0), end)
    out = []
    for c in consts:
        n = need.get(c.name, 0)
        out.append(c if n <= len(c.data) else api.ConstBuffer(c.name, c.data + bytes(n - len(c.data)), c.align))
    return out
