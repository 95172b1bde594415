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
def main(model: str | None, replay_case: str | None) -> None:
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
    raise RkcError(f"{model}: running models arrives with the runtime (issue 5)")
