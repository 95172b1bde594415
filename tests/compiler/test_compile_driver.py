"""`rkc compile`'s one driver: every option applies where compiler/driver.OPTIONS
says and is refused elsewhere (one line, exit 1, nothing written); every option
given reaches its pipeline; the precision default per kind is the one table's."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from click.testing import CliRunner

from rkc.compiler import driver
from rkc.compiler.build import BuildOptions
from rkc.compiler.cli import main as rkc
from rkc.compiler.cli.compile import compile_command
from rkc.compiler.frontend import FRONTENDS
from rkc.compiler.llm.build import LlmCompileOptions
from rkc.compiler.precision import DEFAULT_PRECISION, KINDS, PRECISIONS
from rkc.ir.rkbin import read_rkbin
from llm.synth import write_model
from onnx_models import save, single_op

# a value to give each option on the command line, and what it becomes in the
# pipeline's options (field of BuildOptions / LlmCompileOptions, value)
SAMPLES = {
    "precision": (["--precision", "int8"], ("precision", "int8")),
    "calib": (["--calib", "c.npz"], ("calib", "c.npz")),
    "input_shapes": (["--input-shape", "x=1x4"], ("input_shapes", {"x": (1, 4)})),
    "image_inputs": (["--image-input", "x=1,2,3/4,5,6"], ("image_inputs", {"x": ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))})),
    "cores": (["--cores", "2"], ("cores", 2)),
    "jobs": (["--jobs", "2"], ("jobs", 2)),
    "explain": (["--explain"], None),  # a report option: checked on the output below
    "cpu_only": (["--cpu-only"], ("cpu_only", True)),
    "int8_only": (["--int8-only"], ("int8_only", True)),
    "kernel_ppu_irq": (["--kernel-ppu-irq"], ("ppu_irq", True)),
    "npu_attention": (["--npu-attention"], ("npu_attention", True)),
    "prefill_chunks": (["--prefill-chunks", "1,8"], ("prefill_chunks", (1, 8))),
    "smooth_alpha": (["--smooth-alpha", "0.25"], ("smooth_alpha", 0.25)),
    "keep_fp16": (["--keep-fp16", "ffn_down, attn_q"], ("keep_fp16", ("ffn_down", "attn_q"))),
    "prefill_fp16": (["--prefill-fp16", "none"], ("prefill_fp16", "none")),
    "int8_rounding": (["--int8-rounding", "rtn"], ("rounding", "rtn")),
    "fp16_share": (["--fp16-share", "0"], ("fp16_share", 0.0)),
    "int8_rotation": (["--int8-rotation", "block"], ("rotation", "block")),
    "int8_residual": (["--int8-residual", "head"], ("residual", "head")),
    "int4_group": (["--int4-group", "128"], ("int4_group", 128)),
    "int4_keep": (["--int4-keep", "ffn_down, attn_v"], ("int4_keep", ("ffn_down", "attn_v"))),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    onnx = save(single_op("Relu", {"x": np.zeros((1, 4), np.float32)}, out_shape=[1, 4]), d / "relu.onnx")
    ir = d / "relu.ir"
    ir.write_text(_ir_text(onnx))
    return {"onnx": onnx, "ir": ir, "gguf": write_model(d / "llama.gguf", "llama")}


def _ir_text(onnx_path) -> str:
    r = CliRunner().invoke(rkc, ["ir", str(onnx_path)])
    assert r.exit_code == 0, r.output
    return r.output


def test_the_tables_cover_every_kind():
    assert set(DEFAULT_PRECISION) == set(FRONTENDS) == set(driver.COMPILERS) == set(KINDS)
    assert set(DEFAULT_PRECISION.values()) <= set(PRECISIONS)
    assert set(SAMPLES) == set(driver.BY_NAME), "every option needs a sample here"
    for option in driver.OPTIONS:
        assert option.kinds and set(option.kinds) <= set(KINDS), option.name
        assert option.precisions and set(option.precisions) <= set(PRECISIONS), option.name


def test_the_pipelines_take_their_default_precision_from_the_table():
    assert BuildOptions().precision == DEFAULT_PRECISION["onnx"] == DEFAULT_PRECISION["ir"]
    assert LlmCompileOptions().precision == DEFAULT_PRECISION["gguf"]


def test_help_shows_where_each_option_applies_and_the_default_per_kind():
    r = CliRunner().invoke(rkc, ["compile", "--help"], terminal_width=200)
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for kind, precision in DEFAULT_PRECISION.items():
        assert f"{precision} for {driver.KIND_NAMES[kind]}" in text
    assert "GGUF LLM, int8: SmoothQuant" in text and "ONNX: fix the dynamic" in text


def _wrong_places():
    """(kind, option, precision) for every option outside the kinds or precisions it applies to."""
    for option in driver.OPTIONS:
        for kind in KINDS:
            for precision in PRECISIONS:
                if option.name != "precision" and (kind not in option.kinds or precision not in option.precisions):
                    yield kind, option.name, precision


@pytest.mark.parametrize("kind,name,precision", list(_wrong_places()))
def test_an_option_in_the_wrong_place_is_one_line_and_exit_1(tmp_path, models, kind, name, precision):
    out = tmp_path / "out.rkbin"
    argv, _ = SAMPLES[name]
    r = CliRunner().invoke(rkc, ["compile", str(models[kind]), "-o", str(out), "--precision", precision, *argv])
    assert r.exit_code == 1, r.output
    assert r.output.count("\n") == 1 and driver.BY_NAME[name].flag in r.output, r.output
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.fixture
def captured(monkeypatch):
    """The pipelines' options, with the pipelines themselves not run."""
    seen = {}

    def fake_build(source, output, options, progress):
        seen["options"] = options
        raise _Stop

    def fake_gguf(source, output, options, progress):
        seen["options"] = options
        raise _Stop

    monkeypatch.setattr(driver, "build", fake_build)
    monkeypatch.setattr(driver, "compile_gguf", fake_gguf)
    return seen


class _Stop(Exception):
    pass


def _right_places():
    for option in driver.OPTIONS:
        if SAMPLES[option.name][1] is not None:
            for kind in option.kinds:
                yield kind, option.name, option.precisions[-1]


@pytest.mark.parametrize("kind,name,precision", list(_right_places()))
def test_every_option_given_reaches_its_pipeline(models, captured, kind, name, precision):
    argv, (field, want) = SAMPLES[name]
    r = CliRunner().invoke(compile_command, [str(models[kind]), "--precision", precision, *argv])
    assert isinstance(r.exception, _Stop), r.output
    options = captured["options"]
    assert field in {f.name for f in fields(options)}
    got = getattr(options, field)
    assert (dict(got) if isinstance(want, dict) else got) == want
    assert options.precision == precision


def test_the_precision_default_is_the_kinds(models, captured):
    for kind in KINDS:
        r = CliRunner().invoke(compile_command, [str(models[kind])])
        assert isinstance(r.exception, _Stop), r.output
        assert captured["options"].precision == DEFAULT_PRECISION[kind]


def test_explain_lists_every_op_for_onnx_and_ir(tmp_path, models):
    for kind in ("onnx", "ir"):
        r = CliRunner().invoke(rkc, ["compile", str(models[kind]), "-o", str(tmp_path / f"{kind}.rkbin"),
                                     "--explain"])
        assert r.exit_code == 0, r.output
        assert "ops (device, op, reason):" in r.output and "Relu -> y" in r.output


def test_verbose_shows_the_llm_stages(tmp_path, models):
    out = tmp_path / "m.rkbin"
    r = CliRunner().invoke(rkc, ["compile", str(models["gguf"]), "-o", str(out), "-v",
                                     "--precision", "fp16", "--prefill-chunks", "1,4"])
    assert r.exit_code == 0, r.output + r.stderr
    stages = [line.split("] ")[1] for line in r.stderr.splitlines() if "] " in line]
    assert stages == ["load", "dequantize", "quantize", "lower", "write"]
    meta = read_rkbin(out).module.metadata
    assert meta["precision"] == "fp16" and meta["prefill_chunks"] == [1, 4]
