"""SimDevice keeps the Device contract (runtime/device.py) the way rocket does:
page-aligned IOVAs from the lowest free range, BO lifetime, CPU access
bracketing, job lanes on cores, CBUF residency only within a job, counters and
the performance model."""

import numpy as np
import pytest

from rkc.ir.npu import layout
from programs import Ref, conv_task, gemm_buffers, place, read_gemm, resolve, upload
from rkc.runtime.device import Job
from rkc.runtime.devices import open_device
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.errors import CbufError, MemoryAccessError, SimError
from rkc.runtime.sim.memory import IovaSpace
from rkc.ir.npu.perf import PerfModel


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


def test_bo_at_an_iova_chosen_elsewhere():
    """IovaSpace.create_at mirrors another allocator's objects (the emulated
    kernel's IOMMU domain): page aligned, inside the window, never overlapping."""
    mem = IovaSpace()
    b = mem.allocate(8192)
    with pytest.raises(MemoryAccessError, match="overlaps"):
        mem.create_at(b.iova + 4096, 4096)
    with pytest.raises(MemoryAccessError, match="page aligned"):
        mem.create_at(0x100010, 4096)
    d = mem.create_at(0x10000000, 10)
    assert (d.iova, d.size) == (0x10000000, 4096) and mem.find(0x10000fff) is d
    with pytest.raises(MemoryAccessError, match="outside the IOVA window"):
        mem.create_at(0xFFFFF000, 8192)


def test_job_failure_surfaces_at_wait_and_at_cpu_access():
    dev = SimDevice()
    spec, x, w, y = gemm_buffers(dev, np.ones((8, 32), np.int8), np.ones((32, 32), np.int8), "int32")
    entries = resolve(conv_task(spec, Ref(x.bo, 0x100000), w, y))
    bo = upload(dev, entries)
    from rkc.runtime.device import Task
    sub = dev.submit([Job([Task(bo.iova, entries.size)], [x.bo], [y.bo], label="bad")])
    with pytest.raises(MemoryAccessError, match="job bad, task 0"):
        dev.prepare_cpu_access(y.bo)
    with pytest.raises(MemoryAccessError):
        dev.wait(sub)
    dev.prepare_cpu_access(y.bo)  # reported once


def test_lanes_use_separate_cores_and_cbuf_does_not_survive_a_job():
    dev = SimDevice()
    spec, x, w, y = gemm_buffers(dev, np.ones((8, 32), np.int8), np.ones((32, 32), np.int8), "int32")
    from rkc.ir.npu.regcmd import write_entry
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
    perf = PerfModel(clock_hz=1e9, dram_bytes_per_s=25e9, kick_overhead_s=30e-6, core_dma_share=0.5)
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
    dma_s = task.dma_bytes / (0.5 * 25e9)  # one core's DMA: half of DRAM's bandwidth here
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
    assert t16.modelled_seconds == pytest.approx(max(128 * 512 * 256 / (512 * 1e9), t16.dma_bytes / (0.5 * 25e9)))


# -- CPU access bracket (rocket PREP_BO / FINI_BO) and the decoded-operand cache ----------
def test_host_view_is_writable_only_between_prepare_and_finish():
    dev = SimDevice()
    bo = dev.create_bo(64)
    with pytest.raises(ValueError, match="read-only"):
        bo.host[0] = 1  # a fresh BO belongs to the device
    dev.prepare_cpu_access(bo)
    bo.host[:4] = 7
    dev.finish_cpu_access(bo)
    assert list(bo.host[:5]) == [7, 7, 7, 7, 0]  # reading stays possible (and is what PREP_BO is for)
    with pytest.raises(ValueError, match="read-only"):
        bo.host[1:3] = 0


def test_no_dma_may_touch_a_bo_the_cpu_holds():
    """Even a BO missing from the job's lists: the NPU would read stale DRAM."""
    dev = SimDevice()
    spec, x, w, y = gemm_buffers(dev, np.ones((8, 32), np.int8), np.ones((32, 32), np.int8), "int32")
    prog = place(dev, [conv_task(spec, x, w, y)])
    dev.prepare_cpu_access(w.bo)
    with pytest.raises(MemoryAccessError, match="CPU holds"):
        dev.run([Job(prog.tasks, [x.bo], [y.bo], label="unlisted")])
    dev.finish_cpu_access(w.bo)
    dev.run([Job(prog.tasks, [x.bo], [y.bo])])  # an unlisted read is legal (Mesa lists no weight BO)


def test_a_job_touches_only_the_bos_it_lists():
    """rocket orders jobs by their BO lists: a read outside them races, a write
    into an in-BO (weights) corrupts every later run. Refused, naming the register."""
    dev = SimDevice()
    spec, x, w, y = gemm_buffers(dev, np.ones((8, 32), np.int8), np.ones((32, 32), np.int8), "int32")
    prog = place(dev, [conv_task(spec, x, w, y)])
    with pytest.raises(MemoryAccessError, match="DPU_DST_BASE_ADDR: DPU write-back .* not an output BO of job w"):
        dev.run([Job(prog.tasks, [x.bo, w.bo, y.bo], [x.bo], label="w")])
    guard = dev.create_guard_bo(4096)
    with pytest.raises(MemoryAccessError, match="DPU write-back .* guard page .* left unrelocated"):
        dev.run([Job(place(dev, [conv_task(spec, x, w, Ref(guard))]).tasks, [x.bo, w.bo], [guard], label="g")])
    with pytest.raises(SimError, match="job n: lists no output BO"):
        dev.run([Job(prog.tasks, [x.bo, w.bo, y.bo], [], label="n")])
    with pytest.raises(SimError, match="job l: lane -1 is not one of the NPU's 3 cores"):
        dev.run([Job(prog.tasks, [x.bo, w.bo], [y.bo], lane=-1, label="l")])


def test_decoded_weights_follow_every_write_to_their_bytes():
    """Weights are converted once and reused, until the CPU (finish_cpu_access)
    or the NPU (a DPU write landing in their bytes) changes them."""
    rng = np.random.default_rng(3)
    dev = SimDevice()
    a = rng.integers(-128, 128, (8, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 32)).astype(np.int8)
    spec, x, w, y = gemm_buffers(dev, a, b, "int32")
    prog = place(dev, [conv_task(spec, x, w, y)], in_bos=[x.bo, w.bo], out_bos=[y.bo])
    cache = dev.mem.cache

    def product() -> np.ndarray:
        dev.run([prog.job()])
        return read_gemm(dev, y, spec)

    np.testing.assert_array_equal(product(), a.astype(np.int64) @ b)
    hits = cache.hits
    np.testing.assert_array_equal(product(), a.astype(np.int64) @ b)
    assert cache.hits == hits + 2  # the weights and the regcmd, decoded once

    # the CPU rewrites the weights
    b2 = rng.integers(-128, 128, (64, 32)).astype(np.int8)
    dev.prepare_cpu_access(w.bo)
    w.bo.host[:b2.size] = layout.pack_gemm_b(b2).view(np.uint8).reshape(-1)
    dev.finish_cpu_access(w.bo)
    np.testing.assert_array_equal(product(), a.astype(np.int64) @ b2)

    # the NPU writes an int8 copy of src (src @ I) over the first 128 bytes of the weights
    src = rng.integers(-128, 128, (4, 32)).astype(np.int8)
    ispec, ix, iw, _ = gemm_buffers(dev, src, np.eye(32, dtype=np.int8), "int8")
    writer = place(dev, [conv_task(ispec, ix, iw, Ref(w.bo, 0))], in_bos=[ix.bo, iw.bo], out_bos=[w.bo])
    dev.run([writer.job()])
    flat = layout.pack_gemm_b(b2).view(np.uint8).reshape(-1).copy()
    flat[:128] = layout.pack_gemm_a(src).view(np.uint8).reshape(-1)  # 2 surfaces x 4 rows x 16 channels
    b3 = layout.unpack_weights(flat.view(np.int8), 32, 1, 1, 64)[:, 0, 0, :].T.astype(np.int64)
    assert not np.array_equal(b3, b2)
    np.testing.assert_array_equal(product(), a.astype(np.int64) @ b3)


def test_decoded_operands_stay_within_the_cache_budget():
    dev = SimDevice(cache_bytes=4096)  # smaller than one decoded weight tensor here
    a = np.ones((8, 64), np.int8)
    b = np.ones((64, 32), np.int8)
    spec, x, w, y = gemm_buffers(dev, a, b, "int32")
    prog = place(dev, [conv_task(spec, x, w, y)])
    for _ in range(2):
        dev.run([prog.job()])
        np.testing.assert_array_equal(read_gemm(dev, y, spec), np.full((8, 32), 64))
    assert dev.mem.cache.nbytes <= 4096
