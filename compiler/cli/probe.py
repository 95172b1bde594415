"""`rkc probe`: test the simulator's hardware assumptions on this board's NPU.

Runs every probe of compiler.probe.programs on the NPU and on the simulator,
compares the bytes and writes a JSON report a user can share. Without an NPU it
runs against the emulated kernel and says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from importlib.metadata import PackageNotFoundError, version

import click

from rkc.compiler.probe import dram, rate, run_probe
from rkc.compiler.probe.programs import PROBES
from rkc.ir.atomic import write_atomic
from rkc.ir.errors import RkcError
from rkc.runtime.devices import rocket_status
from rkc.runtime.rocket import RocketDevice, soc
from rkc.runtime.rocket.board import gather
from rkc.runtime.rocket.kernel import LinuxKernel
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.quirks import DEFAULT

EMULATED_NOTE = ("no NPU on this machine: the probes ran against the emulated rocket kernel (with the kernel/ "
                 "chained-submit patch) whose NPU is the simulator, so they check the probe programs and the "
                 "ioctl path, not the hardware")


def _quirks(hypothesis: dict):
    return dataclasses.replace(DEFAULT, **hypothesis)


def _rkc_version() -> str:
    try:
        return version("rkc")
    except PackageNotFoundError:
        return "unknown"


@click.command()
@click.option("-o", "--output", default="rkc-probe.json", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the JSON report.")
@click.option("--only", multiple=True, metavar="NAME", help="Run only these probes (repeatable).")
@click.option("--list", "list_only", is_flag=True, help="List the probes and exit.")
@click.option("--root", envvar="RKC_ROOT", default="/", show_default=True, type=click.Path(exists=True, file_okay=False),
              help="Read /dev and /sys below this directory (env RKC_ROOT).")
@click.option("--dram", "dram_flag", is_flag=True,
              help="Also measure memory bandwidth: CPU streaming copy and read with 1 and 4 threads, and on a board "
                   "an NPU task streaming weights (GB/s, into the report; rkc inspect --dram-gbps REPORT uses it).")
@click.option("--dram-mib", default=dram.DEFAULT_BUFFER_MIB, show_default=True, type=click.IntRange(8, 4096),
              help="Buffer size of the CPU streams (MiB; several times the last-level cache).")
@click.option("--gemm", "gemm_flag", is_flag=True,
              help="Also time rkc's int8 and fp16 GEMM 512x3840x4096 on 1 and 3 cores (on a board: GOP/s measured "
                   "beside the performance model's for the same program, the rate published int8 figures miss).")
def probe(output: str, only: tuple[str, ...], list_only: bool, root: str, dram_flag: bool, dram_mib: int,
          gemm_flag: bool) -> None:
    """Run small programs that each test one hardware assumption of the simulator.

    Each runs on the NPU and on the simulator; the outputs are compared byte
    for byte and the results written as JSON (share it!).
    """
    if list_only:
        for p in PROBES:
            click.echo(f"{p.name:13} {p.question or '-':4} {p.assumption}")
        return
    unknown = set(only) - {p.name for p in PROBES}
    if unknown:
        raise RkcError(f"unknown probe(s) {', '.join(sorted(unknown))} (see rkc probe --list)")
    selected = [p for p in PROBES if not only or p.name in only]
    kernel = LinuxKernel(os.path.join(root, "dev", "accel"))
    on_npu, why = rocket_status(kernel)
    if on_npu:
        def make_npu(hypothesis):
            return RocketDevice(kernel=kernel, quiet=True)
        target = f"NPU ({why})"
    else:  # deferred: the emulated kernel and its simulator executor, only on a machine without the NPU
        from rkc.runtime.rocket.emulated import CHAIN_PATCHED, EmulatedKernel
        from rkc.runtime.rocket.sim_executor import SimExecutor

        def make_npu(hypothesis):
            return RocketDevice(kernel=EmulatedKernel(CHAIN_PATCHED, executor=SimExecutor(_quirks(hypothesis))),
                                quiet=True)
        target = "emulated kernel"
        click.echo(f"rkc probe: {EMULATED_NOTE}", err=True)

    with make_npu({}) as dev:
        device = dev.describe()
    results = [run_probe(p, make_npu, lambda h: SimDevice(quirks=_quirks(h)), npu_is_simulator=not on_npu)
               for p in selected]
    if not on_npu:
        for r in results:
            if r.conclusion:
                ran = "the program ran through the ioctl path; " if r.status == "agree" else ""
                r.conclusion = f"emulated run: {ran}says nothing about hardware"

    dram_section = None
    if dram_flag:
        if on_npu:
            with RocketDevice(kernel=kernel, quiet=True) as dev:
                dram_section = dram.measure(dev, dram_mib)
        else:
            dram_section = dram.measure(None, dram_mib)
        dram_section["clocks"] = soc.gather(root)  # the DDR and CPU clocks the figures were taken at

    gemm_section = None
    if gemm_flag:
        if on_npu:
            with RocketDevice(kernel=kernel, quiet=True) as dev:
                gemm_section = rate.measure(dev)
        else:
            gemm_section = rate.measure(None)

    report = {
        "schema": "rkc-probe-report/1",
        "rkc": _rkc_version(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "kernel": platform.release(), "python": platform.python_version()},
        "target": target,
        "note": "" if on_npu else EMULATED_NOTE,
        "device": device,
        "board": gather(root, kernel).as_dict() if on_npu else None,
        "probes": [r.as_dict() for r in results],
        "dram": dram_section,
        "gemm": gemm_section,
        "summary": {s: sum(r.status == s for r in results) for s in sorted({r.status for r in results})},
    }
    write_atomic(output, json.dumps(report, indent=2) + "\n")

    click.echo(f"probes on the {target}:")
    for r in results:
        click.echo(f"  {r.name:13} {r.question or '-':4} {r.status:12} {r.detail or r.conclusion}")
    if dram_section:
        click.echo(f"memory bandwidth ({dram_section['convention']}):")
        for line in dram.lines(dram_section):
            click.echo(line)
        click.echo(f"  measured at: {soc.clocks_line(dram_section['clocks'])}")
    if gemm_section:
        click.echo("GEMM rate (rkc's own programs, checked against numpy):")
        for line in rate.lines(gemm_section):
            click.echo(line)
    click.echo(f"report: {output} ({', '.join(f'{n} {s}' for s, n in report['summary'].items())})")
