"""`rkc probe --dram` (compiler/probe/dram.py): CPU streaming bandwidth, the NPU
weight stream (on the simulator: the program only, no figure), and the measured
bandwidth fed to the performance model by `rkc inspect --dram-gbps`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkc.compiler.cli import main
from rkc.compiler.probe import dram
from rkc.ir.errors import RkcError
from rkc.runtime.sim import SimDevice

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("kind,factor", [("copy", 2), ("read", 1)])
def test_cpu_stream_counts_the_bytes_it_moves(kind, factor):
    s = dram.cpu_stream(kind, 4, 8 * dram.MIB, passes=2)
    assert s.bytes_per_pass == factor * 8 * dram.MIB
    assert 0 < s.best_s <= s.median_s
    assert s.as_dict()["gbps"] == round(s.bytes_per_pass / s.best_s / 1e9, 3) > 0


def test_npu_weight_stream_runs_a_checked_gemv_on_a_device():
    with SimDevice() as dev:
        out = dram.npu_weight_stream(dev, k=512, n=256, runs=2)
    assert out["measured"] and out["weight_bytes"] == 512 * 256 and out["runs"] == 2
    assert out["gbps"] == round(out["weight_bytes"] / out["best_s"] / 1e9, 3)


def test_npu_weight_stream_refuses_wrong_values(monkeypatch):
    from rkc.compiler.probe import emitted

    real = emitted.feature_values
    monkeypatch.setattr(emitted, "feature_values", lambda f, raw: real(f, raw) + 1)
    with SimDevice() as dev, pytest.raises(RkcError, match="wrong values"):
        dram.npu_weight_stream(dev, k=512, n=256, runs=1)


def test_probe_dram_without_npu_reports_cpu_and_says_npu_not_measurable(tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["probe", "--dram", "--dram-mib", "8", "--only", "gemv_m1", "-o", str(out),
                                       "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    section = json.loads(out.read_text())["dram"]
    assert [(s["kind"], s["threads"]) for s in section["cpu"]] == [("copy", 1), ("copy", 4), ("read", 1), ("read", 4)]
    assert all(s["gbps"] > 0 for s in section["cpu"])
    assert section["npu"] == {"measured": False, "note": dram.SIM_NOTE}
    assert "  NPU  not measurable here: no NPU on this machine" in result.stdout
    assert dram.bandwidth_from(str(out))[0] == max(s["gbps"] for s in section["cpu"] if s["kind"] == "read") * 1e9


def test_probe_dram_records_the_clocks_it_ran_at(tmp_path):
    """A bandwidth figure means little without the DDR rate: the report keeps the dmc and cpufreq state."""
    from kernel_fakeboard import FakeBoard

    root = tmp_path / "board"
    board = FakeBoard(root)
    board.soc(volt_sel=(2, 7))
    board.dmc(governor="powersave", cur_mhz=528)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["probe", "--dram", "--dram-mib", "8", "--only", "gemv_m1", "-o", str(out),
                                       "--root", str(root)])
    assert result.exit_code == 0, result.output
    clocks = json.loads(out.read_text())["dram"]["clocks"]
    assert (clocks["dmc"]["governor"], clocks["dmc"]["cur_hz"]) == ("powersave", 528_000_000)
    assert [(p["policy"], p["cur_khz"]) for p in clocks["cpufreq"]] == [
        ("policy0", 1_800_000), ("policy4", 2_304_000), ("policy6", 2_400_000)]
    assert ("  measured at: DDR 528 MHz of 2400 MHz (powersave); policy0 A55 1800 MHz (performance); "
            "policy4 A76 2304 MHz (performance); policy6 A76 2400 MHz (performance)\n") in result.stdout


def test_probe_without_dram_has_no_section(tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["probe", "--only", "gemv_m1", "-o", str(out), "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["dram"] is None


def report(tmp_path, npu: dict) -> str:
    path = tmp_path / "probe.json"
    path.write_text(json.dumps({"dram": {"cpu": [{"kind": "read", "threads": 1, "gbps": 9.0},
                                                 {"kind": "read", "threads": 4, "gbps": 19.5},
                                                 {"kind": "copy", "threads": 4, "gbps": 30.0}], "npu": npu}}))
    return str(path)


def test_bandwidth_from_a_number_or_a_report(tmp_path):
    assert dram.bandwidth_from("12.5") == (12.5e9, "12.5 GB/s (--dram-gbps)")
    bw, source = dram.bandwidth_from(report(tmp_path, {"measured": False, "note": "x"}))
    assert bw == 19.5e9 and "CPU read with 4 thread(s)" in source
    bw, source = dram.bandwidth_from(report(tmp_path, {"measured": True, "gbps": 21.0}))
    assert bw == 21e9 and "NPU weight stream" in source


@pytest.mark.parametrize("bad,message", [("0", "positive"), ("-3", "positive"), ("nowhere.json", "readable"),
                                         ("{not json", "not a JSON")])
def test_bandwidth_from_bad_input(tmp_path, bad, message):
    if bad.startswith("{"):
        (tmp_path / "bad.json").write_text(bad)
        bad = str(tmp_path / "bad.json")
    with pytest.raises(RkcError, match=message):
        dram.bandwidth_from(bad)


@pytest.mark.parametrize("section,message", [
    ({"npu": {"measured": True}, "cpu": []}, "NPU weight stream has no positive GB/s"),
    ({"npu": {"measured": True, "gbps": "fast"}, "cpu": []}, "NPU weight stream has no positive GB/s"),
    ({"npu": {}, "cpu": [{"kind": "read", "threads": 1, "gbps": "x"}]}, "run rkc probe --dram"),
    ({"npu": {}, "cpu": [{"kind": "read", "threads": 1, "gbps": -1.0}]}, "run rkc probe --dram"),
    ({"npu": {}, "cpu": [{"kind": "read", "threads": 1, "gbps": True}]}, "run rkc probe --dram"),
    ({"npu": [1], "cpu": [1, 2]}, "run rkc probe --dram")])
def test_malformed_report_is_one_clear_error(tmp_path, section, message):
    """A report is user input: a figure missing, not a number or not positive is refused, not a traceback."""
    (tmp_path / "p.json").write_text(json.dumps({"dram": section}))
    with pytest.raises(RkcError, match=message):
        dram.bandwidth_from(str(tmp_path / "p.json"))


@pytest.mark.parametrize("bad", ["inf", "nan", "-inf"])
def test_bandwidth_must_be_finite(bad):
    with pytest.raises(RkcError, match="positive number"):
        dram.bandwidth_from(bad)


def test_report_without_dram_section(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"dram": None, "probes": []}))
    with pytest.raises(RkcError, match="run rkc probe --dram"):
        dram.bandwidth_from(str(tmp_path / "p.json"))


def test_inspect_models_with_the_measured_bandwidth(tmp_path):
    from onnx_models import example, save
    from rkc.compiler.build import BuildOptions, build
    from rkc.compiler.inspect import figures
    from rkc.ir.npu.perf import PerfModel
    from rkc.ir.rkbin import read_rkbin

    model = example("mlp").build_model()
    onnx = save(model, tmp_path / "mlp.onnx")
    rkbin = tmp_path / "mlp.rkbin"
    build(onnx, rkbin, BuildOptions(precision="fp16"))

    def inspect(*args):
        res = subprocess.run([str(BIN / "rkc"), "inspect", str(rkbin), *args], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return res.stdout

    default = json.loads(inspect("--json"))
    slow = json.loads(inspect("--json", "--dram-gbps", "2.5"))
    probed = json.loads(inspect("--json", "--dram-gbps", report(tmp_path, {"measured": True, "gbps": 2.5})))
    assert default["dram_bytes_per_s"] == PerfModel().dram_bytes_per_s
    assert slow == probed and slow["dram_bytes_per_s"] == 2.5e9
    module = read_rkbin(rkbin).module
    assert slow == json.loads(json.dumps(figures(module, PerfModel(dram_bytes_per_s=2.5e9))))
    assert slow["programs"]["main"]["modelled_npu_s"] > default["programs"]["main"]["modelled_npu_s"]
    text = inspect("--dram-gbps", "2.5")
    assert text.startswith("DRAM bandwidth: 2.5 GB/s (--dram-gbps)\n")
    ms = slow["programs"]["main"]["modelled_npu_s"] * 1e3
    assert f"modelled NPU time {ms:.3f} ms" in text


def test_inspect_bad_dram_gbps_is_one_line(tmp_path):
    res = subprocess.run([str(BIN / "rkc"), "inspect", str(tmp_path / "x.rkbin"), "--dram-gbps", "fast"],
                         capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "error: --dram-gbps fast: neither a number nor a readable probe report (No such file or directory)"]


def test_bench_models_with_the_measured_bandwidth(tmp_path):
    """bench/emit_shapes.py --dram-gbps REPORT: the rows' DRAM-bound limits use the report's bandwidth."""
    from rkc.ir.npu import hw

    probe = report(tmp_path, {"measured": True, "gbps": 2.5})
    out = tmp_path / "shapes.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / "emit_shapes.py"
    res = subprocess.run([sys.executable, str(bench), "--quick", "--dram-gbps", probe, "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    figures = json.loads(out.read_text())
    assert figures["dram_bytes_per_s"] == 2.5e9
    for r in figures["rows"]:
        compute = r["macs"] / (hw.MACS_PER_CYCLE[r["dtype"]] * hw.CORES * hw.CLOCK_HZ_MAX)
        assert r["limit_us"] == pytest.approx(max(compute, r["min_bytes"] / 2.5e9) * 1e6), r["what"]
    assert any(r["min_bytes"] / 2.5e9 > r["macs"] / (hw.MACS_PER_CYCLE[r["dtype"]] * hw.CORES * hw.CLOCK_HZ_MAX)
               for r in figures["rows"]), "no row is DRAM-bound: the check above would not see the bandwidth"
