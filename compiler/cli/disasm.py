"""`rkc disasm FILE`: decode every regcmd entry of a raw dump, a golden case or an rkbin."""

from __future__ import annotations

import click

from rkc.ir.npu.disasm import disassemble
from rkc.ir.npu.sources import load_regcmd_streams


@click.command()
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--all-fields", is_flag=True, help="Print zero-valued fields too.")
def disasm(path: str, all_fields: bool) -> None:
    """Decode FILE into one line per regcmd entry.

    FILE is a raw regcmd dump (little-endian u64 entries), a captured golden case
    (.json) or a compiled .rkbin. Each line shows: entry index, raw entry, block,
    register, value and the non-zero bit fields. Entries the hardware would not
    understand are flagged with `!!`.
    """
    for title, entries in load_regcmd_streams(path):
        click.echo(f"# {title}: {len(entries)} entries")
        for line in disassemble(entries, all_fields=all_fields):
            click.echo(line)
