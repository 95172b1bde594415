"""`rkc ir FILE`: print FILE in rkc's IR text form."""

from __future__ import annotations

import click

from rkc.compiler.frontend import load_graph
from rkc.ir.text import print_graph


@click.command()
@click.argument("path", type=click.Path(dir_okay=False))
def ir_command(path: str) -> None:
    """Print FILE (IR text, ONNX or GGUF) as verified IR text.

    Printing is a fixed point: `rkc ir model.onnx > a.txt; rkc ir a.txt` prints
    the same text again. Constant payloads are referenced by name, not inlined.
    """
    click.echo(print_graph(load_graph(path)), nl=False)
