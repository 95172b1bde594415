"""rkc's Mesa-compatible mode reproduces every captured Mesa convolution and
depthwise case byte for byte: every regcmd entry (addresses through the
relocations), the job split, and the weight, bias and input-layout buffers.
The fused-ADD captures come from an older Mesa arithmetic: they must match
everywhere except the four registers that arithmetic sets."""

import json

import pytest
from click.testing import CliRunner

from rkc.compiler.cli import main
from rkc.compiler.npu import golden
from golden_cases import case_files

ADD_ARITHMETIC = {"DPU_EW_CVT_SCALE_VALUE", "DPU_OUT_CVT_OFFSET", "DPU_OUT_CVT_SCALE", "DPU_OUT_CVT_SHIFT"}


def _cases():
    return [(p, json.loads(p.read_text())) for p in case_files("mesa-rocket")]


def test_every_conv_and_depthwise_case_matches():
    checked, failures = 0, []
    for path, case in _cases():
        if case["status"] != "ok" or not golden.is_ground_truth(case):
            continue
        report = golden.check_case(case)
        checked += 1
        if not report.ok:
            failures.append(f"{path.name}: {report.mismatches[0]}")
        assert report.entries >= 130 and report.buffers >= 4
    assert not failures, "\n".join(failures[:20])
    assert checked >= 537


def test_fused_add_cases_differ_only_in_the_old_add_arithmetic():
    seen = 0
    for path, case in _cases():
        if golden.is_ground_truth(case):
            continue
        report = golden.check_case(case, stop_at_first=False)
        regs = {m.what.split()[1].split(".")[0] for m in report.mismatches}
        assert regs and regs <= ADD_ARITHMETIC, f"{path.name}: {[str(m) for m in report.mismatches]}"
        seen += 1
    assert seen == 8


def test_cli_reports_the_first_difference_and_exit_code(tmp_path):
    path = next(p for p, c in _cases() if c["name"] == "conv_k3_s1_same_ic32_oc32_112x112")
    runner = CliRunner()
    ok = runner.invoke(main, ["golden", str(path)])
    assert ok.exit_code == 0 and "match (260 entries" in ok.output
    case = json.loads(path.read_text())
    task = case["submits"][0]["jobs"][0]["tasks"][1]
    entry = int(task["regcmd"][9], 16)  # CNA_DATA_SIZE0 of the second task
    task["regcmd"][9] = f"{entry ^ (1 << 16):016x}"  # flip DATAIN_HEIGHT bit 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(case))
    out = runner.invoke(main, ["golden", str(bad)])
    assert out.exit_code == 1
    assert "job 0 (op0) task 1 entry 9: CNA CNA_DATA_SIZE0.DATAIN_HEIGHT: expected 0x16, got 0x17" in out.output


def test_relocated_entries_compare_by_buffer_and_offset(tmp_path):
    path = next(p for p, c in _cases() if c["name"] == "conv_k3_s1_same_ic32_oc32_112x112")
    case = json.loads(path.read_text())
    for r in case["submits"][0]["jobs"][0]["tasks"][1]["relocations"]:
        if r["reg"] == "DPU_DST_BASE_ADDR":
            r["offset_in_bo"] += 16
    report = golden.check_case(case)
    assert not report.ok and "address of DPU_DST_BASE_ADDR" in str(report.mismatches[0])


def test_unsupported_capture_is_reported_not_matched():
    case = next(c for _, c in _cases() if c["status"] == "unsupported")
    assert golden.check_case(case).status == "skipped"
    with pytest.raises(Exception, match="dilated"):
        from rkc.compiler.npu import mesa
        mesa.mesa_operations(case["model"])


def test_cli_reports_bad_files_in_one_line(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "rkc-mesa-rocket-golden/1", "status": "ok", "model": {}}')
    out = runner.invoke(main, ["golden", str(bad)])
    assert out.exit_code == 1 and "malformed capture" in out.output and "Traceback" not in out.output
    out = runner.invoke(main, ["golden", str(tmp_path / "missing.json")])
    assert out.exit_code == 1 and "cannot read a captured case" in out.output
