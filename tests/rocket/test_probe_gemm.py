"""`rkc probe --gemm` (compiler/probe/rate.py): rkc's own GEMM programs, checked
against numpy and timed, beside the performance model's figure for the same
program; without an NPU nothing is timed and the report says so."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rkc.compiler.cli import main
from rkc.compiler.probe import rate
from rkc.ir.errors import RkcError
from rkc.runtime.sim import SimDevice

SMALL = (64, 256, 128)


@pytest.mark.parametrize("precision,cores", [("int8", 1), ("int8", 3), ("fp16", 3)])
def test_gemm_rate_runs_a_checked_program_on_a_device(precision, cores):
    with SimDevice() as dev:
        out = rate.gemm_rate(dev, precision, cores, SMALL, runs=2)
    assert out["measured"] and out["ops"] == 2 * 64 * 256 * 128 and out["runs"] == 2 and out["tasks"] >= 1
    assert out["gops"] == round(out["ops"] / out["best_s"] / 1e9, 1)
    assert set(out["modelled_gops"]) == {"1000MHz", "600MHz"}
    assert out["modelled_gops"]["1000MHz"] >= out["modelled_gops"]["600MHz"] > 0


def test_gemm_rate_refuses_wrong_values(monkeypatch):
    from rkc.compiler.probe import emitted

    real = emitted.feature_values
    monkeypatch.setattr(emitted, "feature_values", lambda f, raw: real(f, raw) + 1)
    with SimDevice() as dev, pytest.raises(RkcError, match="wrong values"):
        rate.gemm_rate(dev, "int8", 1, SMALL, runs=1)


def test_probe_gemm_without_npu_says_not_measurable(tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["probe", "--gemm", "--only", "gemv_m1", "-o", str(out),
                                       "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    section = json.loads(out.read_text())["gemm"]
    assert [(r["precision"], r["cores"]) for r in section] == list(rate.CASES)
    assert all(r == {"measured": False, "precision": r["precision"], "cores": r["cores"], "note": rate.SIM_NOTE}
               for r in section)
    assert "GEMM int8 1 core(s): not measurable here" in result.stdout
