"""Performance model: counters -> modelled seconds.

Per task: max(MAC time, DMA time), MAC time = MACs / (MACs per cycle of the
precision x clock), DMA time = bytes / DRAM bandwidth. Per kick: a fixed
overhead (stock rocket kicks and interrupts once per task, measured 27-51 us
per submit by gregordinary perf/benchmarks; a hardware chain kicks once per
job). Jobs on different lanes run on different cores at the same time, but
share DRAM: a submission takes the longer of its busiest lane and all its DMA
bytes at the DRAM bandwidth. Physical figures: ir/npu/hw.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ir.npu import hw
from runtime.sim.stats import JobStats, TaskStats


@dataclass(frozen=True)
class PerfModel:
    clock_hz: float = hw.CLOCK_HZ_MAX
    dram_bytes_per_s: float = hw.DRAM_BYTES_PER_S_SUSTAINED
    kick_overhead_s: float = hw.KICK_OVERHEAD_S
    cores: int = hw.CORES

    def task_seconds(self, t: TaskStats) -> float:
        rate = hw.MACS_PER_CYCLE.get(t.precision, hw.MACS_PER_CYCLE["int8"]) * self.clock_hz
        return max(t.macs / rate, t.dma_bytes / self.dram_bytes_per_s)

    def job_seconds(self, job: JobStats) -> float:
        for t in job.tasks:
            t.modelled_seconds = self.task_seconds(t)
        job.modelled_seconds = sum(t.modelled_seconds for t in job.tasks) + job.kicks * self.kick_overhead_s
        return job.modelled_seconds

    def submission_seconds(self, jobs: Iterable[JobStats]) -> float:
        jobs = list(jobs)
        lanes: dict[int, float] = {}
        for j in jobs:
            lanes[j.lane % self.cores] = lanes.get(j.lane % self.cores, 0.0) + self.job_seconds(j)
        dram = sum(t.dma_bytes for j in jobs for t in j.tasks) / self.dram_bytes_per_s
        return max(max(lanes.values(), default=0.0), dram)
