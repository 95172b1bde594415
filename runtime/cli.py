"""`rkrun`: run a compiled model."""

from __future__ import annotations

import click

from ir.cli_support import ErrorReportingCommand, debug_option
from ir.errors import RkcError


@click.command(cls=ErrorReportingCommand, context_settings={"help_option_names": ["-h", "--help"]})
@debug_option
@click.version_option(package_name="rkc")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--inputs", type=click.Path(dir_okay=False), help="Inputs (.npz keyed by the model's input names).")
@click.option("--outputs", type=click.Path(dir_okay=False), help="Write the outputs here (.npz keyed by name).")
@click.option("--device", type=click.Choice(["auto", "sim", "rocket"]), default="auto", show_default=True,
              help="rocket when an NPU is present, else the built-in simulator.")
def main(model: str | None, inputs: str | None, outputs: str | None, device: str) -> None:
    """Run MODEL (an .rkbin made by `rkc compile`) on the NPU or its simulator.

    \b
    rkrun model.rkbin --inputs in.npz --outputs out.npz   # an ONNX model
    rkrun model.rkbin -p "Hello" -n 64                    # an LLM: generate text
    rkrun --replay CASE.json                              # replay a captured regcmd case
    """
    if model is None:
        raise RkcError("no model given (see rkrun --help)")
    from runtime.run_cli import run_once

    run_once(model, inputs, outputs, device)
