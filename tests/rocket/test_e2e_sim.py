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
they are the captured Mesa and GEMM programs (../shared/golden) and programs
of rkc's own op emitters, whose jobs the emitter spreads over the three cores
(lanes); compiled models (issue 5) plug in the same way: load the rkbin on the
device, run it, return its outputs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.probe import emitted
from golden_cases import golden_dir
from rkc.runtime.captured import PlacedCase, load_case
from rkc.runtime.device import Device
from rkc.runtime.rocket import JobFailed, RocketDevice
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from rkc.runtime.rocket.sim_executor import SimExecutor
from rkc.runtime.sim import SimDevice, SimError

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


def _emitted(name: str, build) -> Workload:
    """An op of compiler/npu with its jobs on the lanes the emitter chose."""
    def run(device: Device, config: Config) -> dict[str, bytes]:
        results, inputs, outputs = build()
        program = emitted.place(results, inputs, name)
        placed = PlacedCase(program.case, device)
        jobs = placed.load(0)
        if not config.spread_lanes:
            for job in jobs:
                job.lane = 0
        device.run(jobs, chained=config.chained and fp16)
        return {out: placed.read(program.handles[f.buffer]) for out, f in outputs.items()}

    fp16 = name.startswith("fp16")
    results, _, _ = build()
    return Workload(name, run, fp16, max_jobs=len(results[0].jobs), max_tasks=max(len(j.tasks) for j in results[0].jobs))


def _gemm(m, k, n, dtype, out, **options):
    def build():
        rng = np.random.default_rng(m * 7 + k * 3 + n)
        a = rng.integers(-128, 128, (m, k)).astype(np.int8) if dtype == "int8" else \
            rng.standard_normal((m, k)).astype(np.float16)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8) if dtype == "int8" else \
            (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
        A, C = api.Feature.gemm("A", 0, m, k, dtype), api.Feature.gemm("C", 0, m, n, out)
        apad = np.zeros((api.gemm_rows(m), k), a.dtype)
        apad[:m] = a
        return [emit(api.Gemm(A, b, C, m), api.EmitOptions(**options))], {"A": (A, apad.T[:, :, None])}, {"C": C}
    return build


def _conv(c, h, w, o, kernel, dtype, out):
    def build():
        rng = np.random.default_rng(c + h + w + o)
        x = rng.integers(-128, 128, (c, h, w)).astype(np.int8) if dtype == "int8" else \
            rng.standard_normal((c, h, w)).astype(np.float16)
        wt = rng.integers(-128, 128, (o, kernel, kernel, c)).astype(np.int8) if dtype == "int8" else \
            (rng.standard_normal((o, kernel, kernel, c)) / kernel / np.sqrt(c)).astype(np.float16)
        p = kernel // 2
        X, Y = api.Feature("X", 0, c, h, w, dtype), api.Feature("Y", 0, o, h, w, out)
        return [emit(api.Conv2D(X, wt, Y, padding=(p, p, p, p)))], {"X": (X, x)}, {"Y": Y}
    return build


def emitted_workloads() -> list[Workload]:
    return [
        _emitted("int8_gemm_n8200_3cores", _gemm(4, 256, 8200, "int8", "int32")),
        _emitted("int8_gemm_m300_tiles", _gemm(300, 1000, 70, "int8", "int32")),
        _emitted("fp16_gemm_k8300", _gemm(48, 8300, 48, "fp16", "fp16")),
        _emitted("fp16_gemm_n3000_3cores", _gemm(16, 512, 3000, "fp16", "fp32", n_tile_max=512)),
        _emitted("int8_conv3x3_rows_over_cores", _conv(64, 96, 96, 64, 3, "int8", "int32")),
        _emitted("fp16_conv3x3", _conv(32, 24, 24, 48, 3, "fp16", "fp16")),
    ]


WORKLOADS = captured_workloads() + emitted_workloads()


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
    assert sum(w.max_jobs > 1 and w.name.endswith("cores") for w in WORKLOADS) >= 2  # emitter-spread lanes
