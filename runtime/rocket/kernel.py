"""The one seam between the rocket device and the operating system.

Everything the device does to the kernel goes through a `KernelInterface`:
list the accel nodes, open/close file descriptors, ioctl with a struct, mmap a
BO, read CLOCK_MONOTONIC. `LinuxKernel` does it with os/fcntl/mmap/time; the
emulated kernel (`runtime.rocket.emulated`) implements the same five calls, so
the device's marshalling code runs unchanged against either.

Error convention (both implementations): a failing ioctl raises OSError with
the kernel's errno; a successful one returns the ioctl's (non-negative) return
value, which matters for PREP_BO (it may return remaining jiffies).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import time
from typing import Protocol, runtime_checkable

ACCEL_DIR = "/dev/accel"
_NODE_RE = re.compile(r"accel(\d+)$")


@runtime_checkable
class KernelInterface(Protocol):
    #: short description for messages ("linux", "emulated rocket 1.0 ...")
    name: str

    def list_nodes(self) -> list[str]:
        """Paths of the DRM accel nodes, in index order."""

    def open(self, path: str) -> int:
        """Open a node read-write (close-on-exec); -> file descriptor."""

    def close(self, fd: int) -> None: ...

    def ioctl(self, fd: int, request: int, arg) -> int:
        """Issue `request` with `arg` (a writable ctypes struct the kernel may fill)."""

    def mmap(self, fd: int, length: int, offset: int):
        """Map `length` bytes of `fd` at `offset`, shared read-write; -> a writable buffer."""

    def munmap(self, mapping) -> None:
        """Release a mapping returned by `mmap` (views into it must be gone)."""

    def clock_ns(self) -> int:
        """CLOCK_MONOTONIC in nanoseconds (the base of PREP_BO deadlines)."""


def sort_nodes(names) -> list[str]:
    """accel names in numeric order (accel10 after accel9)."""
    found = [(int(m.group(1)), n) for n in names if (m := _NODE_RE.match(n))]
    return [n for _, n in sorted(found)]


class LinuxKernel:
    """The real kernel, through the Python standard library."""

    name = "linux"

    def __init__(self, accel_dir: str = ACCEL_DIR) -> None:
        self.accel_dir = accel_dir

    def list_nodes(self) -> list[str]:
        try:
            names = os.listdir(self.accel_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [os.path.join(self.accel_dir, n) for n in sort_nodes(names)]

    def open(self, path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def close(self, fd: int) -> None:
        os.close(fd)

    def ioctl(self, fd: int, request: int, arg) -> int:
        # mutate_flag=True: the kernel writes back into `arg` and the C return
        # value comes back (PREP_BO may return a positive jiffies count).
        return fcntl.ioctl(fd, request, arg, True)

    def mmap(self, fd: int, length: int, offset: int):
        return mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)

    def munmap(self, mapping) -> None:
        mapping.close()

    def clock_ns(self) -> int:
        return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
