"""End to end through the real marshalling: every workload runs on the simulator
device and on RocketDevice over the emulated kernel (whose NPU is the same
simulator), and the output buffers must be byte-identical.

Device configurations: a stock 6.18 kernel (one kick per task), the kernel/
patch 0003 kernel (fp16 jobs as one chained kick; int8 chains are refused by
the simulator's Q1 reading on both sides), and a kernel with a shared address
space where the jobs are spread over three lanes and the emulated scheduler
runs the most recent runnable job first, so only the dependencies the device
actually expressed in the in/out lists keep the results right.

A workload is a name and a function device -> {output name: bytes}. Today
they are the captured Mesa and GEMM programs (../shared/golden); compiled
models (issue 5) plug in the same way: load the rkbin on the device, run it,
return its outputs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from golden_cases import golden_dir
from runtime.captured import PlacedCase, load_case
from runtime.device import Device
from runtime.rocket import JobFailed, RocketDevice
from runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from runtime.rocket.sim_executor import SimExecutor
from runtime.sim import SimDevice, SimError

SIZE_LIMIT = 400_000  # bytes of JSON per capture, keeps the suite quick


@dataclass
class Workload:
    name: str
    run: Callable[[Device, "Config"], dict[str, bytes]]
    fp16: bool = False
    max_jobs: int = 1  # per submit
    max_tasks: int = 1  # per job


@dataclass(frozen=True)
class Config:
    name: str
    make: Callable[[], Device]
    chained: bool = False
    spread_lanes: bool = False


CONFIGS = [
    Config("rocket-stock", lambda: RocketDevice(kernel=EmulatedKernel(STOCK, executor=SimExecutor()), quiet=True)),
    Config("rocket-chain-patch", lambda: RocketDevice(
        kernel=EmulatedKernel(CHAIN_PATCHED, executor=SimExecutor()), quiet=True), chained=True),
    Config("rocket-3-lanes", lambda: RocketDevice(
        kernel=EmulatedKernel(STOCK, executor=SimExecutor(), shared_address_space=True, policy="adversarial"),
        cores=3, quiet=True), spread_lanes=True),
]
SIM = Config("sim", SimDevice)


def _captured(path: Path) -> Workload:
    raw = json.loads(path.read_text())
    fp16 = raw.get("params", {}).get("dtype") == "fp16"

    def run(device: Device, config: Config) -> dict[str, bytes]:
        case = load_case(path)
        placed = PlacedCase(case, device)
        chained = config.chained and fp16
        for s in range(len(case.submits)):
            jobs = placed.load(s, link_tails=chained)
            if config.spread_lanes:
                for j, job in enumerate(jobs):
                    job.lane = j % 3
            device.run(jobs, chained=chained)
        outs = sorted({h for s in case.submits for j in s for h in j.out_handles})
        return {f"bo{h}": placed.read(h) for h in outs}

    jobs = [len(s["jobs"]) for s in raw["submits"]]
    tasks = [len(j["tasks"]) for s in raw["submits"] for j in s["jobs"]]
    return Workload(path.stem, run, fp16, max(jobs), max(tasks))


def captured_workloads() -> list[Workload]:
    try:
        root = golden_dir()
    except pytest.skip.Exception:
        return []
    picked = []
    for kind, every in (("mesa-rocket", 12), ("gemm-rocket-userspace", 4)):
        index = json.loads((root / kind / "index.json").read_text())
        ok = [root / kind / e["file"] for e in index if e.get("file") and e["status"] == "ok"]
        ok = [p for p in ok if p.stat().st_size <= SIZE_LIMIT]
        many_jobs = [root / kind / e["file"] for e in index if e.get("file") and (e.get("jobs") or 1) > 1]
        many_tasks = sorted(ok, key=lambda p: -next(e["tasks"] for e in index if e.get("file") == p.name))[:4]
        chosen = dict.fromkeys(ok[::every] + many_jobs + many_tasks)
        picked += [_captured(p) for p in chosen]
    return picked


WORKLOADS = captured_workloads()


def _reason(message: str) -> str:
    """A simulator error without what differs between the two runs: the job
    label (the kernel knows no labels), handles and addresses."""
    return re.sub(r"sim: job [^,]*,|handle=\d+|0x[0-9a-f]+", "", message)


def _nonzero(outputs: dict[str, bytes]) -> bool:
    return any(any(b) for b in outputs.values())


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_identical_to_the_simulator_device(workload, config):
    """Same bytes out, or the same refusal: where the simulator device refuses
    a program (SimError), the rocket device must report the job as failed and
    the emulated kernel's log must carry the simulator's reason."""
    sim = SIM.make()
    try:
        expected = workload.run(sim, Config("sim", SimDevice, chained=config.chained,
                                            spread_lanes=config.spread_lanes))
    except SimError as exc:
        expected = exc
    sim.close()
    dev = config.make()
    try:
        got = workload.run(dev, config)
    except JobFailed as exc:
        got = exc
    finally:
        log = list(dev.kernel.log)
        kicks = list(dev.kernel.kicks)
        submit_fds = {fd for name, fd in dev.kernel.calls if name == "DRM_IOCTL_ROCKET_SUBMIT"}
        dev.close()
    if isinstance(expected, SimError):
        assert isinstance(got, JobFailed), f"{workload.name}: the simulator refused ({expected}), rocket did not"
        assert any(_reason(str(expected)) in _reason(line) for line in log), (str(expected), log)
        return
    assert not isinstance(got, Exception), f"{workload.name} on {config.name}: {got}; kernel log: {log}"
    assert _nonzero(expected), f"{workload.name}: the simulator wrote nothing, the comparison would be vacuous"
    assert got == expected, f"{workload.name} on {config.name} differs from the simulator device; kernel log: {log}"
    if config.spread_lanes and workload.max_jobs > 1:
        assert len(submit_fds) > 1  # the jobs really went to several fds
    if config.chained and workload.fp16 and workload.max_tasks > 1:
        assert max(k.task_number for k in kicks) > 1  # and a job really ran as one chained kick


def test_there_are_workloads_of_every_kind():
    names = [w.name for w in WORKLOADS]
    assert len(names) >= 50
    assert any(n.startswith("conv") for n in names) and any(n.startswith("dwconv") for n in names)
    assert any(n.startswith("add_residual") for n in names)
    assert any(n.startswith("gemm_int8") for n in names) and any(w.fp16 for w in WORKLOADS)
