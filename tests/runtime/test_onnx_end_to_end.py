"""Compile ONNX models, run the rkbin (Python API and rkrun), compare with onnxruntime."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.ir.rkbin import read_rkbin
from onnx_models import cosine, example, onnxruntime_outputs, save, single_op

BIN = Path(sys.executable).parent


def run(*args, cwd=None):
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("module,shape", [("small_cnn", (1, 3, 32, 32)), ("mlp", (4, 64))])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_examples_match_onnxruntime(tmp_path, module, shape, precision):
    path = save(example(module).build_model(), tmp_path / "m.onnx")
    rng = np.random.default_rng(7)
    calib = None
    if precision == "int8":
        calib = tmp_path / "calib.npz"
        np.savez(calib, x=rng.standard_normal((4, *shape)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision=precision, calib=calib))
    x = rng.standard_normal(shape).astype(np.float32)
    want = onnxruntime_outputs(path, {"x": x})
    with runtime.load(tmp_path / "m.rkbin") as model:
        got = model.run({"x": x})
    for name, ref in want.items():
        c = cosine(got[name], ref)
        assert c >= (0.999 if precision == "fp16" else 0.99), (name, c)
    assert report.ops_npu + report.ops_cpu == len(report.placements)


def test_rkrun_reads_and_writes_npz(tmp_path):
    path = save(example("small_cnn").build_model(), tmp_path / "cnn.onnx")
    r = run("rkc", "compile", str(path), "-o", str(tmp_path / "cnn.rkbin"))
    assert r.returncode == 0, r.stderr
    assert "ops:" in r.stdout and "file:" in r.stdout
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = run("rkrun", str(tmp_path / "cnn.rkbin"), "--inputs", str(tmp_path / "in.npz"), "--outputs",
            str(tmp_path / "out.npz"), "--device", "auto")
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npz")["probs"]
    np.testing.assert_allclose(got, onnxruntime_outputs(path, {"x": x})["probs"], rtol=1e-2, atol=1e-3)  # fp16


def test_rkrun_input_errors_are_one_line(tmp_path):
    path = save(example("small_cnn").build_model(), tmp_path / "cnn.onnx")
    build(path, tmp_path / "cnn.rkbin", BuildOptions())
    np.savez(tmp_path / "wrong_name.npz", y=np.zeros((1, 3, 32, 32), np.float32))
    np.savez(tmp_path / "wrong_shape.npz", x=np.zeros((1, 3, 16, 16), np.float32))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for inputs, words in (("wrong_name.npz", "unknown input"), ("wrong_shape.npz", "shape"),
                          ("junk.npz", "npz"), ("missing.npz", "No such file")):
        r = run("rkrun", str(tmp_path / "cnn.rkbin"), "--inputs", str(tmp_path / inputs))
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_compile_writes_atomically_and_reports(tmp_path):
    path = save(single_op("Relu", {"x": np.zeros((1, 4), np.float32)}, out_shape=[1, 4]), tmp_path / "relu.onnx")
    r = run("rkc", "compile", str(path), "--explain")
    assert r.returncode == 0, r.stderr
    assert "Relu" in r.stdout and ("cpu" in r.stdout or "npu" in r.stdout)
    assert (tmp_path / "relu.rkbin").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_int8_needs_calibration(tmp_path):
    path = save(example("mlp").build_model(), tmp_path / "mlp.onnx")
    r = run("rkc", "compile", str(path), "--precision", "int8")
    assert r.returncode == 1 and "--calib" in r.stderr and not (tmp_path / "mlp.rkbin").exists()
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 64), np.float32))  # no sample axis
    r = run("rkc", "compile", str(path), "--precision", "int8", "--calib", str(tmp_path / "bad.npz"))
    assert r.returncode == 1 and "samples" in r.stderr, r.stderr


def test_inspect_summary_dot_and_csv(tmp_path):
    path = save(example("small_cnn").build_model(), tmp_path / "cnn.onnx")
    build(path, tmp_path / "cnn.rkbin", BuildOptions())
    r = run("rkc", "inspect", str(tmp_path / "cnn.rkbin"), "--dot", str(tmp_path / "g.dot"), "--csv",
            str(tmp_path / "l.csv"))
    assert r.returncode == 0, r.stderr
    for word in ("segments:", "ops:", "tasks:", "weights:", "modelled NPU time"):
        assert word in r.stdout
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith("digraph") and "Softmax" in dot and "->" in dot
    rows = (tmp_path / "l.csv").read_text().splitlines()
    assert rows[0].startswith("program,step,layer,op,device,macs,ddr_bytes,modelled_cycles")
    assert len(rows) - 1 == len([s for s in read_rkbin(tmp_path / "cnn.rkbin").module.programs[0].steps
                                 if s.kind == "cpu"]) + sum(
        len(s.stats.get("layers", [])) for s in read_rkbin(tmp_path / "cnn.rkbin").module.programs[0].steps
        if s.kind == "npu")


def test_python_api_checks_inputs(tmp_path):
    path = save(example("mlp").build_model(), tmp_path / "mlp.onnx")
    build(path, tmp_path / "mlp.rkbin", BuildOptions())
    from rkc.ir.errors import RkcError

    with runtime.load(tmp_path / "mlp.rkbin") as model:
        with pytest.raises(RkcError, match="missing input"):
            model.run({})
        with pytest.raises(RkcError, match="expects"):
            model.run({"x": np.zeros((4, 64), np.int64)})
        out = model.run({"x": np.zeros((4, 64), np.float64)})  # float64 narrows to the model's float32
        assert next(iter(out.values())).dtype == np.float32


def test_inspect_svg_or_a_clear_error(tmp_path):
    import shutil

    path = save(example("mlp").build_model(), tmp_path / "mlp.onnx")
    build(path, tmp_path / "mlp.rkbin", BuildOptions())
    r = run("rkc", "inspect", str(tmp_path / "mlp.rkbin"), "--svg", str(tmp_path / "g.svg"))
    if shutil.which("dot"):
        assert r.returncode == 0 and (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml"), r.stderr
    else:
        assert r.returncode == 1 and "graphviz" in r.stderr and r.stderr.count("\n") == 1


def test_npu_segments_run_on_the_simulator(tmp_path):
    """The quickstart model: convolutions with fused bias/ReLU/residual and a
    MatMul run as NPU segments on the simulator and match onnxruntime."""
    quick = example("quickstart")
    path = save(quick.tiny_model(), tmp_path / "tiny.onnx")
    report = build(path, tmp_path / "tiny.rkbin", BuildOptions())
    assert report.segments >= 1 and report.npu_tasks >= 1 and report.ops_npu >= 5
    x = np.random.default_rng(3).standard_normal((1, 8, 16, 16)).astype(np.float32)
    with runtime.load(tmp_path / "tiny.rkbin", "sim") as model:
        got = model.run({"x": x})["probs"]
        assert model.last_run.submits == report.segments
    np.testing.assert_allclose(got, onnxruntime_outputs(path, {"x": x})["probs"], rtol=1e-2, atol=1e-3)
