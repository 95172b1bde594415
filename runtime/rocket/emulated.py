"""An emulated rocket kernel at the ioctl boundary.

It implements KernelInterface, so RocketDevice runs its real marshalling against
it: it receives the raw request numbers and the struct bytes (and follows the
user pointers inside SUBMIT and the sync_file/VERSION structs, as
copy_from_user/copy_to_user would), and answers like drivers/accel/rocket of
Linux 6.18 (rocket_drv.c 525ad89dd904, rocket_gem.c 0eaed89c18ae,
rocket_job.c 0755a4e3e809 in torvalds/linux), optionally with this
repository's kernel/ patch 0003 (chained kicks, driver 1.1) and 0005 (a job
names the PC interrupts that end it, so PPU-only tasks complete, driver 1.3):

* files: one IOMMU domain and address allocator per file (drm_mm, page
  aligned, best fit from the aperture start, so the first BO gets IOVA 0), GEM
  handles from 1 (lowest free), fake mmap offsets from 1 << 32;
* CREATE_BO / GEM_CLOSE / mmap (only on a file holding a handle); PREP_BO and
  FINI_BO check `reserved` and handles, PREP_BO takes an absolute
  CLOCK_MONOTONIC deadline (0 = poll: -EBUSY, else -ETIMEDOUT) and returns the
  jiffies left on success, like the 6.18 driver;
* the CPU cache: a mapping is the CPU's view; FINI_BO writes back what the CPU
  changed, PREP_BO refreshes the view from memory (and discards CPU writes not
  written back). Forgetting either gives stale data here, as on the board;
* SUBMIT: job_count 0 is a no-op; job_struct_size < 40 or reserved != 0 fail;
  each job is copied with the caller's stride; a job with no tasks, a
  task_struct_size < 8, a task with regcmd_count 0, an unknown BO handle or a
  BO listed twice (the reservation lock fails) is dropped silently while the
  ioctl returns 0; the patched kernel also checks `flags`/`reserved` of every
  job (whole ioctl -EINVAL) and bytes past its struct (-E2BIG);
* implicit sync: a job waits for the write fences of its in-BOs and all fences
  of its out-BOs, and its fence becomes a write fence of every out-BO only
  (write-after-read is not ordered); jobs of one file run in order (one
  drm_sched entity per file), files are independent;
* PRIME export/import (a same-device import is the same GEM object, mapped
  only in the exporter's domain), DMA_BUF_IOCTL_EXPORT_SYNC_FILE and
  SYNC_IOC_FILE_INFO, which the device uses to see job fences.

Execution: jobs run on `progress()` (lazily when someone waits: PREP_BO, file
close) or right after SUBMIT (`schedule="eager"`); among files the "fifo" policy
runs jobs in submission order, "adversarial" runs the most recent runnable job
first, which exposes missing dependencies. Each kick goes to
executors.run_kick; an IOMMU fault or a hang fails the job like the 500 ms
timeout does: the fence signals with -ECANCELED and the task stops.

Options model kernels that do not exist upstream: `shared_address_space`
makes all files share one IOMMU domain (kernel/patches/0004, which the
SHARED_PATCHED variant carries; False there models shared_vm=N), `stalled` keeps jobs from ever finishing (deadline
tests), `push_errors` fails chosen jobs inside the kernel (-ENOMEM and the like,
which no userspace check can foresee). Requests that the UAPI does not define raise UapiMismatch: the real
kernel would silently read the wrong number of bytes, so it is always a bug in
the caller.
"""

from __future__ import annotations

import ctypes
import errno
import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from rkc.runtime.rocket import uapi
from rkc.runtime.rocket.executors import PAGE, Executor, NpuFault, NpuModel, PcModel, TraceExecutor
from rkc.runtime.rocket.kernel import sort_nodes

APERTURE = (0, 1 << 32)  # rockchip IOMMU: 32-bit IOVAs from 0
MMAP_OFFSET_START = 1 << 32  # DRM_FILE_PAGE_OFFSET_START on 64-bit, in bytes
JOB_TIMEOUT_MS = 500
HZ = 250  # arm64 defconfig: jiffies of 4 ms


class UapiMismatch(AssertionError):
    """The caller encoded an ioctl the UAPI does not define (a marshalling bug)."""


@dataclass(frozen=True)
class KernelVariant:
    name: str
    version: tuple[int, int, int]
    job_flags: bool  # understands drm_rocket_job.flags (kernel/ patch 0003)
    shares_address_space: bool = False  # the files of one process share one domain (patch 0004)
    irq_mask: bool = False  # takes drm_rocket_job.irq_mask / DRM_ROCKET_JOB_IRQ_MASK (patch 0005)

    @property
    def job_struct_size(self) -> int:
        return uapi.JOB_STRUCT_SIZE_V11 if self.job_flags else uapi.JOB_STRUCT_SIZE_V10


STOCK = KernelVariant("rocket 0.0.0 (Linux 6.18, stock)", (0, 0, 0), False)
CHAIN_PATCHED = KernelVariant("rocket 1.1.0 (kernel/ patch 0003: chained kicks)", (1, 1, 0), True)
SHARED_PATCHED = KernelVariant("rocket 1.2.0 (kernel/ patches 0003 + 0004: chained kicks, one address "
                               "space per process)", (1, 2, 0), True, shares_address_space=True)
IRQ_PATCHED = KernelVariant("rocket 1.3.0 (kernel/ patches 0003-0005: chained kicks, one address space per "
                            "process, job-level interrupt mask)", (1, 3, 0), True, shares_address_space=True,
                            irq_mask=True)


def _oserror(code: int) -> OSError:
    return OSError(code, errno.errorcode.get(code, "?"))


def _copy_from_user(ptr: int, size: int) -> bytes:
    if size and not ptr:
        raise _oserror(errno.EFAULT)
    return ctypes.string_at(ptr, size) if size else b""


def _copy_to_user(ptr: int, data: bytes) -> None:
    if data:
        if not ptr:
            raise _oserror(errno.EFAULT)
        ctypes.memmove(ptr, data, len(data))


# --- kernel objects ---------------------------------------------------------------------

class Fence:
    def __init__(self, context: int, seqno: int, driver: str = "drm_sched") -> None:
        self.context, self.seqno, self.driver = context, seqno, driver
        self.signaled = False
        self.error = 0

    def signal(self, error: int = 0) -> None:
        self.error, self.signaled = error, True

    @property
    def status(self) -> int:
        return self.error if self.error else (1 if self.signaled else 0)


class Domain:
    """An IOMMU domain with its drm_mm: page table plus address allocator."""

    def __init__(self) -> None:
        self.pages: dict[int, tuple["GemObject", int]] = {}
        self.nodes: dict[int, int] = {}  # start -> size (drm_mm nodes)
        self.objects: dict[int, "GemObject"] = {}  # start -> mapped object

    def alloc(self, size: int) -> int:
        """Best fit, PAGE aligned (drm_mm_insert_node_generic, DRM_MM_INSERT_BEST)."""
        lo, hi = APERTURE
        holes, cursor = [], lo
        for start in sorted(self.nodes):
            holes.append((cursor, start))
            cursor = max(cursor, start + self.nodes[start])
        holes.append((cursor, hi))
        best = None
        for a, b in holes:
            s = -(-a // PAGE) * PAGE
            if s + size <= b and (best is None or b - a < best[1] - best[0]):
                best = (a, b, s)
        if best is None:
            raise _oserror(errno.ENOSPC)
        self.nodes[best[2]] = size
        return best[2]

    def map(self, iova: int, obj: "GemObject") -> None:
        for i in range(obj.npages):
            self.pages[iova // PAGE + i] = (obj, i)
        self.objects[iova] = obj

    def unmap(self, iova: int, obj: "GemObject") -> None:
        for i in range(obj.npages):
            self.pages.pop(iova // PAGE + i, None)
        self.nodes.pop(iova, None)
        self.objects.pop(iova, None)

    def lookup(self, page: int):
        hit = self.pages.get(page)
        return None if hit is None else (hit[0].dram, hit[1] * PAGE)

    def mappings(self) -> list[tuple[int, int, bytearray]]:
        return [(iova, obj.npages * PAGE, obj.dram) for iova, obj in sorted(self.objects.items())]


class GemObject:
    def __init__(self, size: int, domain: Domain, mmap_offset: int) -> None:
        self.size = size
        self.npages = -(-size // PAGE)
        nbytes = self.npages * PAGE
        self.dram = bytearray(nbytes)  # what the NPU sees
        self.cpu = bytearray(nbytes)  # the CPU's (cached) view, what mmap shows
        self.clean = bytearray(nbytes)  # the CPU view as of the last sync: diff = dirty lines
        self.fences: list[tuple[Fence, bool]] = []  # (fence, is_write)
        self.domain = domain
        self.iova = domain.alloc(size)
        domain.map(self.iova, self)
        self.mmap_offset = mmap_offset
        self.refs = 0  # handles + mappings + dma-bufs + queued jobs
        self.freed = False

    def pending(self, writes_only: bool) -> list[Fence]:
        return [f for f, w in self.fences if not f.signaled and (w or not writes_only)]

    def add_write_fence(self, fence: Fence) -> None:
        # dma_resv_add_fence: a later fence of the same context replaces an
        # earlier one, and signalled fences are pruned.
        self.fences = [(f, w) for f, w in self.fences if not f.signaled and f.context != fence.context]
        self.fences.append((fence, True))

    def sync_for_device(self) -> None:
        cpu, clean = np.frombuffer(self.cpu, np.uint8), np.frombuffer(self.clean, np.uint8)
        dirty = cpu != clean
        np.frombuffer(self.dram, np.uint8)[dirty] = cpu[dirty]
        self.clean[:] = self.cpu

    def sync_for_cpu(self) -> None:
        self.cpu[:] = self.dram
        self.clean[:] = self.dram


@dataclass(eq=False)
class EmJob:
    file: "RocketFile"
    tasks: list[tuple[int, int]]
    in_objs: list[GemObject]
    out_objs: list[GemObject]
    chain: bool
    deps: list[Fence]
    fence: Fence
    seq: int
    core: int | None = None
    irq_blocks: tuple[str, ...] | None = None  # whose interrupt ends a kick (patch 0005's irq_mask; None: stock)


class RocketFile:
    def __init__(self, fd: int, node: str, domain: Domain, context: int) -> None:
        self.fd, self.node, self.domain = fd, node, domain
        self.handles: dict[int, GemObject] = {}
        self.entity: deque[EmJob] = deque()
        self.context = context
        self.seqno = 0

    def new_handle(self, obj: GemObject) -> int:
        h = 1
        while h in self.handles:
            h += 1
        self.handles[h] = obj
        obj.refs += 1
        return h

    def lookup(self, handle: int) -> GemObject:
        obj = self.handles.get(handle)
        if obj is None:
            raise _oserror(errno.ENOENT)
        return obj


@dataclass(eq=False)
class OtherFile:
    """An accel node of another driver: it only answers DRM_IOCTL_VERSION."""

    fd: int
    node: str
    driver: str


@dataclass(eq=False)
class DmaBufFile:
    fd: int
    obj: GemObject


@dataclass(eq=False)
class SyncFile:
    fd: int
    fences: list[Fence]


@dataclass
class KickRecord:
    fd: int
    core: int
    regcmd: int
    regcmd_count: int
    task_number: int


@dataclass
class DroppedJob:
    fd: int
    index: int
    reason: str


# --- the kernel -------------------------------------------------------------------------

class EmulatedKernel:
    """KernelInterface for tests and `rkc probe` on machines without an NPU."""

    def __init__(self, variant: KernelVariant = STOCK, *, nodes: dict[str, str] | None = None,
                 cores: int = 3, executor: Executor | NpuModel | None = None, schedule: str = "lazy",
                 policy: str = "fifo", shared_address_space: bool | None = None, hw_chain: bool = True,
                 stalled: bool = False, denied: tuple[str, ...] = (),
                 push_errors: dict[int, int] | None = None) -> None:
        if schedule not in ("lazy", "eager") or policy not in ("fifo", "adversarial"):
            raise ValueError(f"schedule {schedule!r} / policy {policy!r}")
        self.variant = variant
        self.nodes = nodes if nodes is not None else {"/dev/accel/accel0": "rocket"}
        self.cores = cores
        self.executor = executor if executor is not None else TraceExecutor()
        # a task-level executor gets the PC model; a job-level one (the simulator) brings its own
        self.npu: NpuModel = self.executor if hasattr(self.executor, "run_job") else PcModel(self.executor)
        self.schedule, self.policy = schedule, policy
        # None: as the variant does (its shared_vm default); the emulator has one process
        self.shared_address_space = (variant.shares_address_space if shared_address_space is None
                                     else shared_address_space)
        self.hw_chain = hw_chain  # /sys/module/rocket/parameters/hw_chain of patch 0003
        self.stalled = stalled
        self.denied = set(denied)
        # fault injection: the n-th job pushed (0-based, over all SUBMITs) fails
        # with this errno inside the kernel, e.g. ENOMEM from kvmalloc
        self.push_errors = dict(push_errors or {})
        self._pushed = 0
        self.name = f"emulated {variant.name}" + (", shared address space" if self.shared_address_space else "")

        self._files: dict[int, object] = {}
        self._next_fd = 1000  # far from real descriptors, so a mix-up fails loudly
        self._next_context = 1
        self._next_offset = MMAP_OFFSET_START
        self._offsets: dict[int, GemObject] = {}
        self._mappings: dict[int, tuple[memoryview, GemObject]] = {}
        self._shared_domain = Domain()
        self._seq = 0
        self._core_rr = 0
        # observations for tests
        self.calls: list[tuple[str, int]] = []
        self.dropped: list[DroppedJob] = []
        self.kicks: list[KickRecord] = []
        self.log: list[str] = []
        self.jobs_run = 0

    def live_objects(self) -> int:
        """GEM objects not yet freed (handles, mappings, dma-bufs or queued jobs hold them)."""
        return len(self._offsets)

    # --- KernelInterface -------------------------------------------------------------------

    def list_nodes(self) -> list[str]:
        by_name = {p.rsplit("/", 1)[-1]: p for p in self.nodes}
        return [by_name[n] for n in sort_nodes(by_name)]

    def open(self, path: str) -> int:
        if path not in self.nodes:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if path in self.denied:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        fd = self._alloc_fd()
        if self.nodes[path] == "rocket":
            domain = self._shared_domain if self.shared_address_space else Domain()
            self._files[fd] = RocketFile(fd, path, domain, self._next_context)
            self._next_context += 1
        else:
            self._files[fd] = OtherFile(fd, path, self.nodes[path])
        return fd

    def close(self, fd: int) -> None:
        f = self._files.pop(fd, None)
        if f is None:
            raise _oserror(errno.EBADF)
        if isinstance(f, RocketFile):
            self.progress()  # drm_sched_entity_flush: the file's queued jobs still run
            for job in f.entity:  # ... and what cannot run is killed (drm_sched_entity_kill)
                job.fence.signal(-errno.ESRCH)
                for o in job.in_objs + job.out_objs:
                    self._put(o)
            f.entity.clear()
            for obj in f.handles.values():
                self._put(obj)
            f.handles.clear()
        elif isinstance(f, DmaBufFile):
            self._put(f.obj)

    def mmap(self, fd: int, length: int, offset: int):
        f = self._file(fd, RocketFile)
        obj = self._offsets.get(offset)
        if obj is None or obj.freed:
            raise _oserror(errno.EINVAL)
        if obj not in f.handles.values():
            raise _oserror(errno.EACCES)  # drm_vma_node_is_allowed
        if length > obj.npages * PAGE:
            raise _oserror(errno.EINVAL)
        view = memoryview(obj.cpu)[:length]
        obj.refs += 1
        self._mappings[id(view)] = (view, obj)
        return view

    def munmap(self, mapping) -> None:
        view, obj = self._mappings[id(mapping)]
        view.release()  # BufferError while a numpy view still uses it, like mmap.close()
        del self._mappings[id(mapping)]
        self._put(obj)

    def clock_ns(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)

    def ioctl(self, fd: int, request: int, arg) -> int:
        handler = self._HANDLERS.get(request)
        buf = memoryview(arg).cast("B")
        if handler is None:
            self._unknown(fd, request)
        name, struct, method = handler
        if buf.nbytes != ctypes.sizeof(struct):
            raise UapiMismatch(f"{name}: argument of {buf.nbytes} bytes, the UAPI struct has "
                               f"{ctypes.sizeof(struct)}")
        self.calls.append((name, fd))
        data = struct.from_buffer_copy(buf)
        ret = method(self, fd, data)
        buf[:] = data.raw()  # copy_to_user of the whole struct (the _IOWR ones carry results)
        return ret

    def _unknown(self, fd: int, request: int) -> None:
        d, t, nr, size = uapi.ioc_fields(request)
        for known in self._HANDLERS:
            kd, kt, knr, ksize = uapi.ioc_fields(known)
            if (kt, knr) == (t, nr):
                raise UapiMismatch(f"request {request:#x} has nr {nr:#x} of {self._HANDLERS[known][0]} but "
                                   f"dir {d} size {size}, the UAPI says dir {kd} size {ksize} ({known:#x})")
        f = self._files.get(fd)
        if f is None:
            raise _oserror(errno.EBADF)
        raise _oserror(errno.EINVAL if isinstance(f, (RocketFile, OtherFile)) else errno.ENOTTY)

    # --- helpers ---------------------------------------------------------------------------

    def _alloc_fd(self) -> int:
        fd = self._next_fd
        self._next_fd += 1
        return fd

    def _file(self, fd: int, kind: type):
        f = self._files.get(fd)
        if f is None:
            raise _oserror(errno.EBADF)
        if not isinstance(f, kind):
            raise _oserror(errno.ENOTTY if kind is not RocketFile else errno.EINVAL)
        return f

    def _put(self, obj: GemObject) -> None:
        obj.refs -= 1
        if obj.refs == 0 and not obj.freed:
            obj.freed = True  # rocket_gem_bo_free: unmap, give the IOVA range back
            obj.domain.unmap(obj.iova, obj)
            self._offsets.pop(obj.mmap_offset, None)

    # --- DRM core ioctls -------------------------------------------------------------------

    def _version(self, fd: int, v: uapi.DrmVersion) -> int:
        f = self._files.get(fd)
        if not isinstance(f, (RocketFile, OtherFile)):
            raise _oserror(errno.ENOTTY)
        if isinstance(f, RocketFile):
            (v.version_major, v.version_minor, v.version_patchlevel) = self.variant.version
            name, desc = "rocket", "rocket DRM"
        else:
            v.version_major, v.version_minor, v.version_patchlevel = 1, 0, 0
            name, desc = f.driver, f"{f.driver} DRM"
        for field_name, value in (("name", name), ("date", "0"), ("desc", desc)):
            raw = value.encode()
            room = getattr(v, field_name + "_len")
            if room:
                _copy_to_user(getattr(v, field_name) or 0, raw[:room])
            setattr(v, field_name + "_len", len(raw))  # drm_copy_field reports the full length
        return 0

    def _gem_close(self, fd: int, a: uapi.DrmGemClose) -> int:
        f = self._file(fd, RocketFile)
        obj = f.handles.pop(a.handle, None)
        if obj is None:
            raise _oserror(errno.EINVAL)  # drm_gem_handle_delete
        self._put(obj)
        return 0

    def _prime_handle_to_fd(self, fd: int, a: uapi.DrmPrimeHandle) -> int:
        f = self._file(fd, RocketFile)
        if a.flags & ~(uapi.DRM_CLOEXEC | uapi.DRM_RDWR):
            raise _oserror(errno.EINVAL)
        obj = f.lookup(a.handle)
        new = self._alloc_fd()
        self._files[new] = DmaBufFile(new, obj)
        obj.refs += 1
        a.fd = new
        return 0

    def _prime_fd_to_handle(self, fd: int, a: uapi.DrmPrimeHandle) -> int:
        f = self._file(fd, RocketFile)
        buf = self._files.get(a.fd)
        if not isinstance(buf, DmaBufFile):
            raise _oserror(errno.EINVAL if buf is not None else errno.EBADF)
        # drm_gem_prime_import_dev: a dma-buf of this device is the same GEM
        # object; rocket maps BOs only at CREATE_BO, so nothing is mapped in
        # this file's domain unless the domain is shared.
        for h, obj in f.handles.items():
            if obj is buf.obj:
                a.handle = h
                return 0
        a.handle = f.new_handle(buf.obj)
        return 0

    # --- rocket ioctls ---------------------------------------------------------------------

    def _create_bo(self, fd: int, a: uapi.RocketCreateBo) -> int:
        f = self._file(fd, RocketFile)
        if a.size == 0:
            raise _oserror(errno.EINVAL)
        obj = GemObject(a.size, f.domain, self._next_offset)
        self._offsets[self._next_offset] = obj
        self._next_offset += obj.npages * PAGE
        a.handle = f.new_handle(obj)
        a.dma_address = obj.iova
        a.offset = obj.mmap_offset
        return 0

    def _prep_bo(self, fd: int, a: uapi.RocketPrepBo) -> int:
        f = self._file(fd, RocketFile)
        if a.reserved:
            raise _oserror(errno.EINVAL)
        obj = f.lookup(a.handle)
        self.progress()
        now = self.clock_ns()
        jiffies = 0 if a.timeout_ns == 0 or a.timeout_ns <= now else math.ceil((a.timeout_ns - now) * HZ / 1e9)
        busy = obj.pending(writes_only=True)
        obj.sync_for_cpu()  # done even after a timeout, like the driver
        if busy:
            raise _oserror(errno.ETIMEDOUT if jiffies else errno.EBUSY)
        return max(jiffies, 1)  # dma_resv_wait_timeout's "time left", returned as is

    def _fini_bo(self, fd: int, a: uapi.RocketFiniBo) -> int:
        f = self._file(fd, RocketFile)
        if a.reserved:
            raise _oserror(errno.EINVAL)
        f.lookup(a.handle).sync_for_device()
        return 0

    def _submit(self, fd: int, a: uapi.RocketSubmit) -> int:
        f = self._file(fd, RocketFile)
        if a.job_count == 0:
            return 0
        if a.job_struct_size < uapi.JOB_STRUCT_SIZE_V10 or a.reserved:
            raise _oserror(errno.EINVAL)
        kstruct = (uapi.RocketJobV13 if self.variant.irq_mask else
                   uapi.RocketJobV11 if self.variant.job_flags else uapi.RocketJob)
        ksize = ctypes.sizeof(kstruct)
        jobs = []
        for i in range(a.job_count):
            raw = _copy_from_user(a.jobs + i * a.job_struct_size, a.job_struct_size)
            if self.variant.job_flags:  # copy_struct_from_user
                if any(raw[ksize:]):
                    raise _oserror(errno.E2BIG)
                job = kstruct.from_buffer_copy(raw[:ksize].ljust(ksize, b"\0"))
                if self.variant.irq_mask:
                    if job.flags & ~uapi.ROCKET_JOB_FLAGS_VALID_V13 or (
                            (job.irq_mask == 0 or job.irq_mask & ~uapi.IRQ_MASK_VALID)
                            if job.flags & uapi.DRM_ROCKET_JOB_IRQ_MASK else job.irq_mask):
                        raise _oserror(errno.EINVAL)
                elif job.flags & ~uapi.ROCKET_JOB_FLAGS_VALID or job.reserved:
                    raise _oserror(errno.EINVAL)
            else:  # copy_from_user(sizeof(struct)): anything past 40 bytes is never read
                job = kstruct.from_buffer_copy(raw[:ksize])
            jobs.append(job)
        for i, job in enumerate(jobs):
            try:
                injected = self.push_errors.get(self._pushed)
                self._pushed += 1
                if injected:
                    raise _oserror(injected)
                self._push_job(f, job)
            except OSError as exc:  # rocket_ioctl_submit ignores per-job errors
                self.dropped.append(DroppedJob(fd, i, errno.errorcode.get(exc.errno, str(exc.errno))))
        if self.schedule == "eager":
            self.progress()
        return 0

    def _push_job(self, f: RocketFile, job) -> None:
        if job.task_count == 0 or job.task_struct_size < uapi.TASK_STRUCT_SIZE:
            raise _oserror(errno.EINVAL)
        tasks = []
        for i in range(job.task_count):
            t = uapi.RocketTask.from_buffer_copy(
                _copy_from_user(job.tasks + i * job.task_struct_size, uapi.TASK_STRUCT_SIZE))
            if t.regcmd_count == 0:
                raise _oserror(errno.EINVAL)
            tasks.append((t.regcmd, t.regcmd_count))
        ins = self._lookup_all(f, job.in_bo_handles, job.in_bo_handle_count)
        outs = self._lookup_all(f, job.out_bo_handles, job.out_bo_handle_count)
        if len({id(o) for o in ins + outs}) != len(ins + outs):
            raise _oserror(errno.EALREADY)  # drm_gem_lock_reservations on an object twice
        deps = [fence for o in ins for fence in o.pending(writes_only=True)]
        deps += [fence for o in outs for fence in o.pending(writes_only=False)]
        f.seqno += 1
        fence = Fence(f.context, f.seqno)
        self._seq += 1
        chain = bool(getattr(job, "flags", 0) & uapi.DRM_ROCKET_JOB_CHAIN) and self.hw_chain
        em = EmJob(f, tasks, ins, outs, chain, deps, fence, self._seq)
        if getattr(job, "flags", 0) & uapi.DRM_ROCKET_JOB_IRQ_MASK:
            em.irq_blocks = uapi.irq_blocks_of(job.irq_mask)
        for o in ins + outs:
            o.refs += 1
        for o in outs:
            o.add_write_fence(fence)
        f.entity.append(em)

    def _lookup_all(self, f: RocketFile, ptr: int, count: int) -> list[GemObject]:
        raw = _copy_from_user(ptr, 4 * count)
        return [f.lookup(h) for h in np.frombuffer(raw, dtype="<u4").tolist()]

    # --- dma-buf / sync_file ---------------------------------------------------------------

    def _export_sync_file(self, fd: int, a: uapi.DmaBufExportSyncFile) -> int:
        buf = self._file(fd, DmaBufFile)
        if not a.flags & (uapi.DMA_BUF_SYNC_READ | uapi.DMA_BUF_SYNC_WRITE) or \
                a.flags & ~(uapi.DMA_BUF_SYNC_READ | uapi.DMA_BUF_SYNC_WRITE):
            raise _oserror(errno.EINVAL)
        pending = buf.obj.pending(writes_only=not a.flags & uapi.DMA_BUF_SYNC_WRITE)
        if not pending:  # dma_fence_get_stub(): already signalled
            stub = Fence(0, 0, driver="stub")
            stub.signal()
            pending = [stub]
        new = self._alloc_fd()
        self._files[new] = SyncFile(new, pending)
        a.fd = new
        return 0

    def _sync_file_info(self, fd: int, a: uapi.SyncFileInfo) -> int:
        sf = self._file(fd, SyncFile)
        if a.flags or a.pad:
            raise _oserror(errno.EINVAL)
        errors = [f.error for f in sf.fences if f.error]
        a.status = errors[0] if errors else (1 if all(f.signaled for f in sf.fences) else 0)
        a.name = b"dma_fence_array" if len(sf.fences) > 1 else sf.fences[0].driver.encode()
        if a.num_fences:
            if a.num_fences < len(sf.fences):
                raise _oserror(errno.EINVAL)
            infos = (uapi.SyncFenceInfo * len(sf.fences))()
            for info, fence in zip(infos, sf.fences):
                info.obj_name = b"rockchip-npu" if fence.driver != "stub" else b"stub"
                info.driver_name = fence.driver.encode()
                info.status = fence.status
            _copy_to_user(a.sync_fence_info, bytes(infos))
        a.num_fences = len(sf.fences)
        return 0

    _HANDLERS = {
        uapi.DRM_IOCTL_VERSION: ("DRM_IOCTL_VERSION", uapi.DrmVersion, _version),
        uapi.DRM_IOCTL_GEM_CLOSE: ("DRM_IOCTL_GEM_CLOSE", uapi.DrmGemClose, _gem_close),
        uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD: ("DRM_IOCTL_PRIME_HANDLE_TO_FD", uapi.DrmPrimeHandle, _prime_handle_to_fd),
        uapi.DRM_IOCTL_PRIME_FD_TO_HANDLE: ("DRM_IOCTL_PRIME_FD_TO_HANDLE", uapi.DrmPrimeHandle, _prime_fd_to_handle),
        uapi.DRM_IOCTL_ROCKET_CREATE_BO: ("DRM_IOCTL_ROCKET_CREATE_BO", uapi.RocketCreateBo, _create_bo),
        uapi.DRM_IOCTL_ROCKET_SUBMIT: ("DRM_IOCTL_ROCKET_SUBMIT", uapi.RocketSubmit, _submit),
        uapi.DRM_IOCTL_ROCKET_PREP_BO: ("DRM_IOCTL_ROCKET_PREP_BO", uapi.RocketPrepBo, _prep_bo),
        uapi.DRM_IOCTL_ROCKET_FINI_BO: ("DRM_IOCTL_ROCKET_FINI_BO", uapi.RocketFiniBo, _fini_bo),
        uapi.DMA_BUF_IOCTL_EXPORT_SYNC_FILE: ("DMA_BUF_IOCTL_EXPORT_SYNC_FILE", uapi.DmaBufExportSyncFile,
                                              _export_sync_file),
        uapi.SYNC_IOC_FILE_INFO: ("SYNC_IOC_FILE_INFO", uapi.SyncFileInfo, _sync_file_info),
    }

    # --- the scheduler and the NPU ---------------------------------------------------------

    def progress(self) -> None:
        """Run every job whose dependencies are met, in the policy's order."""
        if self.stalled:
            return
        while True:
            heads = [f.entity[0] for f in self._files.values()
                     if isinstance(f, RocketFile) and f.entity and all(d.signaled for d in f.entity[0].deps)]
            if not heads:
                return
            job = (min if self.policy == "fifo" else max)(heads, key=lambda j: j.seq)
            self._run(job)

    def _run(self, job: EmJob) -> None:
        job.file.entity.popleft()
        job.core = self._core_rr % self.cores
        self._core_rr += 1
        kicks, i = [], 0
        while i < len(job.tasks):  # what rocket_job_hw_submit programs, kick by kick
            number = min(len(job.tasks) - i, uapi.CHAIN_TASKS_PER_KICK) if job.chain else 1
            iova, count = job.tasks[i]
            self.kicks.append(KickRecord(job.file.fd, job.core, iova, count, number))
            kicks.append(number)
            i += number
        try:
            self.npu.run_job(job.file.domain, job.core, job.tasks, kicks, f"fd {job.file.fd} job {job.seq}",
                             irq_blocks=job.irq_blocks)
            job.fence.signal()
        except NpuFault as exc:
            self.log.append(f"rocket core {job.core}: NPU job timed out ({exc}); core reset")
            job.fence.signal(-errno.ECANCELED)
        self.jobs_run += 1
        for o in job.in_objs + job.out_objs:
            self._put(o)
