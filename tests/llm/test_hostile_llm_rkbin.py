"""LLM rkbins as untrusted input: every LLM CPU step's inputs and attributes are
checked at load against runtime/llm/kernel_attrs.py, so a crafted or broken
attribute is one FormatError line before any BO exists, never a numpy error
(exit 70) in the middle of a generation."""

from __future__ import annotations

import math

import pytest

from hostile import assert_refused
from rkc import runtime
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.kernel_attrs import KERNEL_ATTRS
from rkc.runtime.llm.kernels import KERNELS


@pytest.fixture(scope="module")
def files(synth_rkbin):
    return {"gemma3": synth_rkbin("gemma3", "int8"), "llama": synth_rkbin("llama", "int8")}


def _first_step(module: dict, op: str) -> dict:
    return next(s for p in module["programs"] for s in p["steps"] if s.get("op") == op)


def _set(op, attr, value):
    def change(m, b):
        _first_step(m, op)["attrs"][attr] = value
    return change


def _drop(op, attr):
    def change(m, b):
        del _first_step(m, op)["attrs"][attr]
    return change


def _inputs(op, keep):
    def change(m, b):
        step = _first_step(m, op)
        step["inputs"] = step["inputs"][:keep]
    return change


def _input(op, index, value):
    def change(m, b):
        _first_step(m, op)["inputs"][index] = value
    return change


def _tensor_shape(op, which, index, shape):
    """The declared shape of the first `op` step's `which` ("inputs"/"outputs") number `index`."""
    def change(m, b):
        name = _first_step(m, op)[which][index]
        next(t for t in m["tensors"] if t["name"] == name)["shape"] = shape
    return change


def _metadata(key, value):
    def change(m, b):
        if value is None:
            del m["metadata"][key]
        else:
            m["metadata"][key] = value
    return change


def _config(key, value):
    def change(m, b):
        m["metadata"]["llm"][key] = value
    return change


# case -> (file, change, message)
CASES = {
    "RMSNorm epsilon a string": ("gemma3", _set("RMSNorm", "epsilon", "x"),
                                 r"RMSNorm attribute epsilon='x': not a finite number >= 0"),
    "RMSNorm epsilon NaN": ("gemma3", _set("RMSNorm", "epsilon", math.nan), r"epsilon=nan: not a finite number"),
    "RMSNorm epsilon missing": ("gemma3", _drop("RMSNorm", "epsilon"), r"RMSNorm needs attribute 'epsilon'"),
    "RoPE odd dims": ("gemma3", _set("RoPE", "dims", 3), r"RoPE attribute dims=3: not an even int"),
    "RoPE mode": ("gemma3", _set("RoPE", "mode", "sideways"), r"RoPE attribute mode='sideways'"),
    "RoPE base 0": ("gemma3", _set("RoPE", "base", 0), r"RoPE attribute base=0: not a finite number > 0"),
    "Attention layer -1": ("gemma3", _set("Attention", "layer", -1), r"Attention attribute layer=-1"),
    "Attention window a list": ("gemma3", _set("Attention", "window", [1]), r"Attention attribute window=\[1\]"),
    "Attention three inputs": ("gemma3", _inputs("Attention", 3), r"Attention takes 4 inputs, not 3"),
    "Reshape two -1": ("gemma3", _set("Reshape", "shape", [-1, -1, 4]), r"Reshape attribute shape="),
    "Scale factor inf": ("gemma3", _set("Scale", "factor", math.inf), r"Scale attribute factor=inf"),
    "GatherPacked dtype": ("gemma3", _set("GatherPacked", "dtype", "float64"), r"GatherPacked attribute dtype="),
    "GatherPacked rows 0": ("gemma3", _set("GatherPacked", "rows", 0), r"GatherPacked attribute rows=0"),
    "GatherPacked unknown tensor": ("gemma3", _set("GatherPacked", "packed", "nope"),
                                    r"GatherPacked reads packed weights 'nope', which is no tensor"),
    "QuantizeRows rotation": ("gemma3", _set("QuantizeRows", "rotation", "givens"),
                              r"QuantizeRows attribute rotation='givens': not 'hadamard'"),
    "QuantizeRows rotation without block": ("gemma3", _drop("QuantizeRows", "block"),
                                            r"QuantizeRows with a rotation needs its block size"),
    "DequantizeRows partials 5": ("gemma3", _set("DequantizeRows", "partials", 5),
                                  r"DequantizeRows takes 7\.\.8 inputs"),
    "GatherRows one input": ("llama", _inputs("GatherRows", 1), r"GatherRows takes 2\.\.5 inputs, not 1"),
    "an attribute no kernel reads": ("llama", _set("SiLU", "alpha", 1.0), r"SiLU has no attribute 'alpha'"),
    # found by the LLM rkbin fuzzer (tests/test_fuzz_loaders.py), each an internal error before
    "Reshape to no rows": ("llama", _set("Reshape", "shape", [0, 2, 16]),
                           r"Reshape inputs of shapes \[1, 64\]: 64 elements do not reshape to \[0, 2, 16\]"),
    "RMSNorm input absent": ("llama", _input("RMSNorm", 0, ""), r"RMSNorm has an absent input"),
    "Attention q of rank 2": ("llama", _tensor_shape("Attention", "inputs", 0, [1, 64]),
                              r"(RoPE of inputs shaped|attention takes q, k, v as \[T, heads, dim\])"),
    "QuantizeRows output rows disagree": ("llama", _tensor_shape("QuantizeRows", "outputs", 0, [2, 64]),
                                          r"QuantizeRows of inputs shaped \[1, 64\].* makes \[1, 64\], but output"),
    "metadata without the LLM description": ("llama", _metadata("llm", None),
                                             r"metadata \"llm\": expected an object, got NoneType"),
    "n_layer 2.5": ("llama", _config("n_layer", 2.5), r"metadata \"llm\"\.n_layer: expected an integer"),
    "rms_eps NaN": ("llama", _config("rms_eps", math.nan), r"rms_eps: expected a finite number"),
    "swa_layers too short": ("gemma3", _config("swa_layers", [1]), r"swa_layers names 1 layers, not n_layer"),
    "Attention layer past the model": ("llama", _set("Attention", "layer", 99),
                                       r"Attention layer 99 of a \d+-layer model"),
    # campaign seed 8: a rotated QuantizeRows without its signs, or with another tensor as them
    "QuantizeRows rotation without signs": ("llama", _inputs("QuantizeRows", 1),
                                            r"QuantizeRows with a rotation takes its signs"),
    "QuantizeRows signs are its input": ("llama", lambda m, b: _input("QuantizeRows", 1,
                                                                      _first_step(m, "QuantizeRows")["inputs"][0])(m, b),
                                         r"rotation signs of shape \[1, \d+\] for \d+ columns"),
    # found by the LLM rkbin fuzzer in CI: a RoPE read its own input as the positions (a numpy error before)
    "RoPE positions are its input": ("llama", lambda m, b: _first_step(m, "RoPE")["inputs"].insert(
        1, _first_step(m, "RoPE")["inputs"][0]), r"RoPE takes x as \[T, heads, dim >= \d+\] and positions as \[T\]"),
    # tools/hostile_outcomes.py's fuzzed LLM module 7: steps dropped, a QuantizeRows read a tensor never written
    "a step's producer dropped": ("llama", lambda m, b: m["programs"][0]["steps"].remove(_first_step(m, "RMSNorm")),
                                  r"step '[^']+' reads '[^']+' before any step writes it"),
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_llm_step_is_refused_at_load(files, tmp_path, case):
    name, change, message = CASES[case]

    def load(path):
        LlmEngine(path, device="sim").close()
    print(f"{case}: {assert_refused(files[name], tmp_path / 'bad.rkbin', change, message, load)}")


def test_every_llm_kernel_has_its_rules():
    assert set(KERNEL_ATTRS) == set(KERNELS)


def test_compiled_llm_files_pass_the_checks(files):
    for path in files.values():
        with runtime.load(path, device="sim"):
            pass
