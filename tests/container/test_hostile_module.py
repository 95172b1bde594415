"""Malformed fields of an rkbin's module JSON: each is one FormatError line at
load time (the CLIs' bad-input exit 1), never an internal error (exit 70)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hostile import assert_refused, compiled_small_cnn, mutated, parts, write_raw
from rkc import runtime
from rkc.ir.errors import FormatError

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return compiled_small_cnn(tmp_path_factory.mktemp("good"))


def _set(path, value):
    """change(module, blobs) setting module[path...] = value."""
    def change(m, b):
        node = m
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _tensor(name, key, value):
    def change(m, b):
        next(t for t in m["tensors"] if t["name"] == name)[key] = value
    return change


def _cpu_step(op, key, value):
    def change(m, b):
        step = next(s for s in m["programs"][0]["steps"] if s["kind"] == "cpu" and s["op"] == op)
        step["attrs"][key] = value
    return change


MODULE_CASES = {
    "relocation offset string": (_set(["relocations", 0, "offset"], "16"), r"relocations\[0\]\.offset: expected an integer"),
    "relocation offset float": (_set(["relocations", 0, "offset"], 58.5), r"offset: expected an integer, got 58\.5"),
    "region size string": (_set(["regions", 0, "size"], "32768"), r"regions\[0\] 'weights'\.size: expected an integer"),
    "region name list": (_set(["regions", 0, "name"], ["w"]), r"regions\[0\]\.name: expected a string"),
    "nbytes not shape x dtype": (_tensor("npu0.weights", "nbytes", 2305),
                                 r"tensor 'npu0.weights' declares 2305 bytes, but \[2304\] x uint8 is 2304"),
    "native nbytes too small": (_tensor("x@npu", "nbytes", 100), r"tensor 'x@npu' declares 100 bytes"),
    "unknown dtype": (_tensor("x", "dtype", "fp128"), r"tensor 'x' has unknown dtype 'fp128'"),
    "unknown layout": (_tensor("x@npu", "layout", "nhwc"), r"tensor 'x@npu' has unknown layout 'nhwc'"),
    "negative dimension": (_tensor("x", "shape", [1, -3, 32, 32]), r"tensor 'x' has shape \[1, -3, 32, 32\]"),
    "scratch region of kind host": (_set(["regions", 2, "kind"], "host"),
                                    r"relocation \d+ targets host region 'scratch'"),
    "unknown region kind": (_set(["regions", 2, "kind"], "gpu"), r"region 'scratch' has unknown kind 'gpu'"),
    "Softmax axis 99": (_cpu_step("Softmax", "axis", 99), r"Softmax attribute axis=99: not an axis of a rank-2 input"),
    "Cast to object": (_cpu_step("Cast", "to", "object"), r"Cast attribute to='object': not a dtype"),
    "Cast to an object": (_cpu_step("Cast", "to", {"name": 1}), r"Cast attribute to=\{'name': 1\}: not a dtype"),
    "unknown CPU kernel": (_set(["programs", 0, "steps", 0, "op"], "Exec"), r"no CPU kernel for op 'Exec'"),
    "unknown attribute": (_cpu_step("Flatten", "shell", 1), r"the CPU kernel does not support this form"),
    "no programs": (_set(["programs"], []), r"the module has no programs"),
    "unknown field": (_set(["regions", 0, "mode"], 1), r"regions\[0\]: unknown field 'mode'"),
    "module not an object": (lambda m, b: [m], r"module: expected an object, got list"),
    "huge region": (_set(["regions", 2, "size"], (1 << 32) - 4096), r"more than the 4 GiB IOVA window"),
    # CI's slow fuzzer (tests/test_fuzz_loaders.py): a cube with no channels, accepted, then ValueError in to_layout
    "NPU tensor with a zero dimension": (_tensor("p1@npu", "shape", [1, 0, 16, 16]),
                                         r"tensor 'p1@npu' has shape \[1, 0, 16, 16\] in NPU layout 'native': the NPU "
                                         r"reads and writes no empty cube"),
    "Cast output disagrees with its input": (_tensor("logits.map", "shape", [1, 0, 1, 1]),
                                             r"step 'from_npu:logits.map': Cast of inputs shaped \[1, 10, 1, 1\] "
                                             r"makes \[1, 10, 1, 1\], but output 'logits.map' is declared "
                                             r"\[1, 0, 1, 1\]"),
    "Softmax output disagrees with its input": (_tensor("probs", "shape", [1, 11]),
                                                r"Softmax of inputs shaped \[1, 10\] makes \[1, 10\], but output "
                                                r"'probs' is declared \[1, 11\]"),
    "a step's producer dropped": (lambda m, b: m["programs"][0]["steps"].remove(
        next(s for s in m["programs"][0]["steps"] if s["outputs"] == ["logits.map"])),
                                  r"program 'main' step 'Flatten:logits' reads 'logits.map' before any step "
                                  r"writes it"),
    # campaign seed 9 (LLM rkbin): an NPU step named a host-side tensor as its output, nothing wrote it
    "NPU step lists a host-side tensor": (_set(["programs", 0, "steps", 1, "outputs"], ["r1"]),
                                          r"step 'segment 1' lists 'r1', which lives in no region the NPU could touch"),
    "two unused 2 GiB regions": (lambda m, b: m["regions"].extend(
        {"name": f"big{i}", "size": (2 << 30) - (1 << 24), "kind": "scratch"} for i in range(2)),
        r"region 'big0' \(2130706432 B\) is used by no tensor, relocation or task"),
}


@pytest.mark.parametrize("case", MODULE_CASES)
def test_malformed_module_field_is_one_clear_error(good, tmp_path, case):
    def load_and_run(path):
        with runtime.load(path, device="sim") as model:
            model.run({"x": np.ones((1, 3, 32, 32), np.float32)})

    change, message = MODULE_CASES[case]
    print(f"{case}: {assert_refused(good, tmp_path / 'bad.rkbin', change, message, load_and_run)}")


@pytest.mark.parametrize("version,message", [
    ("x", "of type string, not uint32"), ("1", "of type string, not uint32"),
    (1.0, "of type float32, not uint32"), (2, "format version 2"), (None, "version missing")])
def test_version_must_be_uint32_one(good, tmp_path, version, message):
    module, blobs = parts(good)
    bad = write_raw(tmp_path / "bad.rkbin", module, blobs, version=version)
    with pytest.raises(FormatError, match=message):
        runtime.load(bad, device="sim")


@pytest.mark.parametrize("checksums", ["null", "[]", '{"w": 5}', "[[[["])
def test_checksum_table_must_be_an_object_of_strings(good, tmp_path, checksums):
    module, blobs = parts(good)
    bad = write_raw(tmp_path / "bad.rkbin", module, blobs, checksums=checksums)
    with pytest.raises(FormatError, match="checksum table"):
        runtime.load(bad, device="sim")


@pytest.mark.parametrize("depth", [100, 200_000])
def test_deep_nesting(good, tmp_path, depth):
    module, blobs = parts(good)
    text = json.dumps(module).replace('"metadata": {', '"metadata": {"deep": ' + '{"x": ' * depth + "{}" + "}" * depth
                                      + ", ", 1)
    bad = write_raw(tmp_path / "bad.rkbin", module, blobs, module_text=text)
    with pytest.raises(FormatError, match="nested (too deeply|more than 64 levels deep)"):
        runtime.load(bad, device="sim")


def test_module_text_not_json(good, tmp_path):
    module, blobs = parts(good)
    bad = write_raw(tmp_path / "bad.rkbin", module, blobs, module_text="{" * 300_000)
    with pytest.raises(FormatError, match="program description"):
        runtime.load(bad, device="sim")


def test_rkrun_exits_1_with_one_line(good, tmp_path):
    """Through the CLI: the bad-input exit code, one line, no traceback."""
    bad = mutated(good, tmp_path / "bad.rkbin", _set(["relocations", 0, "offset"], "16"))
    np.savez(tmp_path / "in.npz", x=np.ones((1, 3, 32, 32), np.float32))
    r = subprocess.run([str(BIN / "rkrun"), str(bad), "--inputs", str(tmp_path / "in.npz"), "--device", "sim"],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
