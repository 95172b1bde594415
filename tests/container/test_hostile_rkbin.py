"""Crafted rkbins that would make the NPU overwrite its own weights or code, or
touch what their jobs do not list: every one is refused before any device sees
it (read_rkbin), with a message naming job, task, entry and register, and the
simulator refuses what only shows when the task runs."""

import numpy as np
import pytest

from hostile import assert_refused, compiled_small_cnn, mutated, npu_tasks, parts, relocation_of, write_raw
from rkc import runtime
from rkc.ir.rkbin import read_rkbin
from rkc.runtime.sim.errors import MemoryAccessError


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return compiled_small_cnn(tmp_path_factory.mktemp("good"))


def _retarget(register, target, offset=0):
    def change(m, b):
        rel = relocation_of(m, b, register)
        rel["target"], rel["offset"] = target, offset
    return change


def _first_job(m):
    return next(npu_tasks(m))[2]


def _set_job(key, value):
    def change(m, b):
        _first_job(m)[key] = value
    return change


def _duplicate(register):
    def change(m, b):
        rel = relocation_of(m, b, register)
        m["relocations"].append(dict(rel, offset=0))
    return change


def _raw_address(m, b):
    rel = relocation_of(m, b, "DPU_DST_BASE_ADDR")
    m["relocations"].remove(rel)
    region = next(r for r in m["regions"] if r["name"] == rel["region"])
    entries = b[region["blob"]].view("<u8")
    entries[rel["entry"]] |= np.uint64(0x1000 << 16)


def _unrelocated_feature(m, b):
    m["relocations"].remove(relocation_of(m, b, "CNA_FEATURE_DATA_ADDR"))


def _relocate_non_address(m, b):
    rel = relocation_of(m, b, "DPU_DST_BASE_ADDR")
    m["relocations"].append(dict(rel, entry=rel["entry"] - 1))


def _first_task_register(m, b, register):
    """(entries, index) of `register`'s write in the first NPU task's regcmd."""
    from rkc.ir.npu.regcmd import decode_entry

    _, _, _, _, task = next(npu_tasks(m))
    region = next(r for r in m["regions"] if r["name"] == task["region"])
    entries = b[region["blob"]].view("<u8")
    for i in range(task["entry"], task["entry"] + task["count"]):
        d = decode_entry(int(entries[i]))
        if getattr(d, "register", None) is not None and d.register.name == register:
            return entries, i
    raise LookupError(register)


def _set_field(register, field, new):
    """The first task's `register` with `field` set to `new(old)` (saturated to the field)."""
    from rkc.ir.npu.registers import BY_NAME

    def change(m, b):
        entries, i = _first_task_register(m, b, register)
        raw = int(entries[i])
        f = BY_NAME[register].field(field)
        value = (raw >> 16) & 0xFFFFFFFF
        old = f.extract(value)
        value = (value & ~f.mask) | (min(new(old), (1 << f.width) - 1) << f.lo)
        entries[i] = np.uint64((raw & ~(0xFFFFFFFF << 16)) | (value << 16))
    return change


def _offset_to_region_end(register, back):
    """`register`'s relocation moved to `back` bytes before its region's end:
    the base lies in the region, the access does not."""
    def change(m, b):
        rel = relocation_of(m, b, register)
        size = next(r["size"] for r in m["regions"] if r["name"] == rel["target"])
        rel["offset"] = size - back
    return change


# the whole extent of an access (ir/npu/extents.py), not only its base
EXTENT_CASES = {
    "DST base 16 bytes before the region end": (
        _offset_to_region_end("DPU_DST_BASE_ADDR", 16),
        r"job 0 task 0 entry \d+ DPU_DST_BASE_ADDR: the access reaches bytes \[\d+, \d+\) of region "
        r"'\w+' \(\d+ bytes\), \d+ bytes past its end"),
    "feature rows x64": (
        _set_field("CNA_FC_DATA_SIZE0", "DMA_HEIGHT", lambda h: h * 64),
        r"job 0 task 0 entry \d+ CNA_FEATURE_DATA_ADDR: the access reaches .* past its end"),
    "weights WEIGHT_BYTES x64": (
        _set_field("CNA_WEIGHT_SIZE0", "WEIGHT_BYTES", lambda n: n * 64),
        r"job 0 task 0 entry \d+ CNA_DCOMP_ADDR0: the access reaches .* of region 'weights' .* past its end"),
    "DPU write line notch 4000 atoms": (
        _set_field("DPU_DATA_CUBE_NOTCH_ADDR", "NOTCH_ADDR_0", lambda n: 4000),
        r"job 0 task 0 entry \d+ DPU_DST_BASE_ADDR: the access reaches .* past its end"),
    "DPU write surface stride x4096": (
        _set_field("DPU_DST_SURF_STRIDE", "DST_SURF_STRIDE", lambda n: n * 4096),
        r"job 0 task 0 entry \d+ DPU_DST_BASE_ADDR: the access reaches .* past its end"),
    "DPU output precision code 7 (no known meaning)": (
        _set_field("DPU_DATA_FORMAT", "OUT_PRECISION", lambda n: 7),
        r"job 0 task 0 entry \d+ DPU_DST_BASE_ADDR: the extent of the access cannot be proven \(DPU_DATA_FORMAT"),
}

CASES = {
    "DST into weights": (_retarget("DPU_DST_BASE_ADDR", "weights"),
                         r"job 0 task 0 entry \d+ DPU_DST_BASE_ADDR: writes into weights region 'weights'"),
    "DST into regcmd": (_retarget("DPU_DST_BASE_ADDR", "regcmd"),
                        r"job 0 task 0 entry \d+ DPU_DST_BASE_ADDR: writes into regcmd region 'regcmd'"),
    "job writes weights": (_set_job("writes", ["scratch", "weights"]),
                           r"job 0: lists weights region 'weights' as written"),
    "job lists no writes": (_set_job("writes", []), r"job 0: lists no written region"),
    "reads not listed": (_set_job("reads", []),
                         r"job 0 task 0 entry \d+ CNA_DCOMP_ADDR0: reads region 'weights', which the job does "
                         r"not list"),
    "read listed, untouched": (_set_job("reads", ["scratch", "weights", "regcmd"]),
                               r"job 0: lists regcmd region 'regcmd' as read"),
    "duplicate relocation": (_duplicate("DPU_DST_BASE_ADDR"),
                             r"relocations \d+ and \d+ both patch entry \d+ of regcmd region 'regcmd'"),
    "lane -1": (_set_job("lane", -1), r"job 0: lane -1 is not one of the NPU's 3 cores"),
    "lane 3": (_set_job("lane", 3), r"job 0: lane 3 is not one of the NPU's 3 cores"),
    "raw address": (_raw_address, r"entry \d+ DPU_DST_BASE_ADDR: raw address 0x1000 without a relocation"),
    "unrelocated 0 the task uses": (_unrelocated_feature,
                                    r"entry \d+ CNA_FEATURE_DATA_ADDR: unrelocated address \(0\), but the "
                                    r"task's operation-enable 0x\w+ uses it"),
    "relocation of a non-address entry": (_relocate_non_address,
                                          r"relocation \d+ patches entry \d+ of region 'regcmd', which is not "
                                          r"an address register of any task"),
}


@pytest.mark.parametrize("case", CASES)
def test_crafted_rkbin_is_refused_before_any_device(good, tmp_path, case):
    change, message = CASES[case]
    print(f"{case}: {assert_refused(good, tmp_path / 'bad.rkbin', change, message, read_rkbin)}")


def _devices():
    from rkc.runtime.rocket import RocketDevice
    from rkc.runtime.rocket.emulated import STOCK, EmulatedKernel
    from rkc.runtime.rocket.sim_executor import SimExecutor

    return {"sim": lambda: "sim",
            "rocket (emulated)": lambda: RocketDevice(kernel=EmulatedKernel(STOCK, executor=SimExecutor()), quiet=True)}


@pytest.mark.parametrize("device", ["sim", "rocket (emulated)"])
@pytest.mark.parametrize("case", EXTENT_CASES)
def test_access_extent_past_its_region_is_refused_at_load(good, tmp_path, case, device):
    change, message = EXTENT_CASES[case]
    make = _devices()[device]

    def load(path):
        with runtime.load(path, device=make()):
            pass
    print(f"{case} ({device}): {assert_refused(good, tmp_path / 'bad.rkbin', change, message, load)}")


def test_unrelocated_operand_hits_the_guard_page(good, tmp_path):
    """The bias address (BS) left at 0: whether the DPU reads it depends on its
    stage fields, so the simulator refuses it where it reads, in the guard page
    the loader maps at IOVA 0 (where the weights used to sit)."""
    def change(m, b):
        m["relocations"].remove(relocation_of(m, b, "DPU_RDMA_RDMA_BS_BASE_ADDR"))
    bad = mutated(good, tmp_path / "bad.rkbin", change)
    x = np.ones((1, 3, 32, 32), np.float32)
    with runtime.load(bad, device="sim") as model:
        with pytest.raises(MemoryAccessError, match=r"task 0, entry \d+, DPU_RDMA_RDMA_BS_BASE_ADDR: .* guard page "
                                                    r"at IOVA 0x0"):
            model.run({"x": x})


def test_good_file_round_trips_through_the_crafting_helpers(good, tmp_path):
    """The helpers themselves change nothing: a rewritten good file still runs."""
    module, blobs = parts(good)
    same = write_raw(tmp_path / "same.rkbin", module, blobs)
    x = np.ones((1, 3, 32, 32), np.float32)
    with runtime.load(good, device="sim") as a, runtime.load(same, device="sim") as b:
        ra, rb = a.run({"x": x}), b.run({"x": x})
    assert all(np.array_equal(ra[k], rb[k]) for k in ra)


def test_weights_survive_runs_on_every_device(good):
    """Running twice gives the same output (nothing overwrote weights or regcmd)."""
    from rkc.runtime.rocket import RocketDevice
    from rkc.runtime.rocket.emulated import STOCK, EmulatedKernel
    from rkc.runtime.rocket.sim_executor import SimExecutor

    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    for device in ("sim", RocketDevice(kernel=EmulatedKernel(STOCK, executor=SimExecutor()), quiet=True)):
        with runtime.load(good, device=device) as model:
            first = model.run({"x": x})
            second = model.run({"x": x})
        assert all(np.array_equal(first[k], second[k]) for k in first)


def test_extent_proof_is_exact(good, tmp_path):
    """The proof is the walk's bytes, not a bound: DPU_DST_BASE_ADDR moved so the
    write ends exactly at its region's end loads; 16 bytes further is refused."""
    import re

    message = assert_refused(good, tmp_path / "probe.rkbin", _offset_to_region_end("DPU_DST_BASE_ADDR", 16),
                             "DPU_DST_BASE_ADDR: the access reaches", read_rkbin)
    start, end = map(int, re.search(r"bytes \[(\d+), (\d+)\)", message).groups())
    reach = end - start
    read_rkbin(mutated(good, tmp_path / "exact.rkbin", _offset_to_region_end("DPU_DST_BASE_ADDR", reach)))
    assert_refused(good, tmp_path / "over.rkbin", _offset_to_region_end("DPU_DST_BASE_ADDR", reach - 16),
                   r"DPU_DST_BASE_ADDR: the access reaches .* 16 bytes past its end", read_rkbin)
