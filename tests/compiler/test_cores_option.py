"""`rkc compile --cores N` for an ONNX model: every NPU task on lanes 0..N-1,
the numbers unchanged against onnxruntime, and a one-core program modelled
with nothing overlapping (the LLM's: tests/llm/test_cores.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnx_models import cosine, example, onnxruntime_outputs, save
from perf_agreement import assert_serial, lanes
from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.compiler.driver import compile_model
from rkc.ir.errors import OptionError
from rkc.ir.rkbin import read_rkbin

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_onnx_model_on_fewer_cores_matches_onnxruntime(tmp_path, precision):
    path = save(example("small_cnn").build_model(), tmp_path / "m.onnx")
    rng = np.random.default_rng(7)
    calib = None
    if precision == "int8":
        calib = tmp_path / "calib.npz"
        np.savez(calib, x=rng.standard_normal((4, 1, 3, 32, 32)).astype(np.float32))
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = onnxruntime_outputs(path, {"x": x})
    for cores in (1, 2, 3):
        out = tmp_path / f"m{cores}.rkbin"
        build(path, out, BuildOptions(precision=precision, calib=calib, cores=cores))
        used = lanes(out)
        assert used and max(used) < cores, (cores, used)
        if cores == 3:
            assert len(used) > 1, "the 3-core program spreads its tasks"
        with runtime.load(out) as model:
            got = model.run({"x": x})
        for name, ref in want.items():
            assert cosine(got[name], ref) >= (0.999 if precision == "fp16" else 0.99), (cores, name)
        if cores == 1:
            assert_serial(out)


def test_cores_option_is_checked(tmp_path):
    path = save(example("mlp").build_model(), tmp_path / "mlp.onnx")
    r = subprocess.run([str(BIN / "rkc"), "compile", str(path), "--cores", "4"], capture_output=True, text=True)
    assert r.returncode == 2 and "--cores" in r.stderr and not (tmp_path / "mlp.rkbin").exists()
    with pytest.raises(OptionError, match="--cores"):
        build(path, tmp_path / "mlp.rkbin", BuildOptions(cores=0))
    compile_model(path, tmp_path / "one.rkbin", {"cores": "1"})
    assert lanes(tmp_path / "one.rkbin") == {0}
    assert read_rkbin(tmp_path / "one.rkbin").module.metadata["cores"] == 1
