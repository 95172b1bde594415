"""`rkc probe`: the framework compares NPU and simulator bytes and reports; without
an NPU it runs on the emulated kernel and says so."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from rkc.compiler.cli import main
from rkc.compiler.probe import Probe, ProbeRun, ProbeUnavailable, run_probe
from rkc.compiler.probe.programs import PROBES
from rocket_support import IncrementExecutor, put_task, task_entries
from rkc.runtime.device import Job
from rkc.runtime.rocket import RocketDevice
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from rkc.runtime.rocket.sim_executor import SimExecutor
from rkc.runtime.sim import SimDevice, SimError
from rkc.runtime.sim.quirks import DEFAULT


def emulated(quirks_of=lambda h: dataclasses.replace(DEFAULT, **h), variant=CHAIN_PATCHED):
    return lambda h: RocketDevice(kernel=EmulatedKernel(variant, executor=SimExecutor(quirks_of(h))), quiet=True)


def sim(h):
    return SimDevice(quirks=dataclasses.replace(DEFAULT, **h))


def by_name(name):
    return next(p for p in PROBES if p.name == name)


def test_cli_without_npu_runs_on_the_emulated_kernel(tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["probe", "-o", str(out), "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "no NPU on this machine: the probes ran against the emulated rocket kernel" in result.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "rkc-probe-report/1" and report["target"] == "emulated kernel"
    assert report["device"]["chained_kicks"] is True
    status = {p["name"]: p["status"] for p in report["probes"]}
    assert set(status) == {p.name for p in PROBES}
    # a PPU-only task is refused by the device: rocket completes tasks on the DPU interrupt only
    assert status.pop("ppu_pool") == "npu-failed"
    assert set(status.values()) == {"agree"}
    chain = next(p for p in report["probes"] if p["name"] == "chain_int8")
    assert "says nothing about hardware" in chain["conclusion"]
    (entry,) = chain["outputs"].values()
    assert entry["npu_sha256"] == entry["sim_sha256"]


@pytest.mark.parametrize("probe", [p for p in PROBES if p.hypothesis], ids=lambda p: p.name)
def test_each_program_exercises_its_question(probe):
    """Under the simulator's conservative reading the program is refused, so
    the probe really tests that reading (and the hypothesis makes it run)."""
    with pytest.raises(SimError):
        probe.program(SimDevice(quirks=DEFAULT))
    if probe.name != "ppu_pool":
        run = probe.program(sim(probe.hypothesis))
        for got, want in run.exact.values():
            np.testing.assert_array_equal(got, want)


def test_weight_reuse_program_reuses_weights(monkeypatch):
    from rkc.compiler.npu import api
    from rkc.compiler.probe import programs

    seen = []
    real_emit = programs.emit
    monkeypatch.setattr(programs, "emit", lambda op, options=api.DEFAULT_OPTIONS: seen.append(real_emit(op, options))
                        or seen[-1])
    by_name("weight_reuse").program(sim({}))
    (result,) = seen
    assert len(result.jobs) == 1 and len(result.tasks) > 1
    assert any(t.cbuf.weight_reuse for t in result.tasks[1:])


def test_list_and_unknown_names(tmp_path):
    r = CliRunner().invoke(main, ["probe", "--list"])
    assert r.exit_code == 0 and "chain_int8    Q1" in r.stdout
    r = CliRunner().invoke(main, ["probe", "--only", "nope", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "unknown probe(s) nope" in r.stderr


def test_a_board_that_breaks_int8_chains_is_reported():
    """If the board behaves like the simulator's conservative reading (int8
    chains refused/wrong), the probe says so instead of agreeing."""
    board = emulated(quirks_of=lambda h: DEFAULT)  # the "board" keeps rejecting chained int8
    result = run_probe(by_name("chain_int8"), board, sim)
    assert result.status == "npu-failed"
    assert "failed on the NPU" in result.detail
    assert result.conclusion.startswith("int8 chains are wrong on this board")


def test_wrong_values_are_reported_even_when_npu_and_simulator_agree():
    """Outputs that agree byte for byte between board and simulator but not
    with the exact product (here the decoded values are corrupted after the
    run) are still 'differ'."""
    probe = by_name("weight_reuse")
    result = run_probe(probe, emulated(), sim)
    assert result.status == "agree"
    wrong = dataclasses.replace(probe, program=lambda d: _corrupt(probe.program(d)))
    result = run_probe(wrong, emulated(), sim)
    assert result.status == "differ" and "values differ from the exact result" in result.detail


def _corrupt(run):
    for name, (got, want) in run.exact.items():
        run.exact[name] = (got + 1, want)
    return run


def test_differing_bytes_are_reported():
    """A probe whose board output differs from the simulator's."""
    def program(device):
        src, dst, rc = device.create_bo(4096), device.create_bo(4096), device.create_bo(4096)
        src.host[:64] = 3
        device.finish_cpu_access(src)
        task = put_task(rc, 0, task_entries(src.iova, dst.iova))
        device.finish_cpu_access(rc)
        device.run([Job([task], [src, rc], [dst], label="probe")])
        device.prepare_cpu_access(dst)
        return ProbeRun({"dst": dst.host[:64].tobytes()})

    probe = Probe("toy", "", "toy", {}, program, "same", "different")
    board = lambda h: RocketDevice(kernel=EmulatedKernel(STOCK, executor=IncrementExecutor()), quiet=True)
    model = lambda h: RocketDevice(kernel=EmulatedKernel(STOCK, executor=_Twice()), quiet=True)
    result = run_probe(probe, board, model)
    assert result.status == "differ"
    assert result.detail == "dst: 64 of 64 bytes differ (first at byte 0)"
    assert result.conclusion == "different"


class _Twice(IncrementExecutor):
    """Like IncrementExecutor, then adds one more to the destination."""

    def run_task(self, memory, iova, entries, irq_blocks=("DPU",)):
        super().run_task(memory, iova, entries, irq_blocks)
        from rkc.ir.npu.regcmd import decode
        dst = next(d.value for d in decode(entries) if d.register is not None and d.register.name ==
                   "DPU_DST_BASE_ADDR")
        data = bytes((b + 1) & 0xFF for b in memory.read(dst, 64))
        memory.write(dst, data)


def test_unavailable_and_skipped():
    def needs_more(device):
        raise ProbeUnavailable("needs something this build lacks")

    result = run_probe(Probe("x", "", "x", {}, needs_more, "", ""), emulated(), sim)
    assert result.status == "unavailable" and result.detail == "needs something this build lacks"
    result = run_probe(by_name("chain_fp16"), emulated(variant=STOCK), sim)
    assert result.status == "skipped" and "kernel/patches/0003" in result.detail
