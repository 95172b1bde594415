"""RocketDevice against the emulated kernel: opening, BOs, caches, SUBMIT bytes, waits."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from rocket_support import IncrementExecutor, RecordingKernel, chain_tasks, put_task, task_entries
from rkc.runtime.device import Job
from rkc.runtime.rocket import RocketDevice, RocketError, find_rocket_node, scan_nodes, uapi
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from rkc.runtime.rocket.errors import JobFailed, JobTimeout


def open_device(**kw) -> tuple[RocketDevice, EmulatedKernel]:
    kernel_kw = {k: kw.pop(k) for k in list(kw) if k in (
        "variant", "executor", "schedule", "policy", "shared_address_space", "hw_chain", "stalled", "nodes")}
    variant = kernel_kw.pop("variant", STOCK)
    kernel = EmulatedKernel(variant, executor=kernel_kw.pop("executor", IncrementExecutor()), **kernel_kw)
    return RocketDevice(kernel=kernel, quiet=True, **kw), kernel


def one_task_job(dev: RocketDevice, src, dst, label="segment 0 job 0") -> Job:
    rc = dev.create_bo(4096)
    task = put_task(rc, 0, task_entries(src.iova, dst.iova))
    dev.finish_cpu_access(rc)
    return Job([task], in_bos=[src, rc], out_bos=[dst], label=label)


# --- finding the node ---------------------------------------------------------------------

def test_node_found_by_driver_name_not_index():
    kernel = EmulatedKernel(nodes={"/dev/accel/accel0": "ivpu", "/dev/accel/accel1": "amdxdna",
                                   "/dev/accel/accel2": "rocket"})
    assert find_rocket_node(kernel) == "/dev/accel/accel2"
    names = [(n.path, n.driver.name) for n in scan_nodes(kernel)]
    assert names == [("/dev/accel/accel0", "ivpu"), ("/dev/accel/accel1", "amdxdna"),
                     ("/dev/accel/accel2", "rocket")]
    dev = RocketDevice(kernel=kernel, quiet=True)
    assert dev.node == "/dev/accel/accel2"
    dev.close()


def test_numeric_node_order_and_unreadable_nodes():
    kernel = EmulatedKernel(nodes={"/dev/accel/accel10": "rocket", "/dev/accel/accel9": "rocket"},
                            denied=("/dev/accel/accel9",))
    assert kernel.list_nodes() == ["/dev/accel/accel9", "/dev/accel/accel10"]
    nodes = scan_nodes(kernel)
    assert nodes[0].driver is None and "Permission denied" in nodes[0].error
    assert find_rocket_node(kernel) == "/dev/accel/accel10"


def test_no_rocket_node_is_one_clear_error():
    kernel = EmulatedKernel(nodes={"/dev/accel/accel0": "ivpu"})
    assert find_rocket_node(kernel) is None
    with pytest.raises(RocketError, match="no rocket NPU found"):
        RocketDevice(kernel=kernel)


def test_version_read_through_user_pointers():
    dev, _ = open_device(variant=CHAIN_PATCHED)
    assert (dev.version.name, dev.version.version, dev.version.desc) == ("rocket", (1, 1), "rocket DRM")
    assert dev.supports_chaining
    dev.close()
    dev, _ = open_device()
    assert dev.version.version == (0, 0) and not dev.supports_chaining
    dev.close()


# --- BOs ----------------------------------------------------------------------------------

def test_bos_never_sit_at_iova_zero_and_are_page_spaced():
    dev, kernel = open_device()
    bos = [dev.create_bo(n) for n in (1, 4096, 5000, 16)]
    iovas = [b.iova for b in bos]
    assert all(i > 0 and i % 4096 == 0 for i in iovas)
    assert iovas == sorted(iovas) and len(set(iovas)) == len(iovas)
    assert [b.size for b in bos] == [1, 4096, 5000, 16]
    assert all(b.host.nbytes == b.size for b in bos)
    dev.free_bo(bos[1])
    again = dev.create_bo(4096)
    assert again.iova == iovas[1]  # drm_mm best fit takes the freed hole
    with pytest.raises(RocketError, match="not a live BO"):
        dev.free_bo(bos[1])
    with pytest.raises(RocketError, match="cannot create a BO of 0 bytes"):
        dev.create_bo(0)
    dev.close()


def test_cpu_writes_reach_the_npu_only_after_finish_cpu_access():
    dev, kernel = open_device()
    src, dst = dev.create_bo(4096), dev.create_bo(4096)
    job = one_task_job(dev, src, dst)
    src.host[:64] = 7  # written, but not handed back with FINI_BO
    dev.run([job])
    dev.prepare_cpu_access(dst)
    assert (dst.host[:64] == 1).all()  # the NPU read the stale zeros

    src.host[:64] = 7
    dev.finish_cpu_access(src)
    dev.run([job])
    assert (dst.host[:64] == 1).all()  # CPU view is stale until PREP_BO
    dev.prepare_cpu_access(dst)
    assert (dst.host[:64] == 8).all()
    dev.close()


def test_prep_bo_gets_an_absolute_monotonic_deadline():
    kernel = RecordingKernel(EmulatedKernel(executor=IncrementExecutor()))
    dev = RocketDevice(kernel=kernel, quiet=True)
    bo = dev.create_bo(64)
    before = kernel.clock_ns()
    dev.prepare_cpu_access(bo, timeout_s=2.0)
    after = kernel.clock_ns()
    fd, request, raw = kernel.sent[-1]
    assert request == uapi.DRM_IOCTL_ROCKET_PREP_BO
    prep = uapi.RocketPrepBo.from_buffer_copy(raw)
    assert prep.reserved == 0 and prep.handle == bo.handle
    assert before + 2_000_000_000 <= prep.timeout_ns <= after + 2_000_000_000
    dev.close()


# --- SUBMIT marshalling -------------------------------------------------------------------

def submitted(kernel: RecordingKernel):
    """Decode every SUBMIT the device sent: [(fd, submit, [(job, tasks, ins, outs)])]."""
    out = []
    for fd, request, raw in kernel.sent:
        if request != uapi.DRM_IOCTL_ROCKET_SUBMIT:
            continue
        s = uapi.RocketSubmit.from_buffer_copy(raw)
        jobs = []
        for i in range(s.job_count):
            jraw = ctypes.string_at(s.jobs + i * s.job_struct_size, s.job_struct_size)
            job = (uapi.RocketJobV11 if s.job_struct_size == 48 else uapi.RocketJob).from_buffer_copy(jraw)
            tasks = [uapi.RocketTask.from_buffer_copy(ctypes.string_at(job.tasks + k * job.task_struct_size, 8))
                     for k in range(job.task_count)]
            ins = list(np.frombuffer(ctypes.string_at(job.in_bo_handles, 4 * job.in_bo_handle_count), "<u4"))
            outs = list(np.frombuffer(ctypes.string_at(job.out_bo_handles, 4 * job.out_bo_handle_count), "<u4"))
            jobs.append((job, [(t.regcmd, t.regcmd_count) for t in tasks], ins, outs))
        out.append((fd, s, jobs))
    return out


class KeepAlive(RecordingKernel):
    """Record SUBMIT and also decode it during the ioctl (the arrays die after)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.decoded = []

    def ioctl(self, fd, request, arg):
        ret = super().ioctl(fd, request, arg)
        if request == uapi.DRM_IOCTL_ROCKET_SUBMIT:
            self.decoded.append(submitted_one(fd, arg))
        return ret


def submitted_one(fd, arg):
    shim = type("S", (), {})()
    shim.sent = [(fd, uapi.DRM_IOCTL_ROCKET_SUBMIT, bytes(memoryview(arg).cast("B")))]
    return submitted(shim)[0]


@pytest.mark.parametrize("variant,size", [(STOCK, 40), (CHAIN_PATCHED, 48)])
def test_submit_struct_bytes(variant, size):
    kernel = KeepAlive(EmulatedKernel(variant, executor=IncrementExecutor()))
    dev = RocketDevice(kernel=kernel, quiet=True)
    src, dst, rc = dev.create_bo(4096), dev.create_bo(4096), dev.create_bo(4096)
    tasks = chain_tasks(rc, [(src.iova, dst.iova), (dst.iova, src.iova)])
    dev.finish_cpu_access(rc)
    # src listed twice and as output too: it must appear once, in the out list only
    job = Job(tasks, in_bos=[src, rc, src], out_bos=[dst, src], label="seg")
    dev.run([job], chained=True)
    (fd, s, jobs), = kernel.decoded
    assert (s.job_count, s.job_struct_size, s.reserved) == (1, size, 0)
    j, task_list, ins, outs = jobs[0]
    assert j.task_struct_size == 8
    assert task_list == [(t.regcmd_iova, t.regcmd_count) for t in tasks]
    assert ins == [rc.handle]
    assert outs[:2] == [dst.handle, src.handle] and len(outs) == 3  # + the job's witness BO
    if size == 48:
        assert (j.flags, j.reserved) == (uapi.DRM_ROCKET_JOB_CHAIN, 0)
    dev.close()


def test_chained_kick_on_patched_kernel_and_per_task_kicks_otherwise():
    for variant, hw_chain, kicks in ((CHAIN_PATCHED, True, [3]), (CHAIN_PATCHED, False, [1, 1, 1]),
                                     (STOCK, True, [1, 1, 1])):
        dev, kernel = open_device(variant=variant, hw_chain=hw_chain)
        a, b, rc = dev.create_bo(4096), dev.create_bo(4096), dev.create_bo(4096)
        a.host[:64] = 10
        dev.finish_cpu_access(a)
        tasks = chain_tasks(rc, [(a.iova, b.iova), (b.iova, a.iova), (a.iova, b.iova)])
        dev.finish_cpu_access(rc)
        dev.run([Job(tasks, in_bos=[rc], out_bos=[a, b], label="chain")], chained=True)
        assert [k.task_number for k in kernel.kicks] == kicks, variant
        assert kernel.executor.tasks_run == [t.regcmd_iova for t in tasks]  # the PC followed the links
        dev.prepare_cpu_access(b)
        assert (b.host[:64] == 13).all()
        assert dev.counters.kicks == (1 if variant.job_flags else 3)
        dev.close()


def test_counters_count_submits_jobs_tasks():
    dev, kernel = open_device()
    src, dst = dev.create_bo(4096), dev.create_bo(4096)
    jobs = [one_task_job(dev, src, dst, f"j{i}") for i in range(3)]
    dev.run(jobs)
    c = dev.counters
    assert (c.submits, c.jobs, c.tasks, c.kicks) == (1, 3, 3, 3)
    dev.reset_counters()
    assert dev.counters.jobs == 0
    dev.close()


# --- waiting and failures -----------------------------------------------------------------

def test_timeout_names_the_job():
    dev, kernel = open_device(stalled=True)
    src, dst = dev.create_bo(4096), dev.create_bo(4096)
    sub = dev.submit([one_task_job(dev, src, dst, label="segment 4 job 2")])
    with pytest.raises(JobTimeout, match="segment 4 job 2: not finished after 0.01 s"):
        dev.wait(sub, timeout_s=0.01)
    with pytest.raises(JobTimeout, match="written by segment 4 job 2"):
        dev.prepare_cpu_access(dst, timeout_s=0)
    dev.close()


def test_iommu_fault_after_submit_is_reported_as_a_failed_job():
    """A weights BO that is not in the job's lists is freed before the job runs:
    the NPU faults, the kernel resets the core, the fence carries -ECANCELED."""
    dev, kernel = open_device()
    src, dst, weights = dev.create_bo(4096), dev.create_bo(4096), dev.create_bo(4096)
    rc = dev.create_bo(4096)
    task = put_task(rc, 0, task_entries(weights.iova, dst.iova))
    dev.finish_cpu_access(rc)
    sub = dev.submit([Job([task], in_bos=[src, rc], out_bos=[dst], label="segment 1")])
    dev.free_bo(weights)
    with pytest.raises(JobFailed, match=r"segment 1: failed on the NPU \(ECANCELED"):
        dev.wait(sub)
    assert "NPU job timed out" in kernel.log[-1]
    dev.close()


def test_prep_bo_positive_return_is_success():
    dev, kernel = open_device()
    bo = dev.create_bo(16)
    ret = kernel.ioctl(dev._fds[0], uapi.DRM_IOCTL_ROCKET_PREP_BO,
                       uapi.RocketPrepBo(handle=bo.handle, timeout_ns=kernel.clock_ns() + 10**9))
    assert ret > 0  # the 6.18 driver returns the jiffies left
    dev.prepare_cpu_access(bo)  # and the device accepts it
    dev.close()


def test_lanes_fold_onto_one_fd_on_a_stock_kernel(capsys):
    kernel = EmulatedKernel(executor=IncrementExecutor())
    dev = RocketDevice(kernel=kernel, cores=3)
    assert dev.lanes == 1
    assert "own NPU address space" in capsys.readouterr().err
    src, dst = dev.create_bo(4096), dev.create_bo(4096)
    jobs = [one_task_job(dev, src, dst, f"j{i}") for i in range(3)]
    for i, j in enumerate(jobs):
        j.lane = i
    dev.run(jobs)
    assert {fd for name, fd in kernel.calls if name == "DRM_IOCTL_ROCKET_SUBMIT"} == {dev._fds[0]}
    assert dev.counters.submits == 1
    dev.close()


def test_errno_of_failed_ioctls_becomes_one_line():
    dev, kernel = open_device()
    with pytest.raises(RocketError, match="CREATE_BO of 4096 bytes failed"):
        kernel.close(dev._fds[0])
        dev._fds[0] = 99999
        dev.create_bo(4096)
    dev._fds = []
