"""`rkc compile MODEL -o OUT.rkbin`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from rkc.compiler.build import PRECISIONS, BuildOptions, build
from rkc.compiler.frontend import detect_kind
from rkc.compiler.frontend.onnx import parse_input_shapes
from rkc.compiler.llm.quantize import DEFAULT_FP16_SHARE, DEFAULT_ROUNDING, METHODS
from rkc.compiler.llm.rotate import CHOICES as ROTATIONS, DEFAULT_ROTATION
from rkc.compiler.llm.smooth import DEFAULT_ALPHA


def _chunks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of sizes") from None


class _Progress:
    """Stage names on stderr as they start (only when stderr is a terminal, or
    always with --verbose), with the elapsed time of the previous stage."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()

    def __call__(self, stage: str) -> None:
        if self.enabled:
            click.echo(f"  [{time.perf_counter() - self.start:6.1f} s] {stage}", err=True)


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Output .rkbin (default: MODEL with .rkbin).")
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp16", show_default=True,
              help="NPU number format: fp16 (no calibration) or int8 (per-channel weights, per-tensor activations).")
@click.option("--calib", type=click.Path(dir_okay=False),
              help="int8 calibration set: .npz with one array per input, leading axis over samples.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix the dynamic dimensions of an input (repeatable).")
@click.option("--explain", is_flag=True, help="List every op, where it runs and why.")
@click.option("--cpu-only", is_flag=True, help="Place every op on the CPU (for debugging and references).")
@click.option("-v", "--verbose", is_flag=True, help="Show every stage as it starts.")
@click.option("--prefill-chunks", default="1,32,128,512", show_default=True,
              help="GGUF LLM: prompt chunk sizes, each with a precompiled prefill program.")
@click.option("--smooth-alpha", default=DEFAULT_ALPHA, show_default=True,
              help="GGUF LLM, int8: SmoothQuant migration strength (0 disables).")
@click.option("--keep-fp16", default="", metavar="NAMES",
              help="GGUF LLM, int8: comma-separated weight names (substrings, e.g. ffn_down) whose products "
                   "stay fp16 (a hybrid).")
@click.option("--int8-rounding", type=click.Choice(METHODS), default=DEFAULT_ROUNDING, show_default=True,
              help="GGUF LLM, int8: weight rounding (gptq: error-compensating, on the calibration text).")
@click.option("--fp16-share", type=click.FloatRange(0, 1), default=DEFAULT_FP16_SHARE, show_default=True,
              help="GGUF LLM, int8: this share of the product groups stays fp16, those noisiest in int8 on the "
                   "calibration text (a measured hybrid; 0: all int8).")
@click.option("--int8-rotation", type=click.Choice(ROTATIONS), default=DEFAULT_ROTATION, show_default=True,
              help="GGUF LLM, int8: randomised Hadamard rotation of each product's input before int8 (kron: "
                   "one transform per row; block: block-diagonal; none).")
def compile_command(model: str, output: str | None, precision: str, calib: str | None, input_shapes: tuple[str, ...],
                    explain: bool, cpu_only: bool, verbose: bool, prefill_chunks: str, smooth_alpha: float,
                    keep_fp16: str, int8_rounding: str, fp16_share: float, int8_rotation: str) -> None:
    """Compile MODEL (ONNX, GGUF LLM or IR text) into an .rkbin for the NPU.

    \b
    rkc compile model.onnx -o model.rkbin
    rkc compile model.gguf -o model.rkbin --precision int8
    rkc compile model.onnx --input-shape x=1x3x224x224 --precision int8 --calib calib.npz
    rkc compile model.onnx --explain
    """
    out = Path(output) if output else Path(model).with_suffix(".rkbin")
    if Path(model).is_file() and detect_kind(Path(model)) == "gguf":
        from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

        keep = tuple(k.strip() for k in keep_fp16.split(",") if k.strip())
        llm = LlmCompileOptions(precision, _chunks(prefill_chunks), smooth_alpha, keep, int8_rounding,
                                fp16_share=fp16_share, rotation=int8_rotation)
        for line in compile_gguf(model, out, llm).lines:
            click.echo(line)
        return
    options = BuildOptions(precision=precision, input_shapes=parse_input_shapes(input_shapes), calib=calib,
                           cpu_only=cpu_only)
    report = build(model, out, options, _Progress(verbose or sys.stderr.isatty()))
    for line in report.summary():
        click.echo(line)
    if explain:
        click.echo("ops (device, op, reason):")
        for p in report.placements:
            click.echo(f"  {p.device:3s}  {p.op.describe():50s}  {p.reason}")
