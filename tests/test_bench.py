"""bench/run.py and bench/silicon.py on what is quick to build: the figures
they print hang together (read + written = the DDR bytes, slower clocks and
DRAM never model faster, the projection is 1 / (NPU + host)), and the silicon
comparison's arithmetic."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import catalog  # noqa: E402
import silicon  # noqa: E402
from published import BY_KEY, PUBLISHED  # noqa: E402
from rkc.ir.npu.perf import PerfModel  # noqa: E402
from rkc.ir.rkbin import read_rkbin  # noqa: E402

# bench/ off the path again: its llm.py would shadow the tests' llm package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]


def test_run_one_onnx_model(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH / "run.py"), "--only", "mlp", "--json", "--workdir", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["rows"]
    f = row["phases"]["inference"]
    assert row["model"] == "mlp" and row["peak_rss_bytes"] > 0 and row["rkbin_bytes"] > 0
    assert f["tasks"] > 0 and f["kicks_stock"] >= f["kicks_chained"] > 0 and f["submits"] > 0
    assert f["ddr_read"] + f["ddr_written"] == f["ddr_bytes"] and f["ddr_written"] > 0
    t = f["modelled_s"]
    assert t["0.6GHz_17GBps"] >= t["0.6GHz_25GBps"] >= t["1GHz_25GBps"] > 0
    assert t["1GHz_17GBps"] >= t["1GHz_25GBps"]
    assert f["projected_fps"] == pytest.approx(1 / (t["1GHz_25GBps"] + f["host_s"]))
    again = subprocess.run([sys.executable, str(BENCH / "run.py"), "--only", "mlp", "--json", "--workdir",
                            str(tmp_path)], capture_output=True, text=True)
    assert json.loads(again.stdout)["rows"][0]["compile_cached"] is True  # the work dir is reused


@pytest.mark.slow  # two compiles in child processes: ~20 s on this shared machine
def test_a_deployment_build_takes_a_uint8_image_beside_the_default_build(tmp_path, monkeypatch):
    """A catalog entry built as the vendor deploys it (a uint8 NHWC image, PPU completion) is
    its own rkbin, calibrated on pixels, and never reused for the default build or back."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # onnx_models() puts bench/ (its llm.py) on the path
    default = {m.name: m for m in catalog.onnx_models(tmp_path)}["small_cnn"]
    deployed = dataclasses.replace(default, image=catalog.PIXELS_0_1, kernel_ppu_irq=True, fp16_outputs=True)
    path, info = catalog.compiled_onnx(deployed, "int8", 3, tmp_path)
    plain, plain_info = catalog.compiled_onnx(default, "int8", 3, tmp_path)
    assert path != plain and not info["cached"] and not plain_info["cached"]
    assert "--kernel-ppu-irq" in info["options"] and "--kernel-ppu-irq" not in plain_info["options"]
    module = read_rkbin(path).module
    (name,) = module.program("main").inputs
    assert (module.tensor(name).dtype, module.tensor(name).shape) == ("uint8", [1, 32, 32, 3])
    assert read_rkbin(plain).module.tensor(name).dtype == "fp32"
    assert catalog.compiled_onnx(deployed, "int8", 3, tmp_path)[1]["cached"]


def test_run_compiles_first_two_at_a_time_then_measures_each(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH / "run.py"), "--only", "mlp", "small_cnn", "--jobs", "2", "--json",
                        "--workdir", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["compile_jobs"] == 2 and 0 < doc["compile_phase_wall_s"] < doc["wall_s"]
    assert [row["model"] for row in doc["rows"]] == ["small_cnn", "mlp"]  # table order, whatever finished first
    for row in doc["rows"]:  # compiled by the first phase (not reused), measured by the second
        assert row["compile_cached"] is False and row["compile_cpu_s"] > 0
        assert set(row["spent_s"]) == {"compile", "figures", "host"}
    log = r.stderr.splitlines()
    assert max(i for i, line in enumerate(log) if ": compiled (" in line) < min(
        i for i, line in enumerate(log) if ": measured (" in line)


def test_silicon_rows_resolve_and_compare(tmp_path):
    assert len({p.key for p in PUBLISHED}) == len(PUBLISHED)
    assert all(p.source.startswith("https://") for p in PUBLISHED)
    submit = BY_KEY["rocket_submit"]
    assert silicon.optimism(submit, 30.0) == 1.0  # inside the published 27-51 us
    assert silicon.optimism(submit, 20.0) == pytest.approx(27 / 20)
    gemm = BY_KEY["rocket_gemm_fp16"]
    gops = silicon.modelled(gemm, PerfModel(), tmp_path, 2)
    peak = 2 * 3 * 512 * gemm.clock_hz / 1e9  # fp16 MAC peak of 3 cores, GOP/s
    assert 0 < gops < peak
    assert silicon.optimism(gemm, gops) == pytest.approx(gops / gemm.value)


def test_first_token_split_over_model_size():
    """The fit over the vendor's sizes: its Qwen2.5-1.5B widths are the synthetic twin's (tests/llm/synth.py),
    the line passes through the data (each model within 25 % of it), its parts are positive, and rkc's
    modelled time enters only the comparison."""
    from llm.synth import REAL
    from published import RKLLM_TTFT_128_BY_SIZE

    q = REAL["qwen2.5-1.5b"]
    row = next(r for r in RKLLM_TTFT_128_BY_SIZE if r[0] == "Qwen2.5-1.5B")
    assert row[2:] == (q["n_layer"], q["n_embd"], q["n_ff"], q["n_head"] * q["head_dim"],
                       q["n_head_kv"] * q["head_dim"])
    assert row[1] == BY_KEY["rkllm_qwen25_ttft"].value
    split = silicon.ttft_by_size([{"key": "rkllm_qwen25_ttft", "modelled_now": 100.0, "measured": row[1]}])
    assert split["fixed_ms"] > 0 and split["ms_per_billion_weights"] > 0
    assert all(abs(m["fit_ms"] / m["ttft_ms"] - 1) < 0.25 for m in split["models"])
    assert split["rkc_plus_fixed_ms"] == pytest.approx(split["fixed_ms"] + 100.0)
    weights = silicon.decoder_weights(*row[2:])
    assert split["rkc_ops_per_s"] == pytest.approx(2 * 128 * weights / 0.1)


def test_scale_full_depth_rows_are_the_rkbins_own_and_cut_rows_extrapolate_to_them(tmp_path, monkeypatch):
    """bench/scale.py on a 3-layer llama twin (real arithmetic, tiny widths): the full-depth row is the
    compiled rkbin's own figures, unstarred; a 2-layer cut extrapolates to the same decode and prefill
    figures (the layers are alike) and is starred; the roofline's weight bytes are the rkbin's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rkc_bench_scale_test", BENCH / "scale.py")
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    monkeypatch.setitem(scale.REAL, "tiny-llama", dict(arch="llama", n_embd=64, n_head=4, n_head_kv=2, head_dim=16,
                                                       n_ff=256, n_layer=3, n_vocab=512, tokenizer="spm", tied=True))
    full = scale.measure("tiny-llama", 0, "int8", None, "q8_0", tmp_path, jobs=2)
    cut = scale.measure("tiny-llama", 2, "int8", None, "q8_0", tmp_path, jobs=1)
    assert full["full_depth"] and not full["extrapolated"] and full["layers_compiled"] == 3
    assert cut["extrapolated"] and cut["layers_compiled"] == 2
    assert full["weight_bytes_full"] == full["npu_weight_bytes"] == cut["weight_bytes_full"]
    assert full["ddr_bytes_per_token_full"] == full["ddr_bytes_per_token"]
    for key in ("tg_modelled", "pp128_modelled", "ddr_bytes_per_token_full"):
        assert cut[key] == pytest.approx(full[key], rel=1e-6), key
    assert 0 < full["tg_share_of_roofline"] <= 1
    lines = scale.table([full, cut]).splitlines()
    assert "3/3 FULL" in lines[2] and "*" not in lines[2]
    assert "2/3 |" in lines[3] and "*" in lines[3]
    assert not list(tmp_path.iterdir())  # the GGUFs and rkbins are deleted


@pytest.mark.slow
def test_soak_runs_briefly(tmp_path):
    """bench/soak.py for a few seconds: its report hangs together, with no error, crash or non-zero exit."""
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(BENCH / "soak.py"), "--minutes", "0.1", "--clients", "4",
                        "--sample", "1", "--out", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=BENCH.parent, env={**os.environ, "PYTHONPATH": str(BENCH.parent)})
    assert r.returncode == 0, r.stderr
    row = json.loads(out.read_text())
    assert row["requests"] == sum(row["outcomes"].values()) == sum(row["by_kind"].values()) > 0
    assert row["errors"] == 0 and not row["crashed"] and row["exit_status"] == 0
    assert row["outcomes"].get("served", 0) > 0 and len(row["rss_kib"]) >= 3
    assert "requests" in r.stdout and "RSS over time" in r.stdout
