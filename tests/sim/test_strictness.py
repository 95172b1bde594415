"""One test per class of fault the simulator must refuse, each checking that the
error names job, task, entry and register. A valid int8 GEMM task is the
baseline (test_baseline_runs); each test changes one thing."""

import numpy as np
import pytest

from rkc.ir.npu.regcmd import TARGET_MARKER, encode, write_entry
from programs import Ref, conv_task, gemm_buffers, place, resolve, upload
from rkc.runtime.device import Job, Task
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.errors import (AlignmentError, CbufError, FieldError, GeometryError, HangError,
                                MemoryAccessError, NoWritebackError, PcAmountError, QuirkRejection,
                                StaleRegisterError, UnknownRegisterError, UnsupportedError)


def _gemm(dev, m=8, k=64, n=32):
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    return gemm_buffers(dev, a, b, "int32")


def _written_bos(dev, entries: np.ndarray) -> list:
    """The live BOs the entries' write-address registers point into (the job's
    out-BOs); a spare BO when they point nowhere (the fault under test is elsewhere)."""
    from rkc.ir.npu.addresses import ADDRESS_USE
    from rkc.ir.npu.regcmd import decode_entry

    found = {}
    for e in entries.tolist():
        d = decode_entry(int(e))
        reg = getattr(d, "register", None)
        if reg is not None and ADDRESS_USE.get(reg.name, None) and ADDRESS_USE[reg.name].direction == "write":
            bo = dev.mem.find(d.value)
            if bo is not None:
                found[bo.handle] = bo
    return list(found.values()) or [dev.create_bo(4096)]


def _run_entries(dev, entries: np.ndarray, label="probe"):
    bo = upload(dev, entries)
    dev.run([Job([Task(bo.iova, entries.size)], out_bos=_written_bos(dev, entries), label=label)])


def _index(entries: np.ndarray, name: str) -> int:
    from rkc.ir.npu.regcmd import decode
    return next(d.index for d in decode(entries) if d.register is not None and d.register.name == name)


def _patched(dev, name: str, value: int, raw: bool = False):
    """The baseline task with register `name` rewritten to `value` (or the whole
    64-bit entry replaced by `value` with raw=True)."""
    spec, x, w, y = _gemm(dev)
    entries = resolve(conv_task(spec, x, w, y))
    i = _index(entries, name)
    entries[i] = value if raw else write_entry(name, value)
    return entries, i


def _expect(exc_info, entry: int | None, register: str | None, task: int = 0, job: str = "probe"):
    e = exc_info.value
    assert e.job == job and e.task == task, str(e)
    if entry is not None:
        assert e.entry == entry, str(e)
    if register is not None:
        assert e.register == register, str(e)
    text = str(e)
    assert f"job {job}" in text and f"task {task}" in text


def test_baseline_runs():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    _run_entries(dev, resolve(conv_task(spec, x, w, y)))


def test_access_outside_every_bo():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_FEATURE_DATA_ADDR", 0xF0000000)
    with pytest.raises(MemoryAccessError, match="outside every BO") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CNA_FEATURE_DATA_ADDR")


def test_access_across_a_bo_boundary():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev, m=8, k=64, n=32)
    small = dev.create_bo(4096)
    dev.create_bo(4096)  # the neighbour the write would run into
    # the output of 8 rows x 32 int32 channels is 8 surfaces of 128 bytes; start it
    # near the end of a page so it runs past the BO
    entries = resolve(conv_task(spec, x, w, Ref(small, 4096 - 512)))
    with pytest.raises(MemoryAccessError, match="runs past the end") as ei:
        _run_entries(dev, entries)
    _expect(ei, _index(entries, "DPU_DST_BASE_ADDR"), "DPU_DST_BASE_ADDR")


def test_misaligned_address():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    entries = resolve(conv_task(spec, x, w, Ref(y.bo, 8)))
    with pytest.raises(AlignmentError, match="16-byte aligned") as ei:
        _run_entries(dev, entries)
    _expect(ei, _index(entries, "DPU_DST_BASE_ADDR"), "DPU_DST_BASE_ADDR")


def test_cbuf_banks_over_twelve():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_CBUF_CON0", 0)
    entries[i] = write_entry("CNA_CBUF_CON0", (7 << 4) | 6)  # 6 data + 7 weight banks
    # the builder writes CBUF_CON0 once; the check names that entry
    with pytest.raises(CbufError, match="exceeds the 12 CBUF banks") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CNA_CBUF_CON0")


def test_cbuf_tile_larger_than_its_banks():
    dev = SimDevice()
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, (128, 512)).astype(np.int8)  # 64 KiB: 2 banks + 1 slack
    b = rng.integers(-128, 128, (512, 32)).astype(np.int8)
    spec, x, w, y = gemm_buffers(dev, a, b, "int32")
    entries = resolve(conv_task(spec, x, w, y))
    i = _index(entries, "CNA_CBUF_CON0")
    entries[i] = write_entry("CNA_CBUF_CON0", (11 << 4) | 1)
    with pytest.raises(CbufError, match="data banks") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CNA_CBUF_CON0")


def test_reserved_bits_set():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_CONV_CON1", 1 << 31)
    with pytest.raises(FieldError, match="reserved bits") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CNA_CONV_CON1")


def test_field_value_out_of_range():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_DMA_CON0", (15 << 16) | 5)  # DATA_BURST_LEN=5 is reserved
    with pytest.raises(FieldError, match="DATA_BURST_LEN=5") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CNA_DMA_CON0")


def test_unknown_register():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_FC_CON2", encode(0x0201, 0x1234, 0), raw=True)
    with pytest.raises(UnknownRegisterError, match="no register at 0x1234") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, None)


def test_unknown_target():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_FC_CON2", encode(0x0003, 0x1074, 0), raw=True)
    with pytest.raises(UnknownRegisterError, match="unknown target") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, None)


def test_task_without_dpu_writeback():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    entries = resolve(conv_task(spec, x, w, y, enable=0x05))  # CNA | CORE only
    with pytest.raises(NoWritebackError, match="DPU interrupt") as ei:
        _run_entries(dev, entries)
    _expect(ei, entries.size - 1, "PC_OPERATION_ENABLE")


def test_mrdma_not_disabled_without_a_source():
    dev = SimDevice()
    entries, i = _patched(dev, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", 15 << 11)  # MRDMA_DISABLE clear
    with pytest.raises(HangError, match="MRDMA is enabled") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "DPU_RDMA_RDMA_FEATURE_MODE_CFG")


def test_op_enable_without_marker():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    entries = resolve(conv_task(spec, x, w, y))
    assert entries[-2] == encode(TARGET_MARKER, 0, 0)
    entries[-2] = 0
    with pytest.raises(HangError, match="0x0041 marker") as ei:
        _run_entries(dev, entries)
    _expect(ei, entries.size - 1, "PC_OPERATION_ENABLE")


def test_pc_amount_overflow():
    dev = SimDevice()
    bo = dev.create_bo(4096)
    with pytest.raises(PcAmountError, match="does not fit 16 bits") as ei:
        dev.run([Job([Task(bo.iova, 2 * 65536 + 2)], out_bos=[dev.create_bo(4096)], label="probe")])
    _expect(ei, None, "PC_REGISTER_AMOUNTS")


def test_fetch_amount_shorter_than_the_task():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    entries = resolve(conv_task(spec, x, w, y))
    bo = upload(dev, entries)
    with pytest.raises(HangError, match="no op-enable entry") as ei:
        dev.run([Job([Task(bo.iova, entries.size - 4)], out_bos=[y.bo], label="probe")])
    _expect(ei, None, "PC_REGISTER_AMOUNTS")


def test_stale_register_from_a_delta_task():
    """A second task that rewrites only addresses (a 'delta' regcmd) would run on
    a stale ping-pong group on hardware."""
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    full = conv_task(spec, x, w, y)
    from rkc.ir.npu.regcmd import RegcmdBuilder
    delta = RegcmdBuilder()
    delta.address("CNA_FEATURE_DATA_ADDR", x.bo, 0)
    delta.address("DPU_DST_BASE_ADDR", y.bo, 0)
    delta.finish(0x1D)
    prog = place(dev, [full, delta])
    with pytest.raises(StaleRegisterError, match="did not write it") as ei:
        dev.run([prog.job(label="probe")])
    _expect(ei, None, None, task=1)


def test_geometry_disagreement():
    dev = SimDevice()
    entries, i = _patched(dev, "CORE_DATAOUT_SIZE_0", (6 << 16) | 0)  # 7 rows instead of 8
    with pytest.raises(GeometryError, match="CORE output") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CORE_DATAOUT_SIZE_0")


def test_unsupported_mode_is_rejected():
    dev = SimDevice()
    entries, i = _patched(dev, "CNA_CONV_CON1", 1 << 16)  # DECONV
    with pytest.raises(UnsupportedError, match="DECONV") as ei:
        _run_entries(dev, entries)
    _expect(ei, i, "CNA_CONV_CON1")


def test_open_question_gemv_rows_below_four():
    dev = SimDevice()
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (2, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 32)).astype(np.int8)
    spec, x, w, y = gemm_buffers(dev, a, b, "int32")
    with pytest.raises(QuirkRejection, match="Q2") as ei:
        _run_entries(dev, resolve(conv_task(spec, x, w, y)))
    _expect(ei, None, "CNA_FC_DATA_SIZE0")


def test_open_question_int8_chained_after_first_task():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    y2 = Ref(dev.create_bo(spec.out_bytes()))
    prog = place(dev, [conv_task(spec, x, w, y), conv_task(spec, x, w, y2)], chain=True)
    with pytest.raises(QuirkRejection, match="Q1") as ei:
        dev.run([prog.job(label="probe")], chained=True)
    _expect(ei, None, None, task=1)
    dev.run([prog.job(label="probe")], chained=False)  # one kick per task is fine


def test_chain_link_must_reach_the_next_task():
    dev = SimDevice()
    rng = np.random.default_rng(4)
    a = rng.standard_normal((8, 64)).astype(np.float16)
    b = rng.standard_normal((64, 16)).astype(np.float16)
    spec, x, w, y = gemm_buffers(dev, a, b, "fp32")
    prog = place(dev, [conv_task(spec, x, w, y), conv_task(spec, x, w, y)], chain=False)
    with pytest.raises(HangError, match="does not link") as ei:
        dev.run([prog.job(label="probe")], chained=True)
    _expect(ei, None, "PC_REGISTER_AMOUNTS")


def test_cpu_held_buffer_is_refused():
    dev = SimDevice()
    spec, x, w, y = _gemm(dev)
    prog = place(dev, [conv_task(spec, x, w, y)], in_bos=[x.bo, w.bo], out_bos=[y.bo])
    dev.prepare_cpu_access(x.bo)
    with pytest.raises(Exception, match="still held by the CPU"):
        dev.run([prog.job(label="probe")])
    dev.finish_cpu_access(x.bo)
    dev.run([prog.job(label="probe")])
