"""Choosing a Device: `--device auto|sim|rocket`.

`auto` picks the rocket driver when a rocket node exists, else the simulator,
and says which on stderr."""

from __future__ import annotations

import importlib
import sys

from ir.errors import RkcError
from runtime.device import Device

# kind -> "module:factory"; each factory takes keyword options and returns a Device
FACTORIES = {
    "sim": "runtime.sim:SimDevice",
    "rocket": "runtime.rocket:RocketDevice",
}
KINDS = ("auto", *FACTORIES)


def rocket_available() -> bool:
    """True when a DRM accel node driven by "rocket" exists on this machine."""
    try:
        from runtime.rocket import find_rocket_node
    except ImportError:
        return False
    return find_rocket_node() is not None


def open_device(kind: str = "auto", quiet: bool = False, **options) -> Device:
    if kind not in KINDS:
        raise RkcError(f"unknown device {kind!r} (choose from {', '.join(KINDS)})")
    if kind == "auto":
        kind = "rocket" if rocket_available() else "sim"
        if not quiet:
            why = "rocket NPU found" if kind == "rocket" else "no rocket NPU found"
            print(f"rkc: using device {kind} ({why})", file=sys.stderr)
    module, attr = FACTORIES[kind].split(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise RkcError(f"device {kind!r} is not available in this build of rkc") from None
    return factory(**options)
