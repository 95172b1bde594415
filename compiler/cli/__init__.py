"""`rkc`: the compiler's command line. Each subcommand lives in its own module
and is registered in COMMANDS (an import and a line here)."""

from __future__ import annotations

import click

from rkc.compiler.cli.compile import compile_command
from rkc.compiler.cli.disasm import disasm
from rkc.compiler.cli.doctor import doctor
from rkc.compiler.cli.golden import golden
from rkc.compiler.cli.inspect_cmd import inspect_command
from rkc.compiler.cli.ir_cmd import ir_command
from rkc.compiler.cli.ops_cmd import ops_command
from rkc.compiler.cli.probe import probe
from rkc.ir.cli_support import ErrorReportingGroup, debug_option

# subcommand name -> click command
COMMANDS: dict[str, click.Command] = {
    "compile": compile_command,
    "disasm": disasm,
    "doctor": doctor,
    "golden": golden,
    "inspect": inspect_command,
    "ir": ir_command,
    "ops": ops_command,
    "probe": probe,
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


for _name, _command in COMMANDS.items():
    main.add_command(_command, _name)
