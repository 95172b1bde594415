"""`rkrun`: run a compiled model."""

from __future__ import annotations

import click

from ir.cli_support import ErrorReportingCommand, debug_option
from ir.errors import RkcError


@click.command(cls=ErrorReportingCommand, context_settings={"help_option_names": ["-h", "--help"]})
@debug_option
@click.version_option(package_name="rkc")
@click.option("--replay", "replay_case", metavar="CASE.json", type=click.Path(dir_okay=False),
              help="Replay a captured regcmd case on the simulator and compare with its reference.")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--inputs", type=click.Path(dir_okay=False), help="Inputs (.npz keyed by the model's input names).")
@click.option("--outputs", type=click.Path(dir_okay=False), help="Write the outputs here (.npz keyed by name).")
@click.option("--device", type=click.Choice(["auto", "sim", "rocket"]), default="auto", show_default=True,
              help="rocket when an NPU is present, else the built-in simulator.")
def main(model: str | None, replay_case: str | None, inputs: str | None, outputs: str | None, device: str) -> None:
    """Run MODEL (an .rkbin made by `rkc compile`) on the NPU or its simulator.

    \b
    rkrun model.rkbin --inputs in.npz --outputs out.npz   # an ONNX model
    rkrun model.rkbin -p "Hello" -n 64                    # an LLM: generate text
    rkrun --replay CASE.json                              # replay a captured regcmd case
    """
    if replay_case is not None:
        from runtime.replay import run_cli

        raise SystemExit(run_cli(replay_case))
    if model is None:
        raise RkcError("no model given (see rkrun --help)")
    from runtime.run_cli import run_once

    run_once(model, inputs, outputs, device)
