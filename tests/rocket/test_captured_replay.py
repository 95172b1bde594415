"""Captured Mesa and GEMM programs through RocketDevice and the emulated kernel.

With the trace executor: the kernel must receive exactly the captured jobs
(relocated to the IOVAs it handed out), the NPU side must fetch exactly the
captured regcmd (relocated), and every address in them must be mapped in the
job's IOMMU domain. With the simulator executor (once runtime.sim exists): the
output buffers must be identical to the simulator device's, byte for byte."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from golden_cases import case_files
from rkc.runtime.captured import PlacedCase, load_case
from rkc.runtime.rocket import RocketDevice
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from rkc.runtime.rocket.executors import TraceExecutor


@lru_cache(maxsize=None)
def small_cases(kind: str, count: int):
    files = sorted(case_files(kind), key=lambda p: p.stat().st_size)
    cases = [load_case(p) for p in files[: count * 3]]
    cases = [c for c in cases if c.submits]  # rejected/unsupported captures have nothing to run
    # prefer variety: multi-task and multi-submit cases first, then the smallest
    cases.sort(key=lambda c: (-len(c.submits), -c.task_count))
    return cases[:count]


@lru_cache(maxsize=None)
def largest_task_cases(kind: str, count: int):
    """The captures with the most tasks per job (multi-task jobs exercise the PC amount/chain paths)."""
    best = []
    for p in case_files(kind):
        if p.stat().st_size > 1_500_000:
            continue
        c = load_case(p)
        if c.submits:
            best.append(c)
    best.sort(key=lambda c: -max(len(j.tasks) for s in c.submits for j in s))
    return best[:count]


def replay(case, device):
    placed = PlacedCase(case, device)
    jobs_per_submit = []
    for s in range(len(case.submits)):
        jobs = placed.load(s)
        device.run(jobs)
        jobs_per_submit.append(jobs)
    return placed, jobs_per_submit


@pytest.mark.parametrize("kind", ["mesa-rocket", "gemm-rocket-userspace"])
@pytest.mark.parametrize("variant", [STOCK, CHAIN_PATCHED], ids=["stock", "patched"])
def test_the_kernel_and_the_npu_see_the_captured_program(kind, variant):
    cases = small_cases(kind, 4) + largest_task_cases(kind, 2)
    assert max(len(j.tasks) for c in cases for s in c.submits for j in s) > 1
    for case in cases:
        trace = TraceExecutor()
        kernel = EmulatedKernel(variant, executor=trace)
        dev = RocketDevice(kernel=kernel, quiet=True)
        placed, jobs_per_submit = replay(case, dev)
        want_tasks = [(placed.relocated(t), placed.bos[t.regcmd_bo].iova + t.regcmd_offset)
                      for s in case.submits for j in s for t in j.tasks]
        assert len(trace.tasks) == len(want_tasks), case.name
        for got, (entries, iova) in zip(trace.tasks, want_tasks):
            assert got.iova == iova, case.name
            n = len(entries)
            assert np.array_equal(got.entries[:n], entries), case.name  # the PC may fetch one padding slot more
        assert [(k.regcmd, k.regcmd_count, k.task_number) for k in kernel.kicks] == \
            [(iova, len(e), 1) for e, iova in want_tasks], case.name
        # (validation refused any address outside a live BO; the trace executor
        # faulted on any address not mapped in the job's IOMMU domain)
        assert kernel.dropped == [] and kernel.log == [], case.name
        dev.close()


def test_outputs_identical_to_the_simulator_device():
    """The end-to-end check: the same captured programs, run by the simulator
    device and by RocketDevice over the emulated kernel executing with the
    simulator, leave byte-identical output buffers (and match the captured
    per-task references where the capture has them)."""
    sim_mod = pytest.importorskip("rkc.runtime.sim", reason="runtime.sim (issue 3) is not on this branch yet")
    from rkc.runtime.rocket.sim_executor import SimExecutor

    for kind in ("mesa-rocket", "gemm-rocket-userspace"):
        for case in small_cases(kind, 3):
            sim_dev = sim_mod.SimDevice()
            rk_dev = RocketDevice(kernel=EmulatedKernel(CHAIN_PATCHED, executor=SimExecutor()), quiet=True)
            outs = {h for s in case.submits for j in s for h in j.out_handles}
            results = []
            for dev in (sim_dev, rk_dev):
                placed, _ = replay(case, dev)
                results.append({h: placed.read(h) for h in outs})
            assert results[0] == results[1], case.name


def test_mesa_multi_task_jobs_run_as_one_chained_kick():
    """Mesa links every task's tail to the next (PC_BASE_ADDRESS, and
    PC_REGISTER_AMOUNTS = align((n - 4) / 2, 2)). On the patched kernel the
    whole job is one kick, and the modelled PC, following those links,
    fetches the same tasks the job lists."""
    case = next(c for c in largest_task_cases("mesa-rocket", 2)
                if max(len(j.tasks) for s in c.submits for j in s) > 1)
    trace = TraceExecutor()
    kernel = EmulatedKernel(CHAIN_PATCHED, executor=trace)
    dev = RocketDevice(kernel=kernel, quiet=True)
    placed = PlacedCase(case, dev)
    jobs = placed.load(0)
    dev.run(jobs, chained=True)
    assert [k.task_number for k in kernel.kicks] == [len(j.tasks) for j in jobs]
    assert [t.iova for t in trace.tasks] == [t.regcmd_iova for j in jobs for t in j.tasks]
    assert kernel.log == []
    dev.close()
