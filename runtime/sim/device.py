"""SimDevice: the Device interface over the simulated NPU."""

from __future__ import annotations

from typing import Sequence

from rkc.ir.npu.perf import PerfModel
from rkc.runtime.device import BufferObject, Device, Job, Submission
from rkc.runtime.sim.errors import MemoryAccessError, SimError
from rkc.runtime.sim.memory import IovaSpace, JobAccess
from rkc.runtime.sim.npu import CORES, Npu
from rkc.runtime.sim.opcache import DEFAULT_BUDGET
from rkc.runtime.sim.quirks import DEFAULT, Quirks
from rkc.runtime.sim.stats import JobStats


class SimDevice(Device):
    """Executes regcmd bytes on the functional simulator, synchronously at submit.

    Errors surface where rocket would report them: `wait` (or
    `prepare_cpu_access` of a BO a failed job wrote) raises the SimError that
    names job, task, entry and register.

    CPU access is strict, as rocket's cache maintenance demands: a BO's host
    view is read-only (numpy raises on a write) except between
    `prepare_cpu_access` and `finish_cpu_access`, and no job may touch a BO in
    that bracket. Operands decoded from memory (converted weights) are kept
    until their bytes change (runtime/sim/opcache.py); `cache_bytes` bounds them."""

    kind = "sim"
    lanes = CORES
    supports_chaining = True

    def __init__(self, quirks: Quirks = DEFAULT, perf: PerfModel | None = None,
                 cache_bytes: int = DEFAULT_BUDGET, **_options) -> None:
        self.mem = IovaSpace(cache_bytes=cache_bytes)
        self.npu = Npu(self.mem, quirks)
        # a PPU-only task completes when the modelled kernel waits for the PPU interrupt
        # (kernel/patches/0005); the default reading of Q12 is stock rocket's DPU only
        self.completes_ppu = "PPU" in quirks.completion_blocks
        self.perf = perf or PerfModel()
        super().__init__()
        self._failed: dict[int, SimError] = {}  # out-BO handle -> error of the job that should have written it
        self.last_jobs: list[JobStats] = []  # stats of the most recent submission
        self._closed = False

    # -- buffers --------------------------------------------------------------
    def create_bo(self, size: int) -> BufferObject:
        return self.mem.allocate(size)

    def create_guard_bo(self, size: int) -> BufferObject:
        bo = self.mem.allocate(size)
        self.mem.guards.add(bo.handle)
        return bo

    def free_bo(self, bo: BufferObject) -> None:
        self.mem.free(bo)
        self._failed.pop(bo.handle, None)

    def prepare_cpu_access(self, bo: BufferObject, timeout_s: float = 5.0) -> None:
        self._live(bo)
        err = self._failed.pop(bo.handle, None)
        if err is not None:
            raise err
        self.mem.hold(bo)

    def finish_cpu_access(self, bo: BufferObject) -> None:
        self._live(bo)
        self.mem.release(bo)

    def _live(self, bo: BufferObject) -> None:
        if self.mem.find(bo.iova) is not bo:
            raise MemoryAccessError(f"{bo!r} is not a live BO of this device")

    # -- execution --------------------------------------------------------------
    def submit(self, jobs: Sequence[Job], chained: bool = False) -> Submission:
        sub = Submission(jobs)
        stats: list[JobStats] = []
        self._counters.submits += 1
        for j, job in enumerate(jobs):
            label = job.label or f"{j}"
            try:
                if not job.out_bos:
                    raise SimError("lists no output BO: rocket refuses it (nothing orders it or waits for it)")
                if not 0 <= job.lane < self.lanes:
                    raise SimError(f"lane {job.lane} is not one of the NPU's {self.lanes} cores (0..{self.lanes - 1})")
                for bo in list(job.in_bos) + list(job.out_bos):
                    self._live(bo)
                    if self.mem.held(bo):
                        raise SimError(f"{bo!r} is still held by the CPU (prepare_cpu_access without "
                                       "finish_cpu_access): the NPU could read stale cache lines")
                self.mem.job_access = JobAccess(label, frozenset(bo.handle for bo in job.out_bos))
                try:
                    js = self.npu.run_job(label, job.lane, [(t.regcmd_iova, t.regcmd_count) for t in job.tasks],
                                          chained)
                finally:
                    self.mem.job_access = None
            except SimError as exc:
                exc.located(job=label)
                sub.error = exc
                for later in jobs[j:]:
                    for bo in later.out_bos:
                        self._failed[bo.handle] = exc
                break
            stats.append(js)
        self._account(stats)
        self.last_jobs = stats
        return sub

    def wait(self, submission: Submission, timeout_s: float = 5.0) -> None:
        err = submission.error
        if err is not None:
            for job in submission.jobs:
                for bo in job.out_bos:
                    self._failed.pop(bo.handle, None)
            submission.error = None
            raise err
        submission.done = True

    def _account(self, stats: list[JobStats]) -> None:
        c = self._counters
        c.modelled_seconds += self.perf.submission_seconds(stats)
        for js in stats:
            for t in js.tasks:
                t.modelled_seconds = self.perf.task_seconds(t)
            js.modelled_seconds = self.perf.job_seconds(js)
            c.jobs += 1
            c.tasks += len(js.tasks)
            c.kicks += js.kicks
            c.macs += js.macs
            for k, v in js.dma_read.items():
                c.dma_read[k] = c.dma_read.get(k, 0) + v
            for k, v in js.dma_written.items():
                c.dma_written[k] = c.dma_written.get(k, 0) + v

    def close(self) -> None:
        for bo in self.mem.bos:
            self.mem.free(bo)
        self._closed = True
