"""NullDevice (`--device null`): a Device that checks every submission and
completes it at once without running it, leaving every buffer as it is.

For measuring what the host costs around the NPU (the runtime's own work:
CPU kernels, conversions, bookkeeping) with no simulator in the way. Outputs
are meaningless (the NPU's results are whatever the BOs held). The checks are
those a submit must pass on any device: every BO named by a job is live and
not held by the CPU, and every task's regcmd lies inside one live BO. The CPU
access bracket is kept as strictly as the simulator keeps it: a BO's host view
is writable only between prepare_cpu_access and finish_cpu_access."""

from __future__ import annotations

import bisect
from typing import Callable, Sequence

import numpy as np

from rkc.ir.npu.regcmd import ENTRY_BYTES
from rkc.runtime.device import IOVA_LIMIT, BufferObject, Device, Job, Submission

PAGE = 4096


class NullDeviceError(RuntimeError):
    """A submission that no device would accept."""


class NullDevice(Device):
    kind = "null"
    lanes = 3
    supports_chaining = True
    completes_ppu = True  # models a board on the patched kernel, as for chaining

    def __init__(self, **_options) -> None:
        super().__init__()
        self._starts: list[int] = []
        self._bos: list[BufferObject] = []
        self._held: set[int] = set()
        self._live: dict[int, BufferObject] = {}  # handle -> BO
        self._next_iova = PAGE  # IOVA 0 stays unmapped: a zero address is never a BO's
        self._next_handle = 1
        self._frees = 0  # BOs freed so far: a prepared submit whose BOs were all live stays valid while this holds

    # -- buffers ----------------------------------------------------------------
    def create_bo(self, size: int) -> BufferObject:
        size = max(PAGE, -(-int(size) // PAGE) * PAGE)
        if self._next_iova + size > IOVA_LIMIT:
            raise NullDeviceError(f"no room for a {size}-byte BO in the 32-bit IOVA window")
        host = np.zeros(size, np.uint8)[:]  # a view: its writeable flag toggles with the bracket
        host.flags.writeable = False
        bo = BufferObject(self._next_handle, size, self._next_iova, host)
        self._next_handle += 1
        self._next_iova += size
        i = bisect.bisect_left(self._starts, bo.iova)
        self._starts.insert(i, bo.iova)
        self._bos.insert(i, bo)
        self._live[bo.handle] = bo
        return bo

    def free_bo(self, bo: BufferObject) -> None:
        i = self._index(bo)
        self._frees += 1
        del self._starts[i], self._bos[i]
        del self._live[bo.handle]
        self._held.discard(bo.handle)

    def _index(self, bo: BufferObject) -> int:
        i = bisect.bisect_left(self._starts, bo.iova)
        if i >= len(self._bos) or self._bos[i] is not bo:
            raise NullDeviceError(f"{bo!r} is not a live BO of this device")
        return i

    def _check_live(self, bo: BufferObject) -> None:
        if self._live.get(bo.handle) is not bo:
            raise NullDeviceError(f"{bo!r} is not a live BO of this device")

    def prepare_cpu_access(self, bo: BufferObject, timeout_s: float = 5.0) -> None:
        if self._live.get(bo.handle) is not bo:  # (_check_live inlined: twice a fused stretch per BO)
            self._check_live(bo)
        self._held.add(bo.handle)
        bo.host.flags.writeable = True

    def finish_cpu_access(self, bo: BufferObject) -> None:
        if self._live.get(bo.handle) is not bo:
            self._check_live(bo)
        self._held.discard(bo.handle)
        bo.host.flags.writeable = False

    # -- execution --------------------------------------------------------------
    def submit(self, jobs: Sequence[Job], chained: bool = False) -> Submission:
        self._check(jobs, chained)
        self._count(len(jobs), sum(len(job.tasks) for job in jobs), chained)
        sub = Submission(jobs)
        sub.done = True
        return sub

    def _check(self, jobs: Sequence[Job], chained: bool, held: set | frozenset | None = None) -> None:
        """What no device accepts; `held`: the BOs the CPU holds (default: now)."""
        if chained and not self.supports_chaining:
            raise NullDeviceError("chained submission on a device without chaining")
        live, held = self._live, self._held if held is None else held
        for j, job in enumerate(jobs):
            for bo in (*job.in_bos, *job.out_bos):
                if live.get(bo.handle) is not bo:
                    raise NullDeviceError(f"job {job.label or j}: {bo!r} is not a live BO of this device")
                if bo.handle in held:
                    raise NullDeviceError(f"job {job.label or j}: {bo!r} is still held by the CPU")
            if not 0 <= job.lane < self.lanes:
                raise NullDeviceError(f"job {job.label or j}: lane {job.lane} (the device has {self.lanes})")
            for task in job.tasks:
                self._check_task(job.label or str(j), task.regcmd_iova, task.regcmd_count)

    def _count(self, jobs: int, tasks: int, chained: bool) -> None:
        c = self._counters
        c.submits += 1
        c.jobs += jobs
        c.tasks += tasks
        c.kicks += jobs if chained else tasks

    def prepare_submit(self, jobs: Sequence[Job], chained: bool = False) -> Callable[[], None]:
        """`submit` + `wait` with the checks that cannot change between calls
        made once, here (chaining, lanes, every BO live, every task's regcmd
        inside a live BO). Per call: no BO freed since (so all those still
        hold) and none of the jobs' BOs held by the CPU; otherwise the call goes
        through `submit`, which names what is wrong. (A plan prepares its submits
        while it holds every BO: holding is checked per call only.)"""
        try:
            self._check(jobs, chained, held=frozenset())
        except NullDeviceError:  # refused when it is run, as `submit` refuses it
            return super().prepare_submit(jobs, chained)
        handles = frozenset(bo.handle for job in jobs for bo in (*job.in_bos, *job.out_bos))
        frees, held, count = self._frees, self._held, self._count
        n_jobs, n_tasks = len(jobs), sum(len(job.tasks) for job in jobs)

        def run() -> None:
            if self._frees != frees or not handles.isdisjoint(held):
                self.submit(jobs, chained)
                return
            count(n_jobs, n_tasks, chained)
        return run

    def _check_task(self, label: str, iova: int, count: int) -> None:
        i = bisect.bisect_right(self._starts, iova) - 1
        bo = self._bos[i] if i >= 0 else None
        if count <= 0 or bo is None or iova + count * ENTRY_BYTES > bo.iova + bo.size:
            raise NullDeviceError(f"job {label}: regcmd {iova:#x} x {count} entries lies outside every BO")

    def wait(self, submission: Submission, timeout_s: float = 5.0) -> None:
        if not submission.done:
            raise NullDeviceError("wait on a submission this device never completed")

    def close(self) -> None:
        self._starts.clear()
        self._bos.clear()
        self._live.clear()
        self._held.clear()
