"""Several lanes (one fd each) on a kernel whose files share one NPU address
space, with the emulated scheduler running the most recent runnable job first
so that any dependency the device forgets shows up as a wrong result."""

from __future__ import annotations

import pytest

from rocket_support import IncrementExecutor, put_task, task_entries
from rkc.runtime.device import Job
from rkc.runtime.rocket import RocketDevice
from rkc.runtime.rocket.emulated import EmulatedKernel


def open_lanes(cores=3, **kw):
    kernel = EmulatedKernel(executor=IncrementExecutor(), shared_address_space=True, policy="adversarial")
    return RocketDevice(kernel=kernel, cores=cores, quiet=True, **kw), kernel


def job(dev, rc, slot, src, dst, lane, label, extra_in=()):
    task = put_task(rc, 64 * slot, task_entries(src.iova, dst.iova))
    return Job([task], in_bos=[src, rc, *extra_in], out_bos=[dst], lane=lane, label=label)


def fill(dev, bo, value):
    bo.host[:64] = value
    dev.finish_cpu_access(bo)


def read(dev, bo):
    dev.prepare_cpu_access(bo)
    return int(bo.host[0])


def test_lanes_open_one_fd_each_and_share_bos():
    dev, kernel = open_lanes()
    assert dev.lanes == 3 and dev.lane_note == ""
    assert len(set(dev._fds)) == 3
    bo = dev.create_bo(4096)
    record = dev._bos[bo.handle]
    assert len(record.handles) == 3  # imported into every lane's fd
    dev.close()


def test_jobs_go_to_their_lanes_fd_in_order():
    dev, kernel = open_lanes()
    a, b, c, d, rc = (dev.create_bo(4096) for _ in range(5))
    fill(dev, a, 5)
    jobs = [job(dev, rc, 0, a, b, 0, "l0"), job(dev, rc, 1, a, c, 1, "l1"), job(dev, rc, 2, a, d, 2, "l2"),
            job(dev, rc, 3, b, b, 5, "l2 again")]  # lane 5 -> fd of lane 5 % 3 = 2
    dev.finish_cpu_access(rc)
    dev.run(jobs)
    fds = [fd for name, fd in kernel.calls if name == "DRM_IOCTL_ROCKET_SUBMIT"]
    assert fds == [dev._fds[0], dev._fds[1], dev._fds[2]]
    assert dev.counters.submits == 3
    assert [read(dev, x) for x in (b, c, d)] == [7, 6, 6]
    dev.close()


def test_read_after_write_across_lanes():
    dev, kernel = open_lanes()
    x, y, z, rc = (dev.create_bo(4096) for _ in range(4))
    fill(dev, x, 1)
    jobs = [job(dev, rc, 0, x, y, 0, "write y"), job(dev, rc, 1, y, z, 1, "read y")]
    dev.finish_cpu_access(rc)
    dev.run(jobs)
    assert read(dev, z) == 3
    dev.close()


@pytest.mark.parametrize("separate_submits", [False, True])
@pytest.mark.parametrize("check_fences", [True, False])
def test_write_after_read_across_lanes(separate_submits, check_fences):
    """Job A (lane 0) reads X; job B (lane 1) then overwrites X. The kernel
    orders nothing here (tests/rocket/test_emulated_kernel.py shows the hazard);
    the device must make B wait for A."""
    dev, kernel = open_lanes(check_fences=check_fences)
    x, y, z, rc = (dev.create_bo(4096) for _ in range(4))
    fill(dev, x, 10)
    fill(dev, z, 50)
    reader = job(dev, rc, 0, x, y, 0, "reader")
    writer = job(dev, rc, 1, z, x, 1, "writer")
    dev.finish_cpu_access(rc)
    if separate_submits:
        s1 = dev.submit([reader])
        s2 = dev.submit([writer])
        dev.wait(s2)
        dev.wait(s1)
    else:
        dev.run([reader, writer])
    assert read(dev, y) == 11  # the reader saw X before the writer changed it
    assert read(dev, x) == 51
    dev.close()


def test_many_independent_jobs_over_three_lanes():
    dev, kernel = open_lanes()
    rc = dev.create_bo(4096)
    srcs = [dev.create_bo(4096) for _ in range(9)]
    dsts = [dev.create_bo(4096) for _ in range(9)]
    for i, s in enumerate(srcs):
        fill(dev, s, i)
    jobs = [job(dev, rc, i, srcs[i], dsts[i], i % 3, f"seg 0 job {i}") for i in range(9)]
    dev.finish_cpu_access(rc)
    dev.run(jobs)
    assert [read(dev, d) for d in dsts] == [i + 1 for i in range(9)]
    assert {k.core for k in kernel.kicks} <= {0, 1, 2}
    dev.close()


def test_jobs_beyond_the_tracking_limit_still_order_correctly():
    """Past max_tracked_jobs (MAX_TRACKED_JOBS) jobs get no witness: they are
    waited for through their out BOs and list what they read as outputs, so a
    later writer on another lane still waits for them."""
    dev, kernel = open_lanes(max_tracked_jobs=1)
    x, y, z, w, rc = (dev.create_bo(4096) for _ in range(5))
    fill(dev, x, 10)
    fill(dev, z, 50)
    jobs = [job(dev, rc, 0, z, w, 2, "tracked"), job(dev, rc, 1, x, y, 0, "untracked reader"),
            job(dev, rc, 2, z, x, 1, "writer")]
    dev.finish_cpu_access(rc)
    sub = dev.submit(jobs)
    assert [t.witness is not None for t in sub.tracked] == [True, False, False]
    dev.wait(sub)
    assert (read(dev, y), read(dev, x), read(dev, w)) == (11, 51, 51)
    dev.close()
