"""`rkc golden CASE.json...`: re-emit a captured Mesa case with rkc and compare."""

from __future__ import annotations

import sys

import click

from rkc.compiler.npu.golden import check_path


@click.command()
@click.argument("cases", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--all", "report_all", is_flag=True, help="List every difference, not just the first.")
def golden(cases: tuple[str, ...], report_all: bool) -> None:
    """Re-emit each captured Mesa case (../shared/golden/mesa-rocket/*.json) with
    rkc's Mesa-compatible mode and compare entry by entry (addresses through the
    relocations), plus the weight, bias and input-layout buffers.

    Prints one line per case; on a difference, the first differing entry with its
    block, register and field, expected vs got. Exit 0 only if every case matches.
    """
    failed = 0
    for path in cases:
        report = check_path(path, stop_at_first=not report_all)
        if report.ok:
            click.echo(f"{report.case}: match ({report.entries} entries, {report.buffers} buffers)")
            continue
        failed += 1
        if report.status == "skipped":
            click.echo(f"{report.case}: not checked ({report.note})")
            continue
        first, *rest = report.mismatches
        click.echo(f"{report.case}: MISMATCH at {first}")
        for m in rest:
            click.echo(f"  also {m}")
    if len(cases) > 1:
        click.echo(f"{len(cases) - failed}/{len(cases)} cases match")
    sys.exit(1 if failed else 0)
