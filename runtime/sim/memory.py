"""The NPU's view of memory: a 4 GiB IOVA window holding buffer objects.

Mirrors rocket: every BO gets a page-aligned IOVA range from a per-file
allocator (drm_mm over the IOMMU aperture 0..0xFFFFFFFF, lowest fit first) and
its pages are mapped whole, so a BO's usable size is its requested size
rounded up to 4 KiB (Linux drivers/accel/rocket/rocket_gem.c, rocket_drv.c).

Every DMA the simulator performs goes through `IovaSpace.region`, which
checks that the bytes lie inside ONE buffer object: an access outside every BO
would be an IOMMU fault on the board (the job times out, the output is
garbage), and one that runs from a BO into its neighbour reads or corrupts
data that belongs to someone else even where the IOVAs happen to be adjacent.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from runtime.device import IOVA_LIMIT, BufferObject
from runtime.sim.errors import AlignmentError, MemoryAccessError

PAGE = 4096


def page_round(size: int) -> int:
    return -(-size // PAGE) * PAGE


@dataclass(frozen=True)
class Region:
    """Bytes [start, end) of one BO, as the DMA sees them."""

    bo: BufferObject
    offset: int  # of `start` inside the BO
    nbytes: int


class IovaSpace:
    """Buffer objects by IOVA; allocation, lookup and bounds-checked views."""

    def __init__(self, limit: int = IOVA_LIMIT) -> None:
        self.limit = limit
        self._starts: list[int] = []  # sorted IOVAs
        self._bos: list[BufferObject] = []  # same order
        self._next_handle = 1

    # -- allocation ---------------------------------------------------------
    def allocate(self, size: int) -> BufferObject:
        """A zero-filled BO at the lowest free page-aligned range that fits."""
        size = self._checked_size(size)
        cursor = 0
        for bo in self._bos:
            if bo.iova - cursor >= size:
                break
            cursor = bo.iova + bo.size
        if cursor + size > self.limit:
            raise MemoryAccessError(f"no room for a {size}-byte BO in the {self.limit:#x}-byte IOVA window")
        return self._insert(cursor, size)

    def create_at(self, iova: int, size: int) -> BufferObject:
        """A zero-filled BO at a chosen IOVA (replaying captures)."""
        size = self._checked_size(size)
        if iova % PAGE:
            raise MemoryAccessError(f"BO address {iova:#x} is not page aligned")
        if iova < 0 or iova + size > self.limit:
            raise MemoryAccessError(f"BO [{iova:#x}, {iova + size:#x}) is outside the IOVA window")
        i = bisect.bisect_right(self._starts, iova)
        if i > 0 and self._bos[i - 1].iova + self._bos[i - 1].size > iova:
            raise MemoryAccessError(f"BO at {iova:#x} overlaps {self._bos[i - 1]!r}")
        if i < len(self._bos) and self._bos[i].iova < iova + size:
            raise MemoryAccessError(f"BO at {iova:#x} overlaps {self._bos[i]!r}")
        return self._insert(iova, size)

    def free(self, bo: BufferObject) -> None:
        i = bisect.bisect_left(self._starts, bo.iova)
        if i == len(self._bos) or self._bos[i] is not bo:
            raise MemoryAccessError(f"{bo!r} is not a live BO of this device")
        del self._starts[i]
        del self._bos[i]

    def _checked_size(self, size: int) -> int:
        if size <= 0:
            raise MemoryAccessError(f"BO size {size} must be positive")
        return page_round(size)

    def _insert(self, iova: int, size: int) -> BufferObject:
        bo = BufferObject(self._next_handle, size, iova, np.zeros(size, np.uint8))
        self._next_handle += 1
        i = bisect.bisect_left(self._starts, iova)
        self._starts.insert(i, iova)
        self._bos.insert(i, bo)
        return bo

    @property
    def bos(self) -> tuple[BufferObject, ...]:
        return tuple(self._bos)

    # -- lookup ---------------------------------------------------------------
    def find(self, iova: int) -> BufferObject | None:
        i = bisect.bisect_right(self._starts, iova) - 1
        if i >= 0:
            bo = self._bos[i]
            if iova < bo.iova + bo.size:
                return bo
        return None

    def region(self, iova: int, nbytes: int, what: str) -> Region:
        """The BO region [iova, iova + nbytes); raises unless one BO holds it all."""
        if nbytes <= 0:
            raise MemoryAccessError(f"{what}: empty access of {nbytes} bytes at {iova:#x}")
        bo = self.find(iova)
        if bo is None:
            raise MemoryAccessError(f"{what}: address {iova:#x} is outside every BO")
        end = iova + nbytes
        if end > bo.iova + bo.size:
            nxt = self.find(bo.iova + bo.size)
            beyond = f" into {nxt!r}" if nxt is not None else ""
            raise MemoryAccessError(
                f"{what}: [{iova:#x}, {end:#x}) runs past the end of {bo!r} "
                f"(by {end - bo.iova - bo.size} bytes){beyond}")
        return Region(bo, iova - bo.iova, nbytes)

    def bytes_at(self, iova: int, nbytes: int, what: str) -> np.ndarray:
        """A writable uint8 view of [iova, iova + nbytes)."""
        r = self.region(iova, nbytes, what)
        return r.bo.host[r.offset:r.offset + nbytes]

    def strided(self, iova: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype,
                what: str, writable: bool = False) -> np.ndarray:
        """A view of elements at ``iova + sum(index * stride)`` (strides in bytes,
        may be negative or zero); every element must lie in the same BO. Reads
        of element-misaligned data come back as a copy; writes must be aligned."""
        dtype = np.dtype(dtype)
        if any(n <= 0 for n in shape):
            raise MemoryAccessError(f"{what}: empty data cube {shape}")
        lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + dtype.itemsize
        r = self.region(iova + lo, hi - lo, what)
        base = r.offset - lo
        if base % dtype.itemsize or any(s % dtype.itemsize for s in strides):
            if writable:
                raise AlignmentError(f"{what}: {dtype.itemsize}-byte elements at {iova:#x} with strides "
                                     f"{strides} are not element aligned")
            # element-misaligned within the BO: go through bytes
            raw = np.lib.stride_tricks.as_strided(
                r.bo.host[base:], shape=shape + (dtype.itemsize,), strides=strides + (1,))
            return np.ascontiguousarray(raw).view(dtype).reshape(shape)
        typed = r.bo.host.view(dtype)
        start = base // dtype.itemsize
        return np.lib.stride_tricks.as_strided(typed[start:], shape=shape, strides=strides)
