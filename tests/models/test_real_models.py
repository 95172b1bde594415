"""Real models end to end (slow): PP-OCR cls and det compile, run and match
onnxruntime (fp16 cosine >= 0.999 per output, int8 with a few calibration
inputs >= 0.99); every `light_*` topology shipped in the onnx wheel compiles."""

import numpy as np
import pytest

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from onnx_models import cosine, onnxruntime_outputs
from real_models import real_models

MODELS = {m.name: m for m in real_models()}
RUNNABLE = [n for n, m in MODELS.items() if m.runs]
COMPILE_ONLY = [n for n, m in MODELS.items() if not m.runs]
THRESHOLD = {"fp16": 0.999, "int8": 0.99}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("name", RUNNABLE)
def test_ppocr_matches_onnxruntime(tmp_path, name, precision):
    m = MODELS[name]
    options = BuildOptions(precision=precision, input_shapes={m.input_name: m.shape})
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        np.savez(options.calib, **{m.input_name: np.stack([m.inputs(100 + i) for i in range(4)])})
    build(m.path, tmp_path / "m.rkbin", options)
    x = m.inputs(0)
    want = onnxruntime_outputs(m.path, {m.input_name: x})
    with runtime.load(tmp_path / "m.rkbin") as model:
        got = model.run({m.input_name: x})
    for out, ref in want.items():
        assert cosine(got[out], ref) >= THRESHOLD[precision], (out, cosine(got[out], ref))


@pytest.mark.parametrize("name", COMPILE_ONLY)
def test_light_topologies_compile(tmp_path, name):
    report = build(MODELS[name].path, tmp_path / "m.rkbin", BuildOptions())
    assert report.size > 0 and report.ops_npu + report.ops_cpu > 0
