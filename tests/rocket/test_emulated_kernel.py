"""The emulated kernel behaves like rocket at the ioctl boundary (raw structs, no
RocketDevice in the way), and the device notices what the kernel hides."""

from __future__ import annotations

import ctypes
import errno

import numpy as np
import pytest

from rocket_support import IncrementExecutor, put_task, task_entries
from rkc.runtime.device import Job
from rkc.runtime.rocket import JobDropped, RocketDevice, uapi
from rkc.compiler.probe.programs import ppu_pool
from rkc.runtime.rocket import JobRejected
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, IRQ_PATCHED, SHARED_PATCHED, STOCK, EmulatedKernel, UapiMismatch
from rkc.runtime.rocket.sim_executor import SimExecutor


class Raw:
    """A rocket file driven by hand."""

    def __init__(self, kernel: EmulatedKernel, fd: int | None = None) -> None:
        self.k = kernel
        self.fd = fd if fd is not None else kernel.open("/dev/accel/accel0")
        self.keep = []

    def bo(self, size=4096):
        a = uapi.RocketCreateBo(size=size)
        self.k.ioctl(self.fd, uapi.DRM_IOCTL_ROCKET_CREATE_BO, a)
        return a

    def view(self, a):
        return np.frombuffer(self.k.mmap(self.fd, a.size, a.offset), np.uint8)

    def job(self, tasks, ins=(), outs=(), struct=uapi.RocketJob, task_struct_size=8, **fields):
        t = (uapi.RocketTask * max(len(tasks), 1))(*[uapi.RocketTask(r, c) for r, c in tasks])
        i = (ctypes.c_uint32 * max(len(ins), 1))(*ins)
        o = (ctypes.c_uint32 * max(len(outs), 1))(*outs)
        self.keep += [t, i, o]
        return struct(tasks=ctypes.addressof(t), task_count=len(tasks), task_struct_size=task_struct_size,
                      in_bo_handles=ctypes.addressof(i), in_bo_handle_count=len(ins),
                      out_bo_handles=ctypes.addressof(o), out_bo_handle_count=len(outs), **fields)

    def submit(self, jobs, struct=uapi.RocketJob, stride=None, reserved=0, extra=b""):
        size = stride or ctypes.sizeof(struct) + len(extra)
        raw = b"".join((bytes(j.raw()) + extra).ljust(size, b"\0")[:size] for j in jobs)
        buf = ctypes.create_string_buffer(raw, len(raw))
        self.keep.append(buf)
        arg = uapi.RocketSubmit(jobs=ctypes.addressof(buf), job_count=len(jobs), job_struct_size=size,
                                reserved=reserved)
        return self.k.ioctl(self.fd, uapi.DRM_IOCTL_ROCKET_SUBMIT, arg)

    def task(self, rc, src, dst, offset=0):
        """A real 6-entry task in BO `rc` at `offset`, handed to the NPU."""
        view = self.view(rc)
        raw = task_entries(src.dma_address, dst.dma_address).view(np.uint8)
        view[offset: offset + raw.nbytes] = raw
        self.k.ioctl(self.fd, uapi.DRM_IOCTL_ROCKET_FINI_BO, uapi.RocketFiniBo(handle=rc.handle))
        return (rc.dma_address + offset, 6)


def errno_of(fn) -> int:
    with pytest.raises(OSError) as exc:
        fn()
    return exc.value.errno


@pytest.fixture
def raw():
    return Raw(EmulatedKernel(executor=IncrementExecutor()))


def test_first_bo_gets_iova_zero_and_handles_start_at_one(raw):
    a, b = raw.bo(100), raw.bo(100)
    assert (a.dma_address, a.handle) == (0, 1)
    assert (b.dma_address, b.handle) == (4096, 2)
    assert a.offset == 1 << 32 and b.offset == a.offset + 4096


def test_invalid_jobs_are_dropped_silently(raw):
    src, dst, rc = raw.bo(), raw.bo(), raw.bo()
    good = raw.task(rc, src, dst)
    jobs = [
        raw.job([], outs=[dst.handle]),  # no tasks
        raw.job([good], outs=[dst.handle], task_struct_size=4),  # task struct too small
        raw.job([(good[0], 0)], outs=[dst.handle]),  # regcmd_count 0
        raw.job([good], ins=[77], outs=[dst.handle]),  # unknown handle
        raw.job([good], ins=[src.handle, dst.handle], outs=[dst.handle]),  # a BO in both lists
        raw.job([good], ins=[src.handle], outs=[dst.handle]),  # fine
    ]
    assert raw.submit(jobs) == 0
    assert [(d.index, d.reason) for d in raw.k.dropped] == [
        (0, "EINVAL"), (1, "EINVAL"), (2, "EINVAL"), (3, "ENOENT"), (4, "EALREADY")]
    raw.k.progress()
    assert raw.k.jobs_run == 1


def test_submit_level_errors(raw):
    dst = raw.bo()
    job = raw.job([(0, 6)], outs=[dst.handle])
    assert raw.submit([]) == 0
    assert errno_of(lambda: raw.submit([job], stride=32)) == errno.EINVAL
    assert errno_of(lambda: raw.submit([job], reserved=1)) == errno.EINVAL


def test_stock_kernel_reads_40_bytes_of_a_48_byte_job(raw):
    src, dst, rc = raw.bo(), raw.bo(), raw.bo()
    job = raw.job([raw.task(rc, src, dst)], outs=[dst.handle], struct=uapi.RocketJobV11,
                  flags=uapi.DRM_ROCKET_JOB_CHAIN | 0x80, reserved=5)
    assert raw.submit([job], struct=uapi.RocketJobV11) == 0  # flags never seen
    raw.k.progress()
    assert raw.k.jobs_run == 1 and raw.k.kicks[-1].task_number == 1


def test_patched_kernel_checks_flags_and_trailing_bytes():
    raw = Raw(EmulatedKernel(CHAIN_PATCHED, executor=IncrementExecutor()))
    src, dst, rc = raw.bo(), raw.bo(), raw.bo()
    task = raw.task(rc, src, dst)
    bad_flag = raw.job([task], outs=[dst.handle], struct=uapi.RocketJobV11, flags=0x2)
    assert errno_of(lambda: raw.submit([bad_flag], struct=uapi.RocketJobV11)) == errno.EINVAL
    bad_res = raw.job([task], outs=[dst.handle], struct=uapi.RocketJobV11, reserved=1)
    assert errno_of(lambda: raw.submit([bad_res], struct=uapi.RocketJobV11)) == errno.EINVAL
    ok = raw.job([task], outs=[dst.handle], struct=uapi.RocketJobV11)
    assert errno_of(lambda: raw.submit([ok], struct=uapi.RocketJobV11, extra=b"\1\0\0\0")) == errno.E2BIG
    assert raw.submit([ok], struct=uapi.RocketJobV11, extra=b"\0" * 8) == 0  # zeros past the struct are fine
    old = raw.job([task], outs=[dst.handle])  # a 40-byte caller gets flags = 0
    assert raw.submit([old]) == 0
    assert raw.k.dropped == []


def test_prep_fini_close_errors(raw):
    a = raw.bo()
    for request, struct in ((uapi.DRM_IOCTL_ROCKET_PREP_BO, uapi.RocketPrepBo),
                            (uapi.DRM_IOCTL_ROCKET_FINI_BO, uapi.RocketFiniBo)):
        assert errno_of(lambda: raw.k.ioctl(raw.fd, request, struct(handle=a.handle, reserved=1))) == errno.EINVAL
        assert errno_of(lambda: raw.k.ioctl(raw.fd, request, struct(handle=99))) == errno.ENOENT
    assert errno_of(lambda: raw.k.ioctl(raw.fd, uapi.DRM_IOCTL_GEM_CLOSE, uapi.DrmGemClose(handle=99))) \
        == errno.EINVAL


def test_prep_bo_deadline_semantics():
    raw = Raw(EmulatedKernel(executor=IncrementExecutor(), stalled=True))
    src, dst, rc = raw.bo(), raw.bo(), raw.bo()
    raw.submit([raw.job([raw.task(rc, src, dst)], outs=[dst.handle])])
    prep = lambda t: raw.k.ioctl(raw.fd, uapi.DRM_IOCTL_ROCKET_PREP_BO, uapi.RocketPrepBo(handle=dst.handle,
                                                                                        timeout_ns=t))
    now = raw.k.clock_ns()
    assert errno_of(lambda: prep(0)) == errno.EBUSY  # 0 = poll
    assert errno_of(lambda: prep(now - 1)) == errno.EBUSY  # a deadline in the past polls too
    assert errno_of(lambda: prep(now + 10**9)) == errno.ETIMEDOUT
    assert raw.k.ioctl(raw.fd, uapi.DRM_IOCTL_ROCKET_PREP_BO, uapi.RocketPrepBo(handle=src.handle)) >= 0


def test_mmap_needs_a_handle_in_that_file(raw):
    a = raw.bo()
    other = raw.k.open("/dev/accel/accel0")
    assert errno_of(lambda: raw.k.mmap(other, a.size, a.offset)) == errno.EACCES
    assert errno_of(lambda: raw.k.mmap(raw.fd, a.size + 4096, a.offset)) == errno.EINVAL


def test_wrong_request_encoding_is_a_marshalling_bug(raw):
    short = uapi.ioc(uapi.IOC_READ | uapi.IOC_WRITE, uapi.DRM_IOCTL_BASE, 0x40, 16)
    with pytest.raises(UapiMismatch, match="DRM_IOCTL_ROCKET_CREATE_BO"):
        raw.k.ioctl(raw.fd, short, ctypes.create_string_buffer(16))
    with pytest.raises(UapiMismatch, match="argument of 16 bytes"):
        raw.k.ioctl(raw.fd, uapi.DRM_IOCTL_ROCKET_CREATE_BO, ctypes.create_string_buffer(16))
    assert errno_of(lambda: raw.k.ioctl(raw.fd, uapi.ioc(1, uapi.DRM_IOCTL_BASE, 0x47, 8),
                                        ctypes.create_string_buffer(8))) == errno.EINVAL


def test_write_after_read_is_not_ordered_by_the_kernel():
    """Control for the device's WAR handling: job A reads X, job B (another
    file) then writes X. The kernel gives A no fence on X, so B can run first."""
    k = EmulatedKernel(executor=IncrementExecutor(), shared_address_space=True, policy="adversarial")
    a, b = Raw(k), Raw(k, k.open("/dev/accel/accel0"))
    x, y, z, rc = a.bo(), a.bo(), a.bo(), a.bo()
    dmabuf = uapi.DrmPrimeHandle(handle=x.handle, flags=uapi.DRM_CLOEXEC)
    k.ioctl(a.fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, dmabuf)
    imp = uapi.DrmPrimeHandle(fd=dmabuf.fd)
    k.ioctl(b.fd, uapi.DRM_IOCTL_PRIME_FD_TO_HANDLE, imp)
    for h in (rc, z):
        d = uapi.DrmPrimeHandle(handle=h.handle)
        k.ioctl(a.fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, d)
        k.ioctl(b.fd, uapi.DRM_IOCTL_PRIME_FD_TO_HANDLE, d)
    read_x = a.task(rc, x, y, 0)  # y = x + 1
    write_x = a.task(rc, z, x, 64)  # x = z + 1
    a.submit([a.job([read_x], ins=[x.handle], outs=[y.handle])])
    b.submit([b.job([write_x], outs=[imp.handle])])
    k.progress()
    k.ioctl(a.fd, uapi.DRM_IOCTL_ROCKET_PREP_BO, uapi.RocketPrepBo(handle=y.handle))
    assert a.view(y)[0] == 2  # A read the x that B wrote (1): the hazard is real here


def test_import_into_another_file_maps_nothing_on_a_stock_kernel():
    k = EmulatedKernel(executor=IncrementExecutor())
    a, b = Raw(k), Raw(k, k.open("/dev/accel/accel0"))
    src, dst, rc = a.bo(), a.bo(), a.bo()
    task = a.task(rc, src, dst)
    handles = []
    for bo in (src, dst, rc):
        d = uapi.DrmPrimeHandle(handle=bo.handle)
        k.ioctl(a.fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, d)
        i = uapi.DrmPrimeHandle(fd=d.fd)
        k.ioctl(b.fd, uapi.DRM_IOCTL_PRIME_FD_TO_HANDLE, i)
        handles.append(i.handle)
    b.submit([b.job([task], ins=handles[:1], outs=handles[1:2])])
    k.progress()
    assert "IOMMU fault" in k.log[-1]  # same GEM object, but not mapped in b's domain


def test_device_reports_a_job_the_kernel_dropped():
    k = EmulatedKernel(executor=IncrementExecutor(), push_errors={1: errno.ENOMEM})
    dev = RocketDevice(kernel=k, quiet=True)
    src, dst, rc = dev.create_bo(4096), dev.create_bo(4096), dev.create_bo(4096)
    tasks = [put_task(rc, 64 * i, task_entries(src.iova, dst.iova)) for i in range(3)]
    dev.finish_cpu_access(rc)
    jobs = [Job([t], in_bos=[src, rc], out_bos=[dst], label=f"segment 0 job {i}") for i, t in enumerate(tasks)]
    sub = dev.submit(jobs)
    with pytest.raises(JobDropped, match="^segment 0 job 1: the kernel did not queue this job"):
        dev.wait(sub)
    assert k.jobs_run == 2
    dev.close()


def test_no_false_drop_reports_when_jobs_finish_before_the_check():
    k = EmulatedKernel(executor=IncrementExecutor(), schedule="eager")
    dev = RocketDevice(kernel=k, quiet=True)
    src, dst, rc = dev.create_bo(4096), dev.create_bo(4096), dev.create_bo(4096)
    task = put_task(rc, 0, task_entries(src.iova, dst.iova))
    dev.finish_cpu_access(rc)
    dev.run([Job([task], in_bos=[src, rc], out_bos=[dst], label=f"j{i}") for i in range(4)])
    assert k.jobs_run == 4
    dev.close()


def test_sync_file_info_lists_the_fences():
    k = EmulatedKernel(executor=IncrementExecutor(), stalled=True)
    raw = Raw(k)
    src, dst, rc = raw.bo(), raw.bo(), raw.bo()
    raw.submit([raw.job([raw.task(rc, src, dst)], outs=[dst.handle])])
    d = uapi.DrmPrimeHandle(handle=dst.handle, flags=uapi.DRM_CLOEXEC)
    k.ioctl(raw.fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, d)
    e = uapi.DmaBufExportSyncFile(flags=uapi.DMA_BUF_SYNC_READ)
    k.ioctl(d.fd, uapi.DMA_BUF_IOCTL_EXPORT_SYNC_FILE, e)
    info = uapi.SyncFileInfo()
    k.ioctl(e.fd, uapi.SYNC_IOC_FILE_INFO, info)
    assert (info.status, info.num_fences) == (0, 1)
    fences = (uapi.SyncFenceInfo * 1)()
    info = uapi.SyncFileInfo(num_fences=1, sync_fence_info=ctypes.addressof(fences))
    k.ioctl(e.fd, uapi.SYNC_IOC_FILE_INFO, info)
    assert (fences[0].driver_name, fences[0].obj_name, fences[0].status) == (b"drm_sched", b"rockchip-npu", 0)
    assert errno_of(lambda: k.ioctl(e.fd, uapi.SYNC_IOC_FILE_INFO, uapi.SyncFileInfo(flags=1))) == errno.EINVAL
    assert errno_of(lambda: k.ioctl(d.fd, uapi.DMA_BUF_IOCTL_EXPORT_SYNC_FILE,
                                    uapi.DmaBufExportSyncFile(flags=4))) == errno.EINVAL
    s = uapi.DmaBufExportSyncFile(flags=uapi.DMA_BUF_SYNC_READ)  # src has no writer: the signalled stub
    d2 = uapi.DrmPrimeHandle(handle=src.handle)
    k.ioctl(raw.fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, d2)
    k.ioctl(d2.fd, uapi.DMA_BUF_IOCTL_EXPORT_SYNC_FILE, s)
    info = uapi.SyncFileInfo()
    k.ioctl(s.fd, uapi.SYNC_IOC_FILE_INFO, info)
    assert (info.status, info.name) == (1, b"stub")


# --- kernel/patches/0005: a job-level interrupt mask (DRM_ROCKET_JOB_IRQ_MASK, driver 1.3) lets a
# PPU-only pooling task complete; stock kernels keep waiting for the DPU and time the job out.

DPU_PPU = uapi.irq_mask_of(("DPU", "PPU"))


def test_uapi_mask_bits_are_the_pc_interrupt_bits():
    assert uapi.irq_mask_of(("DPU",)) == 0x300 and uapi.irq_mask_of(("PPU",)) == 0xC00 and DPU_PPU == 0xF00
    assert uapi.irq_blocks_of(0x400) == ("PPU",) and uapi.irq_blocks_of(0xF00) == ("DPU", "PPU")
    assert uapi.JOB_STRUCT_SIZE_V11 == 48 == uapi.ctypes.sizeof(uapi.RocketJobV13)


def _one_job(raw, **fields):
    rc, src, dst = raw.bo(), raw.bo(), raw.bo()
    task = raw.task(rc, src, dst)
    return raw.job([task], ins=[src.handle], outs=[dst.handle], struct=uapi.RocketJobV13, **fields)


@pytest.mark.parametrize("fields, code", [
    (dict(flags=1 << 2), errno.EINVAL),  # unknown flag
    (dict(irq_mask=0x400), errno.EINVAL),  # a mask without the flag: reserved must stay zero
    (dict(flags=uapi.DRM_ROCKET_JOB_IRQ_MASK, irq_mask=0), errno.EINVAL),  # nothing would end the job
    (dict(flags=uapi.DRM_ROCKET_JOB_IRQ_MASK, irq_mask=0x1000), errno.EINVAL),  # DMA error bit, not a block
])
def test_patched_kernel_checks_the_mask(fields, code):
    raw = Raw(EmulatedKernel(IRQ_PATCHED, executor=IncrementExecutor()))
    assert errno_of(lambda: raw.submit([_one_job(raw, **fields)], struct=uapi.RocketJobV13)) == code


@pytest.mark.parametrize("variant", [CHAIN_PATCHED, SHARED_PATCHED], ids=lambda v: v.name[:10])
def test_older_patched_kernels_refuse_the_flag(variant):
    raw = Raw(EmulatedKernel(variant, executor=IncrementExecutor()))
    job = _one_job(raw, flags=uapi.DRM_ROCKET_JOB_IRQ_MASK, irq_mask=0xC00)
    assert errno_of(lambda: raw.submit([job], struct=uapi.RocketJobV13)) == errno.EINVAL


def test_a_dpu_task_masked_to_the_ppu_never_completes():
    """The mask is honoured, not just accepted: a DPU task on a PPU-only mask times out."""
    k = EmulatedKernel(IRQ_PATCHED, executor=IncrementExecutor())
    raw = Raw(k)
    raw.submit([_one_job(raw, flags=uapi.DRM_ROCKET_JOB_IRQ_MASK, irq_mask=0xC00)], struct=uapi.RocketJobV13)
    raw.submit([_one_job(raw, flags=uapi.DRM_ROCKET_JOB_IRQ_MASK, irq_mask=0x300)], struct=uapi.RocketJobV13)
    k.progress()
    assert [("timed out" in line) for line in k.log] == [True]
    assert k.jobs_run == 2


def _device(variant):
    return RocketDevice(kernel=EmulatedKernel(variant, executor=SimExecutor()), quiet=True)


def test_ppu_pool_completes_on_the_patched_kernel_and_matches_numpy():
    with _device(IRQ_PATCHED) as dev:
        assert dev.completes_ppu and dev.describe()["ppu_completion"] is True
        run = ppu_pool(dev)
    for got, want in run.exact.values():
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("variant", [STOCK, SHARED_PATCHED], ids=lambda v: v.name[:10])
def test_stock_kernel_refuses_a_ppu_task_before_submit(variant):
    with _device(variant) as dev:
        assert not dev.completes_ppu
        with pytest.raises(JobRejected, match="does not start the DPU.*0005"):
            ppu_pool(dev)


def test_stock_kernel_times_out_a_ppu_task_submitted_anyway():
    """Past the device's check (raw SUBMIT), the stock kernel waits for the DPU: timeout, errored fence."""
    from rkc.compiler.npu import api
    from rkc.compiler.npu.dispatch import emit
    from rkc.runtime.rocket.executors import TraceExecutor
    X = api.Feature("X", 0, 8, 4, 4, "fp16")
    Y = api.Feature("Y", 0, 8, 2, 2, "fp16")
    result = emit(api.Pool(X, Y, "max", (2, 2), (2, 2), name="pool"), api.EmitOptions(ppu_completes=True))
    for variant, times_out in ((SHARED_PATCHED, True), (IRQ_PATCHED, False)):
        trace = TraceExecutor()  # checks the task can start and what ends it; addresses stay unrelocated (0)
        k = EmulatedKernel(variant, executor=trace)
        raw = Raw(k)
        rc, buf = raw.bo(64 * 1024), raw.bo(64 * 1024)
        entries = result.tasks[0].regcmd
        view = raw.view(rc)
        view[: entries.nbytes] = entries.view(np.uint8)
        raw.k.ioctl(raw.fd, uapi.DRM_IOCTL_ROCKET_FINI_BO, uapi.RocketFiniBo(handle=rc.handle))
        mask = dict(flags=uapi.DRM_ROCKET_JOB_IRQ_MASK, irq_mask=0xC00) if variant.irq_mask else {}
        job = raw.job([(rc.dma_address, len(entries))], outs=[buf.handle],
                      struct=uapi.RocketJobV13 if variant.irq_mask else uapi.RocketJobV11, **mask)
        raw.submit([job], struct=uapi.RocketJobV13 if variant.irq_mask else uapi.RocketJobV11)
        k.progress()
        assert any("timed out" in line for line in k.log) == times_out
        assert len(trace.tasks) == (0 if times_out else 1)
