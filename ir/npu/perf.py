"""The NPU performance model: per-task counters -> modelled seconds.

One formula for everyone: the simulator applies it to what it counted while
executing the regcmd bytes (runtime/sim), the compiler to what its plan says
each task will do (compiler/npu, stored per task in the rkbin), `rkc inspect`,
`rkrun` and bench/ print its results.

Per task: max(MAC time, DMA time), MAC time = MACs / (MACs per cycle of the
precision x clock), DMA time = bytes / the bandwidth one core's DMA reaches
(hw.CORE_DMA_SHARE of DRAM's: measured 1/2/3-core scaling of a memory-bound
kernel, added when bench/silicon.py held the model against published figures;
the model before it, PerfModel.plain(), let one core use all of DRAM). Per kick: a fixed
overhead (stock rocket kicks and interrupts once per task, measured 27-51 us
per submit by gregordinary perf/benchmarks; a hardware chain kicks once per
job). Jobs on different lanes run on different cores at the same time, but
share DRAM: a submission takes the longer of its busiest lane and all its DMA
bytes at the DRAM bandwidth. Physical figures: ir/npu/hw.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

from rkc.ir.npu import hw


class TaskCounts(Protocol):
    macs: int
    precision: str  # CORE precision ("" for a task without a convolution)

    @property
    def dma_bytes(self) -> int: ...


class JobCounts(Protocol):
    lane: int
    kicks: int

    @property
    def tasks(self) -> Sequence[TaskCounts]: ...


@dataclass(frozen=True)
class TaskCost:
    """A task as the compiler plans it (the simulator's TaskStats has the same fields)."""

    macs: int
    dma_bytes: int
    precision: str = ""


@dataclass
class JobCost:
    lane: int
    kicks: int
    tasks: list[TaskCost] = field(default_factory=list)


@dataclass(frozen=True)
class PerfModel:
    clock_hz: float = hw.CLOCK_HZ_MAX
    dram_bytes_per_s: float = hw.DRAM_BYTES_PER_S_SUSTAINED
    kick_overhead_s: float = hw.KICK_OVERHEAD_S
    cores: int = hw.CORES
    core_dma_share: float = hw.CORE_DMA_SHARE  # of dram_bytes_per_s, what one core's DMA reaches alone

    @classmethod
    def plain(cls, **overrides) -> "PerfModel":
        """The model before bench/silicon.py's comparison added terms to it (its "before" column):
        one core's DMA as fast as all of DRAM."""
        return cls(**{"core_dma_share": 1.0, **overrides})

    def task_seconds(self, t: TaskCounts) -> float:
        rate = hw.MACS_PER_CYCLE.get(t.precision, hw.MACS_PER_CYCLE["int8"]) * self.clock_hz
        return max(t.macs / rate, t.dma_bytes / (self.dram_bytes_per_s * self.core_dma_share))

    def job_seconds(self, job: JobCounts) -> float:
        return sum(self.task_seconds(t) for t in job.tasks) + job.kicks * self.kick_overhead_s

    def submission_seconds(self, jobs: Iterable[JobCounts]) -> float:
        jobs = list(jobs)
        lanes: dict[int, float] = {}
        for j in jobs:
            lanes[j.lane % self.cores] = lanes.get(j.lane % self.cores, 0.0) + self.job_seconds(j)
        dram = sum(t.dma_bytes for j in jobs for t in j.tasks) / self.dram_bytes_per_s
        return max(max(lanes.values(), default=0.0), dram)


def describe(seconds: float, tasks: int, kicks: int, ddr_bytes: int, chaining: bool,
             clock_hz: float = hw.CLOCK_HZ_MAX) -> str:
    """The words `rkrun` and `rkc inspect` both use for a modelled figure."""
    how = "with hardware chaining" if chaining else "with stock rocket"
    return (f"modelled NPU time {seconds * 1e3:.3f} ms at {clock_hz / 1e9:g} GHz ({tasks} tasks, "
            f"{kicks} kicks {how}, {ddr_bytes:,} DDR bytes)")
