"""SimDevice keeps the Device contract (runtime/device.py) the way rocket does:
page-aligned IOVAs from the lowest free range, BO lifetime, CPU access
bracketing, job lanes on cores, CBUF residency only within a job, counters and
the performance model."""

import numpy as np
import pytest

from programs import Ref, conv_task, gemm_buffers, place, resolve, upload
from runtime.device import Job
from runtime.devices import open_device
from runtime.sim import SimDevice
from runtime.sim.errors import CbufError, MemoryAccessError
from runtime.sim.perf import PerfModel


def test_open_device_sim():
    dev = open_device("sim", quiet=True)
    assert isinstance(dev, SimDevice) and dev.kind == "sim" and dev.lanes == 3 and dev.supports_chaining


def test_bo_allocation_like_drm_mm():
    dev = SimDevice()
    a = dev.create_bo(100)
    b = dev.create_bo(5000)
    assert (a.iova, a.size, b.iova, b.size) == (0, 4096, 4096, 8192)
    assert not a.host.any() and a.host.size == a.size
    dev.free_bo(a)
    c = dev.create_bo(4096)
    assert c.iova == 0  # lowest fit reuses the hole
    with pytest.raises(MemoryAccessError, match="not a live BO"):
        dev.free_bo(a)
    with pytest.raises(MemoryAccessError, match="overlaps"):
        dev.create_bo_at(b.iova + 4096, 4096)
    with pytest.raises(MemoryAccessError, match="page aligned"):
        dev.create_bo_at(0x100010, 4096)
    d = dev.create_bo_at(0x10000000, 10)
    assert (d.iova, d.size) == (0x10000000, 4096)
    with pytest.raises(MemoryAccessError, match="outside the IOVA window"):
        dev.create_bo_at(0xFFFFF000, 8192)


def test_job_failure_surfaces_at_wait_and_at_cpu_access():
    dev = SimDevice()
    spec, x, w, y = gemm_buffers(dev, np.ones((8, 32), np.int8), np.ones((32, 32), np.int8), "int32")
    entries = resolve(conv_task(spec, Ref(x.bo, 0x100000), w, y))
    bo = upload(dev, entries)
    from runtime.device import Task
    sub = dev.submit([Job([Task(bo.iova, entries.size)], [x.bo], [y.bo], label="bad")])
    with pytest.raises(MemoryAccessError, match="job bad, task 0"):
        dev.prepare_cpu_access(y.bo)
    with pytest.raises(MemoryAccessError):
        dev.wait(sub)
    dev.prepare_cpu_access(y.bo)  # reported once


def test_lanes_use_separate_cores_and_cbuf_does_not_survive_a_job():
    dev = SimDevice()
    spec, x, w, y = gemm_buffers(dev, np.ones((8, 32), np.int8), np.ones((32, 32), np.int8), "int32")
    from ir.npu.regcmd import write_entry
    first = conv_task(spec, x, w, y)
    second = conv_task(spec, x, w, y)
    for j, e in enumerate(second.entries):  # the second task asks for the weights left in CBUF
        if (e & 0xFFFF) == 0x1040 and (e >> 48) == 0x0201:
            second.entries[j] = write_entry("CNA_CBUF_CON0", e >> 16 & 0xFFFF | 1 << 13)
    both = place(dev, [first, second])
    dev.run([both.job(lane=2)])  # one job: the weights are still in core 2's CBUF
    assert dev.counters.dma_read["CNA_WEIGHT"] == spec.kernels * 32  # fetched once
    assert [t.lane for t in dev.last_jobs[0].tasks] == [2, 2]
    alone = place(dev, [second])
    with pytest.raises(CbufError, match="WEIGHT_REUSE"):
        dev.run([both.job(lane=1, label="a"), alone.job(lane=1, label="b")])


def test_counters_and_performance_model():
    perf = PerfModel(clock_hz=1e9, dram_bytes_per_s=25e9, kick_overhead_s=30e-6)
    dev = SimDevice(perf=perf)
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (128, 512)).astype(np.int8)
    b = rng.integers(-128, 128, (512, 256)).astype(np.int8)
    spec, x, w, y = gemm_buffers(dev, a, b, "int32")
    prog = place(dev, [conv_task(spec, x, w, y)] * 3)
    dev.run([prog.job()])
    c = dev.counters
    assert (c.submits, c.jobs, c.tasks, c.kicks) == (1, 1, 3, 3)
    assert c.macs == 3 * 128 * 512 * 256
    assert c.dma_read["CNA_FEATURE"] == 3 * 128 * 512 and c.dma_read["CNA_WEIGHT"] == 3 * 512 * 256
    assert c.dma_written["DPU_WDMA"] == 3 * (256 // 4) * 128 * 16  # int32: 4 channels per atom
    task = dev.last_jobs[0].tasks[0]
    mac_s = 128 * 512 * 256 / (1024 * 1e9)
    dma_s = task.dma_bytes / 25e9
    assert task.modelled_seconds == pytest.approx(max(mac_s, dma_s))
    assert c.modelled_seconds == pytest.approx(3 * max(mac_s, dma_s) + 3 * 30e-6)
    dev.reset_counters()
    spec16, x16, w16, y16 = gemm_buffers(dev, a.astype(np.float16), b.astype(np.float16), "fp32")
    chained = place(dev, [conv_task(spec16, x16, w16, y16)] * 3, chain=True)
    dev.run([chained.job()], chained=True)
    c = dev.counters
    assert (c.tasks, c.kicks) == (3, 1)
    t16 = dev.last_jobs[0].tasks[0]
    assert c.modelled_seconds == pytest.approx(3 * t16.modelled_seconds + 30e-6)
    assert t16.modelled_seconds == pytest.approx(max(128 * 512 * 256 / (512 * 1e9), t16.dma_bytes / 25e9))
