"""User errors end in one line on stderr and a non-zero exit, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*args, cwd=None):
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("args", [
    ("rkc", "disasm", "/no/such/file"),
    ("rkc", "ir", "/no/such/file"),
    ("rkrun", "/no/such/model.rkbin"),
])
def test_missing_file(args):
    r = run(*args)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_bad_formats_give_one_line(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    (tmp_path / "bad.ir").write_text('graph "g" { input %x fp32[1] }')
    (tmp_path / "bad.rkbin").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    for args in (("rkc", "disasm", "odd.bin"), ("rkc", "ir", "bad.ir"), ("rkc", "disasm", "bad.rkbin")):
        r = run(*args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_debug_shows_the_traceback(tmp_path):
    (tmp_path / "bad.ir").write_text("graph {")
    r = run("rkc", "--debug", "ir", str(tmp_path / "bad.ir"))
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_help_texts():
    for prog in ("rkc", "rkrun"):
        r = run(prog, "--help")
        assert r.returncode == 0 and "Usage:" in r.stdout


def test_rkrun_device_and_cores_reach_the_device(tmp_path):
    """--device rocket on a machine without an NPU is one clear line, not a silent
    fallback; --cores is accepted by every model kind."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4), np.float32))
    assert run("rkc", "compile", "m.onnx", "-o", "m.rkbin", cwd=tmp_path).returncode == 0
    r = run("rkrun", "m.rkbin", "--inputs", "in.npz", "--device", "rocket", "--cores", "2", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "rocket" in r.stderr, r.stderr
    r = run("rkrun", "m.rkbin", "--inputs", "in.npz", "--device", "sim", "--cores", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
