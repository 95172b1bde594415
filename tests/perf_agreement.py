"""Shared checks of tests/*/test_modelled_time.py: what the compiler's plan says
an NPU step costs (compiler/inspect.planned_jobs, from the per-task counters the
emitter stored) against what the simulator counted executing the regcmd bytes.
Both go through the one performance model (ir/npu/perf.py), so the totals agree
exactly when every task's MACs, DMA bytes, precision and every job's kicks do."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from rkc.compiler.inspect import npu_figures, planned_jobs
from rkc.ir.npu.perf import JobCost, PerfModel
from rkc.ir.rkbin import read_rkbin
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.stats import JobStats


@contextmanager
def recorded_submits(dev: SimDevice):
    """Every submission's per-job stats, in order."""
    subs: list[list[JobStats]] = []
    submit = dev.submit

    def record(jobs, chained=False):
        sub = submit(jobs, chained)
        subs.append(list(dev.last_jobs))
        return sub

    dev.submit = record
    try:
        yield subs
    finally:
        del dev.submit


def assert_jobs_match(planned: list[JobCost], counted: list[JobStats], where: str) -> None:
    """Job by job: lane, tasks and kicks; task by task: MACs, DMA bytes, precision."""
    assert len(planned) == len(counted), where
    for j, (plan, sim) in enumerate(zip(planned, counted)):
        at = f"{where} job {j}"
        assert (plan.lane, plan.kicks, len(plan.tasks)) == (sim.lane, sim.kicks, len(sim.tasks)), at
        for t, (p, s) in enumerate(zip(plan.tasks, sim.tasks)):
            got = (s.macs, s.dma_bytes, s.precision)
            assert (p.macs, p.dma_bytes, p.precision) == got, (
                f"{at} task {t}: plan {p}, simulator {got} (read {dict(s.dma_read)}, written {dict(s.dma_written)})")


def assert_plan_matches_simulator(steps, subs: list[list[JobStats]], chaining: bool) -> None:
    npu = [s for s in steps if s.kind == "npu"]
    assert len(subs) == len(npu), "one submission per NPU step"
    for step, counted in zip(npu, subs):
        assert_jobs_match(planned_jobs(step, chaining), counted, step.name)


def assert_same_totals(seconds: float, tasks: int, kicks: int, ddr_bytes: int, counters) -> None:
    """What `rkc inspect --json` states for a program run vs the simulator's counters."""
    assert seconds == pytest.approx(counters.modelled_seconds, rel=1e-9)
    assert (tasks, kicks, ddr_bytes) == (counters.tasks, counters.kicks, counters.ddr_bytes)


def assert_serial(path) -> None:
    """One core: the modelled time of every program is the sum of its jobs' (nothing overlaps)."""
    module = read_rkbin(path).module
    model = PerfModel()
    for p in module.programs:
        jobs = [j for s in p.steps if s.kind == "npu" for j in planned_jobs(s, chaining=True)]
        serial = sum(model.job_seconds(j) for j in jobs)
        assert npu_figures(p.steps, model).seconds_chained == pytest.approx(serial, rel=1e-9), p.name


def lanes(path) -> set[int]:
    """The lanes (cores) an rkbin's NPU jobs use."""
    module = read_rkbin(path).module
    return {j.lane for p in module.programs for s in p.steps if s.kind == "npu" for j in s.jobs}
