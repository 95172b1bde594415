"""`rkc inspect` states the modelled NPU time, tasks, kicks and DDR bytes the
simulator then reports for a run: both apply ir/npu/perf.py, the compiler to its
plan's per-task counters, the simulator to what it counted from the regcmd bytes.
With hardware chaining (as rkrun submits to the simulator) and with stock rocket."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.compiler.inspect import figures
from rkc.ir.rkbin import read_rkbin
from onnx_models import example, save
from perf_agreement import assert_plan_matches_simulator, assert_same_totals, recorded_submits

BIN = Path(sys.executable).parent
MODELS = {"quickstart": lambda: example("quickstart").tiny_model(),
          "small_cnn": lambda: example("small_cnn").build_model(),
          "mlp": lambda: example("mlp").build_model()}


def compiled(tmp_path, name: str, precision: str) -> tuple[Path, dict[str, np.ndarray]]:
    model = MODELS[name]()
    path = save(model, tmp_path / f"{name}.onnx")
    inp = model.graph.input[0]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(3)
    calib = None
    if precision == "int8":
        calib = tmp_path / "calib.npz"
        np.savez(calib, **{inp.name: rng.standard_normal((4, *shape)).astype(np.float32)})
    build(path, tmp_path / f"{name}.rkbin", BuildOptions(precision=precision, calib=calib))
    return tmp_path / f"{name}.rkbin", {inp.name: rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("name,precision", [("quickstart", "fp16"), ("small_cnn", "fp16"), ("small_cnn", "int8"),
                                            ("mlp", "int8")])
@pytest.mark.parametrize("chaining", [True, False], ids=["chained", "stock"])
def test_inspect_states_what_the_simulator_reports(tmp_path, name, precision, chaining):
    rkbin, feeds = compiled(tmp_path, name, precision)
    stated = figures(read_rkbin(rkbin).module)["programs"]["main"]
    with runtime.load(rkbin, device="sim") as model:
        dev = model.device
        dev.supports_chaining = chaining  # without it the runtime kicks every task (stock rocket)
        with recorded_submits(dev) as subs:
            model.run(feeds)
        assert_plan_matches_simulator(model.rkbin.module.programs[0].steps, subs, chaining)
        suffix = "" if chaining else "_stock"
        assert_same_totals(stated[f"modelled_npu_s{suffix}"], stated["tasks"], stated[f"kicks{suffix}"],
                           stated["ddr_bytes"], dev.counters)
    assert stated["segments"] > 0 and stated["modelled_npu_s"] > stated["kick_overhead_s"] > 0


def test_rkrun_and_inspect_say_the_same(tmp_path):
    rkbin, feeds = compiled(tmp_path, "quickstart", "fp16")
    np.savez(tmp_path / "in.npz", **feeds)
    shown = subprocess.run([str(BIN / "rkc"), "inspect", str(rkbin)], capture_output=True, text=True)
    stated = json.loads(subprocess.run([str(BIN / "rkc"), "inspect", str(rkbin), "--json"], capture_output=True,
                                       text=True, check=True).stdout)["programs"]["main"]
    ran = subprocess.run([str(BIN / "rkrun"), str(rkbin), "--inputs", str(tmp_path / "in.npz"), "--device", "sim"],
                         capture_output=True, text=True)
    assert shown.returncode == ran.returncode == 0, shown.stderr + ran.stderr
    line = (f"modelled NPU time {stated['modelled_npu_s'] * 1e3:.3f} ms at 1 GHz ({stated['tasks']} tasks, "
            f"{stated['kicks']} kicks with hardware chaining, {stated['ddr_bytes']:,} DDR bytes)")
    assert line in shown.stdout and line in ran.stderr, (line, shown.stdout, ran.stderr)
