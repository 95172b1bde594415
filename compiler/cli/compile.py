"""`rkc compile MODEL -o OUT.rkbin`: compile a model for the NPU."""

from __future__ import annotations

import click

from compiler.frontend import detect_kind
from ir.errors import UnsupportedError


def _chunks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of sizes") from None


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The .rkbin to write.")
@click.option("--precision", type=click.Choice(["int8", "fp16"]), default="int8", show_default=True,
              help="int8: W8A8 (per-channel int8 weights, per-token int8 activations); fp16.")
@click.option("--prefill-chunks", default="1,32,128,512", show_default=True,
              help="LLM: prompt chunk sizes with a precompiled prefill program each.")
@click.option("--smooth-alpha", default=0.5, show_default=True,
              help="int8: SmoothQuant migration strength (0 disables).")
def compile_command(model: str, output: str, precision: str, prefill_chunks: str, smooth_alpha: float) -> None:
    """Compile MODEL (GGUF LLM) into an .rkbin for rkrun."""
    from pathlib import Path

    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", model)
    kind = detect_kind(path)
    if kind != "gguf":
        raise UnsupportedError(f"{model}: compiling {kind} models is not supported by this build of rkc")
    from compiler.llm.build import LlmCompileOptions, compile_gguf

    report = compile_gguf(path, output, LlmCompileOptions(precision, _chunks(prefill_chunks), smooth_alpha))
    for line in report.lines:
        click.echo(line, err=True)
