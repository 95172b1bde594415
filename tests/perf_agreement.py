"""Shared checks of tests/*/test_modelled_time.py: what the compiler's plan says
an NPU step costs (compiler/inspect.planned_jobs, from the per-task counters the
emitter stored) against what the simulator counted executing the regcmd bytes.
Both go through the one performance model (ir/npu/perf.py), so the totals agree
exactly when every task's MACs, DMA bytes, precision and every job's kicks do."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from compiler.inspect import planned_jobs
from runtime.sim import SimDevice
from runtime.sim.stats import JobStats


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


def assert_plan_matches_simulator(steps, subs: list[list[JobStats]], chaining: bool) -> None:
    """Task by task: MACs, DMA bytes, precision; job by job: tasks and kicks."""
    npu = [s for s in steps if s.kind == "npu"]
    assert len(subs) == len(npu), "one submission per NPU step"
    for step, sim_jobs in zip(npu, subs):
        planned = planned_jobs(step, chaining)
        assert len(planned) == len(sim_jobs), step.name
        for j, (plan, sim) in enumerate(zip(planned, sim_jobs)):
            where = f"{step.name} job {j}"
            assert (plan.lane, plan.kicks, len(plan.tasks)) == (sim.lane, sim.kicks, len(sim.tasks)), where
            for t, (p, s) in enumerate(zip(plan.tasks, sim.tasks)):
                counted = (s.macs, s.dma_bytes, s.precision)
                assert (p.macs, p.dma_bytes, p.precision) == counted, (
                    f"{where} task {t}: plan {p}, simulator {counted} "
                    f"(read {dict(s.dma_read)}, written {dict(s.dma_written)})")


def assert_same_totals(seconds: float, tasks: int, kicks: int, ddr_bytes: int, counters) -> None:
    """What `rkc inspect --json` states for a program run vs the simulator's counters."""
    assert seconds == pytest.approx(counters.modelled_seconds, rel=1e-9)
    assert (tasks, kicks, ddr_bytes) == (counters.tasks, counters.kicks, counters.ddr_bytes)
