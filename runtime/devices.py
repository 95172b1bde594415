"""Choosing a Device: `--device auto|sim|rocket`.

`auto` picks the rocket driver when a rocket node exists, else the simulator,
and says which on stderr."""

from __future__ import annotations

import sys
from typing import Callable

from rkc.ir.errors import RkcError
from rkc.runtime import faults
from rkc.runtime.device import Device
from rkc.runtime.null import NullDevice
from rkc.runtime.rocket import RocketDevice, scan_nodes
from rkc.runtime.sim import SimDevice

# kind -> factory taking keyword options and returning a Device
FACTORIES: dict[str, Callable[..., Device]] = {
    "sim": SimDevice,
    "rocket": RocketDevice,
    "null": NullDevice,  # checks and completes every submit at once (host cost)
}
KINDS = ("auto", *FACTORIES)


def rocket_status(kernel=None) -> tuple[bool, str]:
    """(usable, why): is there an accel node driven by "rocket" that we can open?"""
    nodes = scan_nodes(kernel)
    rocket = [n for n in nodes if n.is_rocket]
    if rocket:
        return True, f"rocket NPU at {rocket[0].path}"
    unopened = [n for n in nodes if n.driver is None]
    if unopened:
        return False, f"no rocket NPU found; {unopened[0].path} could not be asked ({unopened[0].error})"
    return False, "no rocket NPU found"


def rocket_available() -> bool:
    """True when a DRM accel node driven by "rocket" exists on this machine."""
    return rocket_status()[0]


def open_device(kind: str = "auto", quiet: bool = False, **options) -> Device:
    """Open a device; `options` go to its factory (rocket: node, cores, kernel)."""
    if kind not in KINDS:
        raise RkcError(f"unknown device {kind!r} (choose from {', '.join(KINDS)})")
    if kind == "auto":
        usable, why = rocket_status(options.get("kernel"))
        kind = "rocket" if usable else "sim"
        if not quiet:
            print(f"rkc: using device {kind} ({why})", file=sys.stderr)
    if kind == "sim":
        options = {k: v for k, v in options.items() if k not in ("kernel", "node", "cores")}
    if kind == "rocket":
        options.setdefault("quiet", quiet)
    return faults.from_env(FACTORIES[kind](**options))  # unchanged unless a test asks for faults


def device_options(f):
    """`--device` and `--cores` for a click command; the command gets `device`
    (auto|sim|rocket) and `cores` and passes them to open_device(device, cores=cores)."""
    import click  # deferred: only the CLIs need it, not rkc.load()

    f = click.option("--cores", type=click.IntRange(1, 3), default=3, show_default=True,
                     help="NPU cores (rocket: one fd per core; jobs are spread over them).")(f)
    return click.option("--device", type=click.Choice(KINDS), default="auto", show_default=True,
                        help="auto: the rocket NPU if this machine has one, else the simulator.")(f)
