"""`rkc`: the compiler's command line. Each subcommand lives in its own module
and is registered in COMMANDS, so adding one touches one line here."""

from __future__ import annotations

import importlib

import click

from rkc.ir.cli_support import ErrorReportingGroup, debug_option

# module name -> attribute holding the click command
COMMANDS = {
    "compile": "rkc.compiler.cli.compile:compile_command",
    "disasm": "rkc.compiler.cli.disasm:disasm",
    "doctor": "rkc.compiler.cli.doctor:doctor",
    "golden": "rkc.compiler.cli.golden:golden",
    "inspect": "rkc.compiler.cli.inspect_cmd:inspect_command",
    "ir": "rkc.compiler.cli.ir_cmd:ir_command",
    "ops": "rkc.compiler.cli.ops_cmd:ops_command",
    "probe": "rkc.compiler.cli.probe:probe",
}


@click.group(cls=ErrorReportingGroup, context_settings={"help_option_names": ["-h", "--help"]})
@debug_option
@click.version_option(package_name="rkc")
def main() -> None:
    """rkc: compile ONNX models and GGUF LLMs for the RK3588 NPU.

    \b
    rkc compile model.onnx -o model.rkbin   # lower, quantize, partition, tile, emit
    rkc inspect model.rkbin                 # segments, tasks, bytes, modelled time
    rkc disasm model.rkbin                  # every register write, decoded
    rkc ir model.onnx                       # the model in rkc's IR text form
    """


def _register() -> None:
    for name, target in COMMANDS.items():
        module, attr = target.split(":")
        main.add_command(getattr(importlib.import_module(module), attr), name)


_register()
