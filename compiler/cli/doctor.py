"""`rkc doctor`: the rocket UAPI rkc encodes and the state of this machine's NPU
(the inspection itself is rkc.runtime.rocket.doctor)."""

from __future__ import annotations

import ctypes
import json

import click

from rkc.ir.errors import RkcError
from rkc.runtime.rocket import uapi
from rkc.runtime.rocket.doctor import build_report, uapi_lines


@click.command()
@click.option("--root", envvar="RKC_ROOT", default="/", show_default=True,
              type=click.Path(exists=True, file_okay=False),
              help="Read /dev, /sys and debugfs below this directory (env RKC_ROOT; for fake trees).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(root: str, as_json: bool) -> None:
    """Report the rocket UAPI rkc uses and the state of this machine's NPU.

    Exits 1 with a one-line reason when there is no usable NPU.
    """
    r = build_report(root)
    if as_json:
        click.echo(json.dumps({
            "uapi": [{"name": e.name, "request": f"{e.request:#010x}", "size": ctypes.sizeof(e.struct),
                      "uapi_size": e.uapi_size} for e in uapi.ABI],
            "board": r.facts.as_dict(), "device": r.device,
            "checks": [{"level": l, "topic": t, "message": m} for l, t, m in r.checks],
            "soc_checks": [{"level": l, "topic": t, "message": m} for l, t, m in r.soc_checks],
            "verdict": r.verdict, "soc_verdict": r.soc_verdict}, indent=2))
    else:
        click.echo("rocket UAPI as rkc encodes it (LP64):")
        for line in uapi_lines():
            click.echo(line)
        click.echo(f"\nthis machine (root {root}):")
        for level, topic, message in r.checks:
            click.echo(f"  [{level:4}] {topic:15} {message}")
        click.echo(f"verdict: {r.verdict}")
        click.echo("\nmemory controller and CPU clocks (they bound decode speed, NPU or not):")
        for level, topic, message in r.soc_checks:
            click.echo(f"  [{level:4}] {topic:15} {message}")
        click.echo(f"verdict: {r.soc_verdict}")
    if r.no_npu:
        raise RkcError(f"no NPU: {r.no_npu}")
