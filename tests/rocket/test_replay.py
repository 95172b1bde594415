"""`rkrun --replay CASE.json --device rocket` through RocketDevice and the emulated kernel.

The replay is one code path for every device (runtime/replay.py over
runtime/captured.py): buffers wherever the kernel puts them, addresses
relocated, the captured jobs submitted through the real ioctl marshalling.
With the simulator as the emulated kernel's NPU, every capture must give the
report the simulator device gives (same status, same errors to the last bit),
and where the simulator refuses a program, the kernel must fail that job the
way a board does (fault, core reset, errored fence)."""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from click.testing import CliRunner

from golden_cases import case_files
from rkc.runtime.captured import load_case
from rkc.runtime.cli import main
from rkc.runtime.replay import replay, run_cli
from rkc.runtime.rocket import JobFailed, RocketDevice
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from rkc.runtime.rocket.sim_executor import SimExecutor
from rkc.runtime.sim import SimError


def emulated_kernel(**options) -> EmulatedKernel:
    return EmulatedKernel(options.pop("variant", STOCK), executor=SimExecutor(), **options)


def _summary(report) -> tuple:
    return report.status, report.tasks, [(c.what, c.max_error, c.ok) for c in report.checks]


@pytest.mark.parametrize("kind", ["mesa-rocket", "gemm-rocket-userspace"])
def test_every_capture_replays_alike_on_the_emulated_kernel(kind):
    counts = {"same report": 0, "refused alike": 0}
    for path in case_files(kind):
        case = load_case(path)
        try:
            want = _summary(replay(case))
        except SimError as refusal:
            want = refusal
        kernel = emulated_kernel()
        with RocketDevice(kernel=kernel, quiet=True) as dev:
            if isinstance(want, SimError):
                with pytest.raises(JobFailed, match="failed on the NPU"):
                    replay(case, dev)
                # the kernel's log carries the simulator's reason, naming the same register
                assert want.register and any("NPU job timed out" in line and want.register in line
                                             for line in kernel.log), \
                    (path.name, kernel.log)
                counts["refused alike"] += 1
                continue
            report = replay(case, dev)
        assert report.device == "rocket" and _summary(report) == want, path.name
        assert kernel.log == [] and kernel.dropped == [], path.name
        counts["same report"] += 1
    print(f"\n{kind} via RocketDevice on the emulated kernel: {counts}")
    assert counts["same report"] > 0


def _gemm(dtype: str):
    return next(p for p in sorted(case_files("gemm-rocket-userspace"), key=lambda p: p.stat().st_size)
                if p.name.startswith(f"gemm_{dtype}") and json.loads(p.read_text())["status"] == "ok")


def _mesa_conv():
    return next(p for p in sorted(case_files("mesa-rocket"), key=lambda p: p.stat().st_size)
                if "reference_output" in json.loads(p.read_text()))


@pytest.mark.parametrize("pick, kernel_options, cores", [
    (lambda: _mesa_conv(), {}, 1),
    (lambda: _gemm("int8"), {}, 1),
    (lambda: _gemm("fp16_f16"), {"variant": CHAIN_PATCHED, "shared_address_space": True}, 3),
    (lambda: _gemm("fp16_f32"), {"variant": CHAIN_PATCHED, "shared_address_space": True}, 3),
], ids=["mesa-conv", "gemm-int8", "gemm-fp16-fp16-3-cores", "gemm-fp16-fp32-3-cores"])
def test_rkrun_replay_device_rocket(pick, kernel_options, cores, capsys):
    """What `rkrun --replay CASE.json --device rocket --cores N` runs, with the
    emulated kernel in place of /dev/accel."""
    path = pick()
    kernel = emulated_kernel(**kernel_options)
    assert run_cli(str(path), "rocket", cores, kernel=kernel) == 0
    out = capsys.readouterr().out
    assert f"[{load_case(path).schema}] on rocket: pass" in out and "FAIL" not in out, out
    assert len(kernel.kicks) == load_case(path).task_count  # one kick per task, as captured


def test_rkrun_replay_device_rocket_fails_outside_tolerance(tmp_path, capsys):
    """The same capture with one reference element off by one: exit 1 and FAIL."""
    case = json.loads(_gemm("int8").read_text())
    ref = case["submits"][0]["jobs"][0]["tasks"][0]["reference_output"]
    raw = bytearray(zlib.decompress(base64.b64decode(ref["data"])))
    raw[0] ^= 1
    ref["data"] = base64.b64encode(zlib.compress(bytes(raw))).decode()
    ref.pop("sha256")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(case))
    assert run_cli(str(bad), "rocket", 1, kernel=emulated_kernel()) == 1
    assert "FAIL" in capsys.readouterr().out


def test_rkrun_replay_options(tmp_path):
    """--device sim is the simulator; --device rocket without an NPU is one
    clear line; a broken capture is reported before any device opens."""
    ok = str(_gemm("int8"))
    r = CliRunner().invoke(main, ["--replay", ok, "--device", "sim", "--cores", "2"])
    assert r.exit_code == 0 and "on sim: pass" in r.output, r.output
    r = CliRunner().invoke(main, ["--replay", ok, "--device", "rocket"])
    assert r.exit_code == 1 and "rocket" in r.output and "Traceback" not in r.output, r.output
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "rkc-gemm-golden/1", "name": "x", "buffers": [{"handle": 1}]}')
    r = CliRunner().invoke(main, ["--replay", str(broken), "--device", "rocket"])
    assert r.exit_code == 1 and "malformed capture" in r.output, r.output
