"""Finding the rocket node: ask each /dev/accel/accelN for its DRM driver name
(DRM_IOCTL_VERSION) instead of guessing an index."""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from rkc.runtime.rocket import uapi
from rkc.runtime.rocket.kernel import KernelInterface, LinuxKernel

DRIVER_NAME = "rocket"
_FIELD_BYTES = 256  # name/date/desc buffers; the kernel reports the real length


@dataclass(frozen=True)
class DriverVersion:
    major: int
    minor: int
    patchlevel: int
    name: str
    date: str
    desc: str

    @property
    def version(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.name} {self.major}.{self.minor}.{self.patchlevel} ({self.desc})"


@dataclass(frozen=True)
class NodeInfo:
    path: str
    driver: DriverVersion | None
    error: str | None = None  # why it could not be asked (permission, ...)

    @property
    def is_rocket(self) -> bool:
        return self.driver is not None and self.driver.name == DRIVER_NAME


def read_version(kernel: KernelInterface, fd: int) -> DriverVersion:
    """DRM_IOCTL_VERSION: driver name, version and description of an open node."""
    bufs = [ctypes.create_string_buffer(_FIELD_BYTES) for _ in range(3)]
    v = uapi.DrmVersion()
    for field, buf in zip(("name", "date", "desc"), bufs):
        setattr(v, field + "_len", _FIELD_BYTES)
        setattr(v, field, ctypes.addressof(buf))
    kernel.ioctl(fd, uapi.DRM_IOCTL_VERSION, v)

    def text(buf, length: int) -> str:
        return buf.raw[: min(length, _FIELD_BYTES)].decode("utf-8", "replace")

    return DriverVersion(v.version_major, v.version_minor, v.version_patchlevel,
                         text(bufs[0], v.name_len), text(bufs[1], v.date_len), text(bufs[2], v.desc_len))


def scan_nodes(kernel: KernelInterface | None = None) -> list[NodeInfo]:
    """Every accel node with its driver (or why it could not be opened)."""
    kernel = kernel or LinuxKernel()
    found = []
    for path in kernel.list_nodes():
        try:
            fd = kernel.open(path)
        except OSError as exc:
            found.append(NodeInfo(path, None, f"{os.strerror(exc.errno or errno.EIO)}"))
            continue
        try:
            found.append(NodeInfo(path, read_version(kernel, fd)))
        except OSError as exc:
            found.append(NodeInfo(path, None, f"DRM_IOCTL_VERSION failed: {os.strerror(exc.errno or errno.EIO)}"))
        finally:
            kernel.close(fd)
    return found


def find_rocket_node(kernel: KernelInterface | None = None) -> str | None:
    """Path of the first accel node driven by "rocket", or None."""
    for node in scan_nodes(kernel):
        if node.is_rocket:
            return node.path
    return None
