"""RocketDevice: the Device interface on the mainline rocket DRM-accel driver.

Marshalling only: every OS call goes through a KernelInterface, so the same code
runs on a board (LinuxKernel) and in the tests (the emulated kernel). The facts
it relies on are in docs/hw-rocket-and-mesa.md §1 and runtime/rocket/uapi.py;
the design choices (lanes, witnesses, write-after-read) in docs/rocket.md.

Shape of an open device:

* one fd per lane (``cores`` of them), all on the node whose DRM driver is
  "rocket". The scheduler has one entity per fd, so separate fds are what lets
  jobs run on separate cores at the same time. Lanes only work when the fds
  share one NPU address space (a regcmd holds absolute IOVAs); the stock driver
  gives every fd its own IOMMU domain, which the device detects at open by
  comparing where each fd's first BO lands, and then it runs every lane on one
  fd and says so.
* a guard BO first on the home fd, so no user BO sits at IOVA 0 and an address
  field of 0 always means "not programmed".
* BOs are created and mmapped on the home fd; with several lanes each BO is
  imported into every lane fd (PRIME), giving the same GEM object, hence the
  same fences, under a handle the lane's jobs can list.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rkc.ir.npu import hw
from rkc.runtime.device import BufferObject, Device, IOVA_LIMIT, Job, Submission
from rkc.runtime.rocket import fences, uapi
from rkc.runtime.rocket.errors import JobDropped, JobFailed, JobTimeout, RocketError
from rkc.runtime.rocket.kernel import KernelInterface, LinuxKernel
from rkc.runtime.rocket.nodes import DriverVersion, find_rocket_node, read_version
from rkc.runtime.rocket.validate import AddressMap, TaskCache, check_jobs, job_name

GUARD_BYTES = 4096
WITNESS_BYTES = 4096
# jobs tracked through a witness at once: each holds a sync_file fd until its
# wait, so this bounds the fds the device uses (later jobs are still validated
# and waited for through their out BOs, and order write-after-read by listing
# what they read as outputs)
MAX_TRACKED_JOBS = 256
BO_SIZE_MAX = 0xFFFFFFFF  # drm_rocket_create_bo.size is a u32


@dataclass(eq=False)
class _Bo:
    bo: BufferObject
    mapping: object | None  # None for BOs the CPU never maps (witnesses)
    handles: list[int]  # handle of the BO in each lane fd; [0] is the home fd


@dataclass(eq=False)
class _Tracked:
    """One submitted job and what the device knows about its fence."""

    job: Job
    index: int
    lane: int
    witness: _Bo | None
    sync_fd: int | None = None  # holds the job's fence once it was seen active


class RocketSubmission(Submission):
    def __init__(self, jobs: Sequence[Job], tracked: list[_Tracked], dropped: list[_Tracked]) -> None:
        super().__init__(jobs)
        self.tracked = tracked
        self.dropped = dropped


@dataclass
class JobChecks:
    """How the device verifies that jobs ran (reported by `rkc doctor`)."""

    fences: bool
    reason: str = ""

    def __str__(self) -> str:
        if self.fences:
            return "validation before submit; per-job fences (drop and kernel-reset detection); PREP_BO deadline"
        return f"validation before submit; PREP_BO deadline only ({self.reason})"


class RocketDevice(Device):
    kind = "rocket"

    def __init__(self, node: str | None = None, cores: int = hw.CORES, kernel: KernelInterface | None = None,
                 check_fences: bool = True, quiet: bool = False, max_tracked_jobs: int = MAX_TRACKED_JOBS) -> None:
        self.kernel = kernel or LinuxKernel()
        self.node = node or find_rocket_node(self.kernel)
        if self.node is None:
            raise RocketError("no rocket NPU found (no /dev/accel/accel* node is driven by \"rocket\")")
        if cores < 1:
            raise RocketError(f"--cores must be at least 1, got {cores}")
        self._quiet = quiet
        self._max_tracked = max_tracked_jobs  # tests lower it to reach the untracked path
        super().__init__()
        self._bos: dict[int, _Bo] = {}  # home handle -> record (user BOs only)
        self._witness_pool: list[_Bo] = []
        self._witnesses: list[_Bo] = []
        self._outstanding: list[_Tracked] = []  # submitted, not yet waited
        self._address_map: AddressMap | None = None
        self._validated = TaskCache()
        self._fds: list[int] = []
        try:
            self._fds.append(self._open_node())
            self.version: DriverVersion = read_version(self.kernel, self._fds[0])
            if self.version.name != "rocket":
                raise RocketError(f"{self.node} is driven by {self.version.name!r}, not rocket")
            self.supports_chaining = self.version.version >= uapi.CHAIN_VERSION
            # kernel/patches/0005: a job names the interrupts that end it, so PPU-only tasks complete
            self.completes_ppu = self.version.version >= uapi.IRQ_MASK_VERSION
            self._guard = self._create_raw(self._fds[0], GUARD_BYTES)
            self.lanes, self.lane_note = self._open_lanes(cores)
            self.job_checks = self._probe_fence_checks() if check_fences else JobChecks(False, "disabled")
        except BaseException:
            self._close_fds()
            raise
        if self.lane_note and not quiet:
            print(f"rkc: rocket: {self.lane_note}", file=sys.stderr)

    # --- opening --------------------------------------------------------------------------

    def _open_node(self) -> int:
        try:
            return self.kernel.open(self.node)
        except OSError as exc:
            hint = " (add yourself to the group owning it, often 'render')" if exc.errno == errno.EACCES else ""
            raise RocketError(f"cannot open {self.node}: {os.strerror(exc.errno or errno.EIO)}{hint}") from None

    def _open_lanes(self, wanted: int) -> tuple[int, str]:
        """Open one fd per extra lane if the fds share one NPU address space.

        A fresh fd with a private address space puts its first BO where the
        home fd's guard already is (the bottom of the aperture); in a shared
        space it cannot."""
        if wanted == 1:
            return 1, ""
        fd = self._open_node()
        probe = self._create_raw(fd, GUARD_BYTES)
        separate = probe.dma_address < self._guard.dma_address + GUARD_BYTES and \
            self._guard.dma_address < probe.dma_address + GUARD_BYTES
        self._gem_close(fd, probe.handle)
        if separate:
            self.kernel.close(fd)
            return 1, (f"this kernel gives every file its own NPU address space, so the {wanted} lanes asked "
                       f"for run on one queue (one core at a time); see docs/rocket.md")
        self._fds.append(fd)
        while len(self._fds) < wanted:
            self._fds.append(self._open_node())
        return wanted, ""

    def _probe_fence_checks(self) -> JobChecks:
        """Per-job fences need PRIME export and dma-buf sync-file export."""
        witness = self._new_witness()
        try:
            fences.sync_file_status(self.kernel, sync_fd := self._export_fences(witness))
            self.kernel.close(sync_fd)
        except OSError as exc:
            what = "dma-buf" if exc.filename == "prime" else "sync_file"
            return JobChecks(False, f"{what} export failed: {os.strerror(exc.errno or errno.EIO)}")
        self._witness_pool.append(witness)
        return JobChecks(True)

    def _export_fences(self, witness: _Bo) -> int:
        """A sync_file of the witness's pending write fences (the dma-buf fd is
        only needed for the export)."""
        try:
            dmabuf = fences.export_dmabuf(self.kernel, self._fds[0], witness.handles[0])
        except OSError as exc:
            exc.filename = "prime"
            raise
        try:
            return fences.export_write_fences(self.kernel, dmabuf)
        finally:
            self.kernel.close(dmabuf)

    # --- raw ioctls -----------------------------------------------------------------------

    def _create_raw(self, fd: int, size: int) -> uapi.RocketCreateBo:
        arg = uapi.RocketCreateBo(size=size)
        try:
            self.kernel.ioctl(fd, uapi.DRM_IOCTL_ROCKET_CREATE_BO, arg)
        except OSError as exc:
            raise RocketError(f"CREATE_BO of {size} bytes failed: {os.strerror(exc.errno or errno.EIO)}") from None
        if arg.dma_address + size > IOVA_LIMIT:
            raise RocketError(f"the kernel placed a BO at IOVA {arg.dma_address:#x}, beyond the NPU's 32-bit reach")
        return arg

    def _gem_close(self, fd: int, handle: int) -> None:
        try:
            self.kernel.ioctl(fd, uapi.DRM_IOCTL_GEM_CLOSE, uapi.DrmGemClose(handle=handle))
        except OSError as exc:
            if exc.errno != errno.EBADF:  # EBADF: the file is gone, and its handles went with it
                raise RocketError(f"GEM_CLOSE of handle {handle} failed: {os.strerror(exc.errno or errno.EIO)}") \
                    from None

    def _prep(self, handle: int, deadline_ns: int) -> None:
        """PREP_BO with an absolute CLOCK_MONOTONIC deadline; any value >= 0 is
        success (the 6.18 driver returns the jiffies left)."""
        arg = uapi.RocketPrepBo(handle=handle, timeout_ns=deadline_ns)
        while True:
            try:
                self.kernel.ioctl(self._fds[0], uapi.DRM_IOCTL_ROCKET_PREP_BO, arg)
                return
            except InterruptedError:
                continue  # the deadline is absolute, so retrying keeps it

    def _deadline(self, timeout_s: float) -> int:
        return self.kernel.clock_ns() + max(0, int(timeout_s * 1e9))

    # --- BOs ------------------------------------------------------------------------------

    def _new_record(self, size: int, mapped: bool) -> _Bo:
        if not 0 < size <= BO_SIZE_MAX:
            raise RocketError(f"cannot create a BO of {size} bytes (1 .. {BO_SIZE_MAX})")
        home = self._fds[0]
        arg = self._create_raw(home, size)
        record = _Bo(BufferObject(arg.handle, size, arg.dma_address, np.zeros(0, np.uint8)), None, [arg.handle])
        try:
            if mapped:
                record.mapping = self.kernel.mmap(home, size, arg.offset)
                record.bo.host = np.frombuffer(record.mapping, dtype=np.uint8, count=size)
            if len(self._fds) > 1:
                dmabuf = fences.export_dmabuf(self.kernel, home, arg.handle)
                try:
                    for fd in self._fds[1:]:
                        record.handles.append(fences.import_dmabuf(self.kernel, fd, dmabuf))
                finally:
                    self.kernel.close(dmabuf)
        except BaseException:
            self._free_record(record)
            raise
        return record

    def _free_record(self, record: _Bo) -> None:
        record.bo.host = np.zeros(0, np.uint8)
        if record.mapping is not None:
            try:
                self.kernel.munmap(record.mapping)
            except BufferError:
                pass  # a caller still holds a view; the mapping goes when that view does
            record.mapping = None
        for fd, handle in zip(self._fds, record.handles):
            self._gem_close(fd, handle)
        record.handles = []

    def create_bo(self, size: int) -> BufferObject:
        record = self._new_record(size, mapped=True)
        self._bos[record.bo.handle] = record
        self._address_map = None
        return record.bo

    def _record(self, bo: BufferObject) -> _Bo:
        record = self._bos.get(bo.handle)
        if record is None or record.bo is not bo:
            raise RocketError(f"{bo!r} is not a live BO of this rocket device")
        return record

    def free_bo(self, bo: BufferObject) -> None:
        record = self._record(bo)
        del self._bos[bo.handle]
        self._address_map = None
        self._validated.freed(bo)
        self._free_record(record)

    def prepare_cpu_access(self, bo: BufferObject, timeout_s: float = 5.0) -> None:
        record = self._record(bo)
        try:
            self._prep(record.handles[0], self._deadline(timeout_s))
        except OSError as exc:
            if exc.errno in (errno.ETIMEDOUT, errno.EBUSY):
                writers = [job_name(t.job, t.index) for t in self._outstanding if bo in t.job.out_bos]
                who = f" (written by {', '.join(writers)})" if writers else ""
                raise JobTimeout(f"{bo!r}: the NPU did not finish writing it within {timeout_s:g} s{who}") from None
            raise RocketError(f"PREP_BO on {bo!r} failed: {os.strerror(exc.errno or errno.EIO)}") from None

    def finish_cpu_access(self, bo: BufferObject) -> None:
        record = self._record(bo)
        self._validated.wrote(bo)
        try:
            self.kernel.ioctl(self._fds[0], uapi.DRM_IOCTL_ROCKET_FINI_BO, uapi.RocketFiniBo(handle=record.handles[0]))
        except OSError as exc:
            raise RocketError(f"FINI_BO on {bo!r} failed: {os.strerror(exc.errno or errno.EIO)}") from None

    # --- witnesses ------------------------------------------------------------------------

    def _new_witness(self) -> _Bo:
        record = self._new_record(WITNESS_BYTES, mapped=False)
        self._witnesses.append(record)
        return record

    def _take_witness(self) -> _Bo:
        return self._witness_pool.pop() if self._witness_pool else self._new_witness()

    # --- submit ---------------------------------------------------------------------------

    def _lane_of(self, job: Job) -> int:
        if job.lane < 0:
            raise RocketError(f"{job.label or 'job'}: lane {job.lane} is negative")
        return job.lane % self.lanes

    def _validate(self, jobs: Sequence[Job], chained: bool) -> None:
        if self._address_map is None:
            self._address_map = AddressMap(r.bo for r in self._bos.values())
        live = self._bos
        check_jobs(jobs, self._address_map, lambda bo: (r := live.get(bo.handle)) is not None and r.bo is bo,
                   chained, self._validated, ppu_completes=self.completes_ppu)

    def submit(self, jobs: Sequence[Job], chained: bool = False) -> RocketSubmission:
        jobs = list(jobs)
        self._validate(jobs, chained)
        chain = chained and self.supports_chaining
        tracked = [_Tracked(job, i, self._lane_of(job), None) for i, job in enumerate(jobs)]
        if self.job_checks.fences:
            room = self._max_tracked - sum(t.witness is not None for t in self._outstanding)
            for t in tracked[:max(room, 0)]:
                t.witness = self._take_witness()
        lists = [self._handle_lists(t, tracked[:i]) for i, t in enumerate(tracked)]

        start = 0
        while start < len(tracked):  # one SUBMIT per run of jobs on the same lane, in order
            end = start
            while end < len(tracked) and tracked[end].lane == tracked[start].lane:
                end += 1
            self._submit_run(tracked[start:end], lists[start:end], chain)
            start = end

        c = self._counters
        c.jobs += len(jobs)
        for job in jobs:
            n = len(job.tasks)
            c.tasks += n
            c.kicks += -(-n // uapi.CHAIN_TASKS_PER_KICK) if chain else n
        dropped = self._check_queued(tracked) if self.job_checks.fences else []
        self._outstanding.extend(tracked)
        return RocketSubmission(jobs, tracked, dropped)

    def _handle_lists(self, t: _Tracked, earlier: list[_Tracked]) -> tuple[list[int], list[int]]:
        """In/out handles of a job in its lane's fd.

        * no BO twice, and a BO both read and written only in the out list: the
          kernel locks the reservations of both lists together and a repeated
          object fails the lock, which drops the job;
        * the witness goes to the out list;
        * write-after-read across lanes: a job only gets a fence on its out BOs,
          so a later writer on another lane would not wait for an earlier
          reader. The writer lists each such reader's witness as an input (it
          waits for that job) or, without witnesses, readers on a multi-lane
          device list what they read as outputs.
        """
        job, lane = t.job, t.lane
        outs = _unique(job.out_bos)
        out_ids = {id(b) for b in outs}
        ins = [b for b in _unique(job.in_bos) if id(b) not in out_ids]
        if self.lanes > 1 and t.witness is None:
            outs, ins = outs + ins, []
        in_handles = [self._record(b).handles[lane] for b in ins]
        out_handles = [self._record(b).handles[lane] for b in outs]
        if self.lanes > 1:
            waits = []
            for reader in self._outstanding + earlier:
                if reader.lane != lane and reader.witness is not None and \
                        any(id(b) in out_ids for b in reader.job.in_bos):
                    waits.append(reader.witness.handles[lane])
            in_handles += list(dict.fromkeys(waits))
        if t.witness is not None:
            out_handles.append(t.witness.handles[lane])
        return in_handles, out_handles

    def _submit_run(self, run: list[_Tracked], lists: list[tuple[list[int], list[int]]], chain: bool) -> None:
        job_type = (uapi.RocketJobV13 if self.completes_ppu else
                    uapi.RocketJobV11 if self.supports_chaining else uapi.RocketJob)
        keep = []  # the kernel reads these through pointers during the ioctl
        jobs = (job_type * len(run))()
        for slot, t, (ins, outs) in zip(jobs, run, lists):
            tasks = (uapi.RocketTask * len(t.job.tasks))(
                *[uapi.RocketTask(regcmd=task.regcmd_iova, regcmd_count=task.regcmd_count) for task in t.job.tasks])
            in_arr = (ctypes.c_uint32 * len(ins))(*ins)
            out_arr = (ctypes.c_uint32 * len(outs))(*outs)
            keep += [tasks, in_arr, out_arr]
            slot.tasks = ctypes.addressof(tasks)
            slot.task_count = len(t.job.tasks)
            slot.task_struct_size = ctypes.sizeof(uapi.RocketTask)
            slot.in_bo_handles = ctypes.addressof(in_arr) if ins else 0
            slot.in_bo_handle_count = len(ins)
            slot.out_bo_handles = ctypes.addressof(out_arr) if outs else 0
            slot.out_bo_handle_count = len(outs)
            if chain:
                slot.flags = uapi.DRM_ROCKET_JOB_CHAIN
            if self.completes_ppu:
                # rkc's tasks start the DPU or the PPU, never both (pooling is a PPU-only
                # task), so either interrupt ends exactly the task that raised it
                slot.flags |= uapi.DRM_ROCKET_JOB_IRQ_MASK
                slot.irq_mask = uapi.irq_mask_of(("DPU", "PPU"))
        arg = uapi.RocketSubmit(jobs=ctypes.addressof(jobs), job_count=len(run),
                                job_struct_size=ctypes.sizeof(job_type), reserved=0)
        try:
            self.kernel.ioctl(self._fds[run[0].lane], uapi.DRM_IOCTL_ROCKET_SUBMIT, arg)
        except OSError as exc:
            names = ", ".join(job_name(t.job, t.index) for t in run)
            raise RocketError(f"SUBMIT of {names} failed: {os.strerror(exc.errno or errno.EIO)}") from None
        self._counters.submits += 1

    def _check_queued(self, tracked: list[_Tracked]) -> list[_Tracked]:
        """Snapshot each job's fence; return the jobs the kernel provably dropped.

        Walk each lane backwards: jobs of one fd finish in order, so a job whose
        fence is gone while an earlier job of its lane is still active was
        never queued. (A job that finished before its snapshot and one that was
        dropped look the same otherwise; validation removes every documented
        reason for a drop, so that case is left to the data.)"""
        dropped: list[_Tracked] = []
        by_lane: dict[int, list[_Tracked]] = {}
        for t in tracked:
            by_lane.setdefault(t.lane, []).append(t)
        for lane_jobs in by_lane.values():
            unseen: list[_Tracked] = []
            for t in reversed(lane_jobs):
                if t.witness is None:
                    continue
                sync_fd = self._export_fences(t.witness)
                status = fences.sync_file_status(self.kernel, sync_fd)
                if status.active or status.failed:
                    t.sync_fd = sync_fd
                    dropped += unseen
                    unseen = []
                else:
                    self.kernel.close(sync_fd)
                    unseen.append(t)
        return sorted(dropped, key=lambda t: t.index)

    # --- wait -----------------------------------------------------------------------------

    def wait(self, submission: Submission, timeout_s: float = 5.0) -> None:
        if not isinstance(submission, RocketSubmission):
            raise RocketError("wait() got a submission from another device")
        if submission.done:
            return
        deadline = self._deadline(timeout_s)
        errors: list[Exception] = []
        if submission.dropped:
            names = ", ".join(job_name(t.job, t.index) for t in submission.dropped)
            errors.append(JobDropped(f"{names}: the kernel did not queue this job (SUBMIT returned 0 "
                                     f"but the job has no fence); nothing it should write was written"))
        still_running = []
        for t in submission.tracked:
            timed_out = not self._wait_job(t, deadline)
            if timed_out:
                errors.append(JobTimeout(f"{job_name(t.job, t.index)}: not finished after {timeout_s:g} s"))
                still_running.append(t)
            elif t.sync_fd is not None:
                status = fences.sync_file_status(self.kernel, t.sync_fd)
                if status.failed:
                    errors.append(JobFailed(
                        f"{job_name(t.job, t.index)}: failed on the NPU ({_errno_name(status.status)}: the kernel "
                        f"reset the core, usually after its 500 ms job timeout); its outputs are not valid"))
            if t.sync_fd is not None:
                self.kernel.close(t.sync_fd)
                t.sync_fd = None
            if t.witness is not None and not timed_out:
                self._witness_pool.append(t.witness)
                t.witness = None
        # a job that timed out is still queued: later writers must keep waiting
        # for it and its witness must not go to another job
        self._outstanding = [t for t in self._outstanding if t not in submission.tracked or t in still_running]
        submission.done = True
        if errors:
            more = f" (and {len(errors) - 1} more problem(s) in this submission)" if len(errors) > 1 else ""
            first = errors[0]
            raise type(first)(f"{first}{more}")

    def _wait_job(self, t: _Tracked, deadline: int) -> bool:
        handles = [t.witness.handles[0]] if t.witness is not None else \
            [self._record(b).handles[0] for b in _unique(t.job.out_bos)]
        for handle in handles:
            try:
                self._prep(handle, deadline)
            except OSError as exc:
                if exc.errno in (errno.ETIMEDOUT, errno.EBUSY):
                    return False
                raise RocketError(f"PREP_BO while waiting for {job_name(t.job, t.index)} failed: "
                                  f"{os.strerror(exc.errno or errno.EIO)}") from None
        return True

    # --- the rest of the interface --------------------------------------------------------

    def describe(self) -> dict:
        """What the device found at open (for `rkc doctor` and `rkc probe`)."""
        return {
            "node": self.node,
            "kernel": self.kernel.name,
            "driver": str(self.version),
            "driver_version": f"{self.version.major}.{self.version.minor}.{self.version.patchlevel}",
            "chained_kicks": self.supports_chaining,
            "ppu_completion": self.completes_ppu,
            "lanes": self.lanes,
            "lane_note": self.lane_note,
            "job_checks": str(self.job_checks),
        }

    def close(self) -> None:
        for record in list(self._bos.values()):
            self._free_record(record)
        self._bos.clear()
        for record in self._witnesses:
            self._free_record(record)
        self._witnesses.clear()
        self._witness_pool.clear()
        for t in self._outstanding:
            if t.sync_fd is not None:
                try:
                    self.kernel.close(t.sync_fd)
                except OSError:
                    pass  # a sync_file of a lost device: nothing left to release
                t.sync_fd = None
        self._outstanding.clear()
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in self._fds:
            try:
                self.kernel.close(fd)  # the kernel releases the handles (and the guard) with the file
            except OSError as exc:
                if exc.errno != errno.EBADF:  # EBADF: closed underneath us already (a lost device)
                    raise
        self._fds = []


def _unique(bos) -> list[BufferObject]:
    seen, out = set(), []
    for b in bos:
        if id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out


def _errno_name(status: int) -> str:
    return errno.errorcode.get(-status, f"error {status}")
