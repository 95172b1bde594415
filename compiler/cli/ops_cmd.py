"""`rkc ops`: the supported-op table, generated from the op specs."""

from __future__ import annotations

import click

from rkc.compiler.support_table import supported_ops_markdown


@click.command()
def ops_command() -> None:
    """Print every op rkc supports: NPU conditions (the reasons an op falls
    back to the CPU) and CPU availability. docs/supported-ops.md is this table."""
    click.echo(supported_ops_markdown(), nl=False)
