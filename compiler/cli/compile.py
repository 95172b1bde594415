"""`rkc compile MODEL -o OUT.rkbin`: the options of compiler/driver.OPTIONS as
click options, and the driver's one entry point."""

from __future__ import annotations

import sys
import time

import click

from rkc.compiler.driver import OPTIONS, Option, compile_model


class _Progress:
    """Stage names on stderr as they start (only when stderr is a terminal, or
    always with --verbose), with the elapsed time of the previous stage."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()

    def __call__(self, stage: str) -> None:
        if self.enabled:
            click.echo(f"  [{time.perf_counter() - self.start:6.1f} s] {stage}", err=True)


def _click_type(value: object):
    if value == "path":
        return click.Path(dir_okay=False)
    if value is float:
        return float
    if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
        return click.FloatRange(*value)
    if isinstance(value, tuple):
        return click.Choice(value)
    return str


def _click_option(option: Option):
    """The click option of one driver option: no click default, so the driver
    sees only what was given (and applies each kind's default itself)."""
    where = option.where()
    text = f"{where}: {option.help}" if where else option.help
    if option.default:
        text += f"  [default: {option.default}]"
    if option.value == "flag":
        return click.option(option.flag, option.name, is_flag=True, default=None, help=text)
    return click.option(option.flag, option.name, type=_click_type(option.value), default=None,
                        multiple=option.repeat, metavar=option.metavar, help=text)


def _driver_options(f):
    for option in reversed(OPTIONS):
        f = _click_option(option)(f)
    return f


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Output .rkbin (default: MODEL with .rkbin).")
@_driver_options
@click.option("-v", "--verbose", is_flag=True, help="Show every stage as it starts.")
def compile_command(model: str, output: str | None, verbose: bool, **options) -> None:
    """Compile MODEL (ONNX, GGUF LLM or IR text) into an .rkbin for the NPU.

    An option meant for another kind of model (or precision) is an error.

    \b
    rkc compile model.onnx -o model.rkbin
    rkc compile model.gguf -o model.rkbin --precision fp16
    rkc compile model.onnx --input-shape x=1x3x224x224 --precision int8 --calib calib.npz
    rkc compile model.onnx --explain
    """
    # not given: None (no click default), False (a flag), () (a repeatable option); never
    # compare with `in`: 0.0 == False
    given = {name: value for name, value in options.items() if value is not None and value is not False
             and value != ()}
    for line in compile_model(model, output, given, _Progress(verbose or sys.stderr.isatty())):
        click.echo(line)
