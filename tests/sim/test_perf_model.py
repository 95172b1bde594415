"""ir/npu/perf.py's composition of cores and DRAM: one core's DMA reaches only
hw.CORE_DMA_SHARE of DRAM's bandwidth, several cores share all of it."""

import pytest

from rkc.ir.npu import hw
from rkc.ir.npu.perf import JobCost, PerfModel, TaskCost

MB = 10 ** 6


def jobs(lanes: int) -> list[JobCost]:
    """One DMA-bound task of 10 MB on each of `lanes` cores (no MACs)."""
    return [JobCost(lane, 1, [TaskCost(0, 10 * MB, "int8")]) for lane in range(lanes)]


def test_one_core_is_held_to_its_share_and_three_to_dram():
    model = PerfModel(dram_bytes_per_s=25e9, kick_overhead_s=0.0)
    one_core = 10 * MB / (25e9 * hw.CORE_DMA_SHARE)
    assert model.submission_seconds(jobs(1)) == pytest.approx(one_core)
    assert model.submission_seconds(jobs(2)) == pytest.approx(max(one_core, 20 * MB / 25e9))
    assert model.submission_seconds(jobs(3)) == pytest.approx(max(one_core, 30 * MB / 25e9))
    # the measured scaling it encodes: three cores saturate DRAM, one does not
    assert 1 / 3 < hw.CORE_DMA_SHARE < 1 / 2


def test_plain_is_the_model_before_the_core_share():
    plain = PerfModel.plain(dram_bytes_per_s=25e9, kick_overhead_s=0.0)
    assert plain.submission_seconds(jobs(1)) == pytest.approx(10 * MB / 25e9)
    assert PerfModel().submission_seconds(jobs(1)) > plain.submission_seconds(jobs(1))
