"""Every job is validated before SUBMIT: each rule refuses a job the kernel would
drop or the NPU would fault or hang on, and names the job."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import regcmd
from rkc.ir.npu.registers import Block
from rocket_support import chain_tasks, put_task, task_entries
from rkc.runtime.device import BufferObject, Job, Task
from rkc.runtime.rocket import JobRejected, RocketDevice
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, EmulatedKernel


@pytest.fixture
def dev():
    kernel = EmulatedKernel(CHAIN_PATCHED)
    d = RocketDevice(kernel=kernel, quiet=True)
    yield d
    d.close()


@pytest.fixture
def bos(dev):
    src, dst, rc = dev.create_bo(4096), dev.create_bo(4096), dev.create_bo(4096)
    return src, dst, rc


def put(dev, bo, offset, entries) -> Task:
    """Write a task and hand it to the NPU (FINI_BO), as a loader does."""
    task = put_task(bo, offset, entries)
    dev.finish_cpu_access(bo)
    return task


def rejected(dev, job, match, chained=False):
    submits = dev.counters.submits
    with pytest.raises(JobRejected, match=match):
        dev.submit([job], chained=chained)
    assert dev.counters.submits == submits


def test_a_valid_job_passes(dev, bos):
    src, dst, rc = bos
    task = put(dev, rc, 0, task_entries(src.iova, dst.iova))
    dev.run([Job([task], in_bos=[src, rc], out_bos=[dst], label="ok")])


def test_no_tasks(dev, bos):
    rejected(dev, Job([], out_bos=[bos[1]], label="segment 2"), "segment 2: has no tasks")


def test_no_output(dev, bos):
    src, dst, rc = bos
    task = put(dev, rc, 0, task_entries(src.iova, dst.iova))
    rejected(dev, Job([task], in_bos=[src]), r"job 0: lists no output BO")


def test_dead_or_foreign_bo(dev, bos):
    src, dst, rc = bos
    task = put(dev, rc, 0, task_entries(src.iova, dst.iova))
    foreign = BufferObject(dst.handle, dst.size, dst.iova, dst.host)  # same handle, not this device's object
    rejected(dev, Job([task], out_bos=[foreign], label="s"), "s: output BO.* is not a live BO")
    dev.free_bo(src)
    rejected(dev, Job([task], in_bos=[src], out_bos=[dst], label="s"), "s: input BO.* is not a live BO")


def test_misaligned_regcmd(dev, bos):
    src, dst, rc = bos
    put(dev, rc, 8, task_entries(src.iova, dst.iova))
    rejected(dev, Job([Task(rc.iova + 8, 6)], out_bos=[dst], label="s"), "task 0: regcmd at .* not 16-byte aligned")


def test_count_below_tail_and_above_pc_amount(dev, bos):
    src, dst, rc = bos
    rejected(dev, Job([Task(rc.iova, 3)], out_bos=[dst], label="s"), "3 regcmd entries, fewer than the 4-entry tail")
    rejected(dev, Job([Task(rc.iova, 131073)], out_bos=[dst], label="s"), "do not fit the 16-bit PC amount")


def test_regcmd_outside_every_bo_or_running_off_its_bo(dev, bos):
    src, dst, rc = bos
    rejected(dev, Job([Task(0x7000_0000, 6)], out_bos=[dst], label="s"), "is not inside one live BO")
    # 6 entries ending exactly at the end of the BO are fine ...
    put(dev, rc, 4096 - 48, task_entries(src.iova, dst.iova))
    dev.run([Job([Task(rc.iova + 4096 - 48, 6)], in_bos=[rc, src], out_bos=[dst], label="end")])
    # ... but 5 entries ending at the end of a 4088-byte BO make the PC fetch a
    # sixth 8-byte slot past it (it reads whole 128-bit units)
    odd = dev.create_bo(4088)
    entries = task_entries(src.iova, dst.iova)[1:]
    put(dev, odd, 4088 - 40, entries)
    rejected(dev, Job([Task(odd.iova + 4088 - 40, 5)], out_bos=[dst], label="s"), "not inside one live BO")


def test_unknown_target(dev, bos):
    src, dst, rc = bos
    e = task_entries(src.iova, dst.iova)
    e[0] = regcmd.encode(0x0300, 0x1070, 0)
    rejected(dev, Job([put(dev, rc, 0, e)], out_bos=[dst], label="s"), "entry 0 .* unknown target 0x0300")


def test_tail_and_dpu_enable(dev, bos):
    src, dst, rc = bos
    e = task_entries(src.iova, dst.iova)
    rejected(dev, Job([put(dev, rc, 0, e[:-1])], out_bos=[dst], label="s"), "does not end with the tail")
    e = task_entries(src.iova, dst.iova, enable=(Block.CNA, Block.CORE, Block.PPU))
    rejected(dev, Job([put(dev, rc, 0, e)], out_bos=[dst], label="s"), "does not start the DPU")


def test_address_fields_must_point_into_live_bos(dev, bos):
    src, dst, rc = bos
    task = put(dev, rc, 0, task_entries(src.iova, 0x6000_0000))
    rejected(dev, Job([task], out_bos=[dst], label="segment 7"),
             r"segment 7: task 0: entry 1 DPU_DST_BASE_ADDR=0x60000000 points outside every live BO")
    weights = dev.create_bo(4096)
    task = put(dev, rc, 0, task_entries(weights.iova + 100, dst.iova))
    dev.run([Job([task], in_bos=[rc], out_bos=[dst], label="w")])
    dev.free_bo(weights)  # the address now dangles
    rejected(dev, Job([task], out_bos=[dst], label="w"), "CNA_FEATURE_DATA_ADDR=.* points outside")


def test_zero_address_means_unprogrammed(dev, bos):
    src, dst, rc = bos
    e = task_entries(src.iova, dst.iova)
    e = np.concatenate([[regcmd.write_entry("DPU_RDMA_RDMA_BN_BASE_ADDR", 0)], e]).astype(np.uint64)
    dev.run([Job([put(dev, rc, 0, e)], in_bos=[rc, src], out_bos=[dst], label="z")])


def test_chained_tails_must_link(dev, bos):
    src, dst, rc = bos
    tasks = chain_tasks(rc, [(src.iova, dst.iova), (dst.iova, src.iova)])
    dev.finish_cpu_access(rc)
    job = Job(tasks, in_bos=[rc], out_bos=[src, dst], label="chain")
    dev.run([job], chained=True)
    put(dev, rc, 0, task_entries(src.iova, dst.iova))  # task 0 rewritten without its link
    rejected(dev, job, "chain: task 0: tail does not link to task 1", chained=True)
    dev.run([job], chained=False)  # one kick per task ignores the links


def test_rejection_happens_before_anything_is_submitted(dev, bos):
    src, dst, rc = bos
    good = Job([put(dev, rc, 0, task_entries(src.iova, dst.iova))], in_bos=[rc], out_bos=[dst], label="good")
    bad = Job([Task(rc.iova, 6)], out_bos=[dst], label="bad")
    put(dev, rc, 64, task_entries(src.iova, 0x5000_0000))
    bad = Job([Task(rc.iova + 64, 6)], out_bos=[dst], label="bad")
    with pytest.raises(JobRejected, match="^bad: "):
        dev.submit([good, bad])
    assert dev.counters.submits == 0


def test_validated_tasks_are_cached_until_their_bo_is_written_or_a_bo_freed(dev, bos):
    src, dst, rc = bos
    job = Job([put(dev, rc, 0, task_entries(src.iova, dst.iova))], in_bos=[rc, src], out_bos=[dst], label="c")
    dev.run([job])
    put_task(rc, 0, task_entries(src.iova, 0x5000_0000))  # CPU writes, not yet handed to the NPU
    dev.submit([job])  # still the validated program as far as the NPU is concerned
    dev.finish_cpu_access(rc)  # now it is: validate again
    rejected(dev, job, "DPU_DST_BASE_ADDR=0x50000000 points outside")
    put(dev, rc, 0, task_entries(src.iova, dst.iova))
    dev.run([job])
    other = dev.create_bo(4096)
    put(dev, rc, 0, task_entries(other.iova, dst.iova))
    dev.run([job])
    dev.free_bo(other)  # no write to rc, but its address now dangles
    rejected(dev, job, "CNA_FEATURE_DATA_ADDR=.* points outside")
