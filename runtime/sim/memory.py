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

While a job runs, its `JobAccess` bounds every DMA: writes go only to the
job's out-BOs (rocket orders jobs by those lists: an unlisted write races
other jobs, and a write into a weight or regcmd BO corrupts the model for every
later run). Reads of unlisted BOs are legal (Mesa lists no weight BO) and stay
allowed; no DMA but the PC's fetch may touch a guard BO (the loader's page at
IOVA 0 that no job owns: an address register the file left unrelocated).

CPU ownership follows rocket's cache maintenance (PREP_BO / FINI_BO): a BO's
host view is read-only except while the CPU holds it (`hold` .. `release`, i.e.
prepare_cpu_access .. finish_cpu_access), and the NPU may not touch a held BO
(on the board it would read stale DRAM or have its writes overwritten by the
CPU's cache lines). That is what makes `decoded` (runtime/sim/opcache.py) sound.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from rkc.ir.npu.extents import Walk
from rkc.runtime.device import IOVA_LIMIT, BufferObject
from rkc.runtime.sim.errors import AlignmentError, MemoryAccessError
from rkc.runtime.sim.opcache import DEFAULT_BUDGET, OperandCache

PAGE = 4096


def page_round(size: int) -> int:
    return -(-size // PAGE) * PAGE


@dataclass(frozen=True)
class JobAccess:
    """The BOs one job may touch (handles), named in refusals."""

    label: str
    writes: frozenset[int]


@dataclass(frozen=True)
class Region:
    """Bytes [start, end) of one BO, as the DMA sees them."""

    bo: BufferObject
    offset: int  # of `start` inside the BO
    nbytes: int

    def data(self) -> np.ndarray:
        """The bytes, read-only."""
        view = self.bo.host[self.offset:self.offset + self.nbytes]
        view.flags.writeable = False
        return view


class IovaSpace:
    """Buffer objects by IOVA; allocation, lookup and bounds-checked views."""

    def __init__(self, limit: int = IOVA_LIMIT, cache_bytes: int = DEFAULT_BUDGET) -> None:
        self.limit = limit
        self._starts: list[int] = []  # sorted IOVAs
        self._bos: list[BufferObject] = []  # same order
        self._next_handle = 1
        self._held: set[int] = set()  # handles the CPU holds
        self.cache = OperandCache(cache_bytes)
        self.job_access: JobAccess | None = None  # set by the device while a job runs
        self.guards: set[int] = set()  # handles of guard BOs

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
        """A zero-filled BO at an IOVA another allocator chose (the emulated
        kernel's IOMMU domain, runtime/rocket/sim_executor.py)."""
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
        self._held.discard(bo.handle)
        self.guards.discard(bo.handle)
        self.cache.forget(bo.handle)

    def _checked_size(self, size: int) -> int:
        if size <= 0:
            raise MemoryAccessError(f"BO size {size} must be positive")
        return page_round(size)

    def _insert(self, iova: int, size: int) -> BufferObject:
        host = np.zeros(size, np.uint8)[:]  # a view: its writeable flag toggles, the memory stays writable
        host.flags.writeable = False
        bo = BufferObject(self._next_handle, size, iova, host)
        self._next_handle += 1
        i = bisect.bisect_left(self._starts, iova)
        self._starts.insert(i, iova)
        self._bos.insert(i, bo)
        return bo

    @property
    def bos(self) -> tuple[BufferObject, ...]:
        return tuple(self._bos)

    # -- CPU ownership --------------------------------------------------------
    def hold(self, bo: BufferObject) -> None:
        """The CPU takes the BO (prepare_cpu_access): its host view becomes writable."""
        self._held.add(bo.handle)
        bo.host.flags.writeable = True

    def release(self, bo: BufferObject) -> None:
        """The CPU hands the BO back (finish_cpu_access): read-only again, and
        whatever was decoded from it is stale."""
        self._held.discard(bo.handle)
        bo.host.flags.writeable = False
        self.cache.released(bo.handle)

    def held(self, bo: BufferObject) -> bool:
        return bo.handle in self._held

    # -- lookup ---------------------------------------------------------------
    def find(self, iova: int) -> BufferObject | None:
        i = bisect.bisect_right(self._starts, iova) - 1
        if i >= 0:
            bo = self._bos[i]
            if iova < bo.iova + bo.size:
                return bo
        return None

    def region(self, iova: int, nbytes: int, what: str, write: bool = False, fetch: bool = False) -> Region:
        """The BO region [iova, iova + nbytes); raises unless one BO holds it all
        and (but for the PC's `fetch`) the running job may touch it that way."""
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
        if bo.handle in self._held:
            raise MemoryAccessError(
                f"{what}: [{iova:#x}, {end:#x}) is in {bo!r}, which the CPU holds (prepare_cpu_access "
                "without finish_cpu_access): the NPU would see stale memory")
        if not fetch and bo.handle in self.guards:
            raise MemoryAccessError(f"{what}: [{iova:#x}, {end:#x}) is in the guard page at IOVA {bo.iova:#x}, "
                                    "which no job owns (an address the file left unrelocated)")
        access = self.job_access
        if access is not None and write and bo.handle not in access.writes:
            raise MemoryAccessError(f"{what}: writes [{iova:#x}, {end:#x}) in {bo!r}, which is not an "
                                    f"output BO of job {access.label}")
        return Region(bo, iova - bo.iova, nbytes)

    def decoded(self, region: Region, form, build) -> np.ndarray:
        """`build()`'s operand decoded from `region`, kept until those bytes change
        (runtime/sim/opcache.py); `form` names how it was decoded."""
        return self.cache.get(region.bo.handle, region.offset, region.nbytes, form, build)

    def strided(self, iova: int, walk: Walk, dtype, what: str, writable: bool = False) -> np.ndarray:
        """A view of the elements `walk` (ir/npu/extents.py, the extent the load-time
        proof checked) reaches from `iova`; every element must lie in the same BO.
        Reads of element-misaligned data come back as a copy; writes must be aligned."""
        dtype = np.dtype(dtype)
        if dtype.itemsize != walk.itemsize:
            raise TypeError(f"{what}: {dtype} elements on a walk of {walk.itemsize}-byte elements")
        shape, strides = walk.shape, walk.strides
        if any(n <= 0 for n in shape):
            raise MemoryAccessError(f"{what}: empty data cube {shape}")
        lo, hi = walk.span()
        r = self.region(iova + lo, hi - lo, what, write=writable)
        base = r.offset - lo
        if base % dtype.itemsize or any(s % dtype.itemsize for s in strides):
            if writable:
                raise AlignmentError(f"{what}: {dtype.itemsize}-byte elements at {iova:#x} with strides "
                                     f"{strides} are not element aligned")
            # element-misaligned within the BO: go through bytes
            raw = np.lib.stride_tricks.as_strided(
                r.bo.host[base:], shape=shape + (dtype.itemsize,), strides=strides + (1,), writeable=False)
            return np.ascontiguousarray(raw).view(dtype).reshape(shape)
        memory = r.bo.host.view()
        if writable:  # the NPU writes DRAM whatever the CPU mapping allows
            memory.flags.writeable = True
            self.cache.written(r.bo.handle, r.offset, r.offset + r.nbytes)
        typed = memory.view(dtype)
        start = base // dtype.itemsize
        return np.lib.stride_tricks.as_strided(typed[start:], shape=shape, strides=strides, writeable=writable)
