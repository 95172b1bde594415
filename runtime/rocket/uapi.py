"""The kernel ABI the rocket device speaks: ioctl numbers and struct layouts.

Facts transcribed (not copied) from the Linux UAPI headers; layouts are
little-endian with natural alignment, as on arm64 (and x86-64, where the tests
run):

* include/uapi/drm/rocket_accel.h, torvalds/linux f088104d837a991c65e51fa30bb4196169b3244d
  (CREATE_BO, SUBMIT, PREP_BO, FINI_BO; drm_rocket_job is 40 bytes).
* kernel/patches/0003 of this repository (issue 8): drm_rocket_job grows
  ``flags`` + ``reserved`` to 48 bytes, DRM_ROCKET_JOB_CHAIN = 1 << 0, and the
  driver reports version 1.1 through DRM_IOCTL_VERSION (stock reports 0.0).
* kernel/patches/0004: no UAPI change; the files of one process share one NPU
  address space and the driver reports 1.2 (the device still checks the
  sharing itself at open, since the shared_vm parameter can switch it off).
* kernel/patches/0005: `reserved` becomes ``irq_mask`` (same 48 bytes) and
  DRM_ROCKET_JOB_IRQ_MASK = 1 << 1 says the job ends on the PC interrupts in
  it (PC_INTERRUPT_MASK bits: DPU_0/1 = bits 8/9, PPU_0/1 = bits 10/11) instead
  of the DPU's; driver 1.3.
* include/uapi/drm/drm.h, torvalds/linux 00c9672606f781f2db7e904127dcbdc2831701ca
  (DRM_IOCTL_VERSION, DRM_IOCTL_GEM_CLOSE, PRIME_HANDLE_TO_FD/FD_TO_HANDLE,
  DRM_COMMAND_BASE 0x40; these layouts have not changed since).
* include/uapi/linux/dma-buf.h (DMA_BUF_IOCTL_EXPORT_SYNC_FILE, 'b' 2) and
  include/uapi/linux/sync_file.h (SYNC_IOC_FILE_INFO, '>' 4), torvalds/linux
  1420edf7a3fbc9b8b0bbe24c3724d582dd4def28 / d1b1ebd5a0f1bd6cde886618bab554bf96f0a7e5.

The ioctl encoding is asm-generic/ioctl.h: ``dir << 30 | size << 16 | type << 8 | nr``
with dir 1 = write (user -> kernel), 2 = read, 3 = both.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

IOC_WRITE = 1
IOC_READ = 2

DRM_IOCTL_BASE = ord("d")
DRM_COMMAND_BASE = 0x40
DRM_COMMAND_END = 0xA0
DMA_BUF_BASE = ord("b")
SYNC_IOC_MAGIC = ord(">")


def ioc(direction: int, type_: int, nr: int, size: int) -> int:
    """Encode an ioctl request number (asm-generic layout)."""
    if not 0 <= size < (1 << 14):
        raise ValueError(f"ioctl argument of {size} bytes does not fit the size field")
    return (direction << 30) | (size << 16) | (type_ << 8) | nr


def ioc_fields(request: int) -> tuple[int, int, int, int]:
    """-> (dir, type, nr, size) of a request number."""
    return (request >> 30) & 3, (request >> 8) & 0xFF, request & 0xFF, (request >> 16) & 0x3FFF


u32, s32, u64, s64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64


class Struct(ctypes.LittleEndianStructure):
    """Base for the ABI structs; natural alignment like the C compiler."""

    def raw(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), ctypes.sizeof(self))


# --- drm.h -----------------------------------------------------------------------------

class DrmVersion(Struct):
    # int, int, int, then size_t/pointer pairs: the 4-byte hole after
    # version_patchlevel is implicit C padding (64 bytes on LP64).
    _fields_ = [
        ("version_major", ctypes.c_int),
        ("version_minor", ctypes.c_int),
        ("version_patchlevel", ctypes.c_int),
        ("name_len", ctypes.c_size_t),
        ("name", ctypes.c_void_p),
        ("date_len", ctypes.c_size_t),
        ("date", ctypes.c_void_p),
        ("desc_len", ctypes.c_size_t),
        ("desc", ctypes.c_void_p),
    ]


class DrmGemClose(Struct):
    _fields_ = [("handle", u32), ("pad", u32)]


class DrmPrimeHandle(Struct):
    _fields_ = [("handle", u32), ("flags", u32), ("fd", s32)]


DRM_CLOEXEC = 0o2000000  # O_CLOEXEC on Linux (asm-generic fcntl.h)
DRM_RDWR = 0o2  # O_RDWR

# --- rocket_accel.h ----------------------------------------------------------------------

class RocketCreateBo(Struct):
    _fields_ = [("size", u32), ("handle", u32), ("dma_address", u64), ("offset", u64)]


class RocketPrepBo(Struct):
    _fields_ = [("handle", u32), ("reserved", u32), ("timeout_ns", s64)]


class RocketFiniBo(Struct):
    _fields_ = [("handle", u32), ("reserved", u32)]


class RocketTask(Struct):
    _fields_ = [("regcmd", u32), ("regcmd_count", u32)]


class RocketJob(Struct):
    """struct drm_rocket_job as in the stock 1.0 header (40 bytes)."""

    _fields_ = [
        ("tasks", u64),
        ("in_bo_handles", u64),
        ("out_bo_handles", u64),
        ("task_count", u32),
        ("task_struct_size", u32),
        ("in_bo_handle_count", u32),
        ("out_bo_handle_count", u32),
    ]


class RocketJobV11(Struct):
    """struct drm_rocket_job with the kernel/ patch 0003 extension (48 bytes)."""

    _fields_ = RocketJob._fields_ + [("flags", u32), ("reserved", u32)]


class RocketJobV13(Struct):
    """struct drm_rocket_job with kernel/ patch 0005: `reserved` is the job's interrupt mask (48 bytes)."""

    _fields_ = RocketJob._fields_ + [("flags", u32), ("irq_mask", u32)]


class RocketSubmit(Struct):
    _fields_ = [("jobs", u64), ("job_count", u32), ("job_struct_size", u32), ("reserved", u64)]


DRM_ROCKET_JOB_CHAIN = 1 << 0
ROCKET_JOB_FLAGS_VALID = DRM_ROCKET_JOB_CHAIN
#: kernel/ patch 0005: drm_rocket_job.irq_mask names the PC interrupts that end the job
DRM_ROCKET_JOB_IRQ_MASK = 1 << 1
ROCKET_JOB_FLAGS_VALID_V13 = DRM_ROCKET_JOB_CHAIN | DRM_ROCKET_JOB_IRQ_MASK
#: PC_INTERRUPT_MASK bits of the two blocks whose completion can end a task (hw-rocket-and-mesa.md:
#: DPU_0/1 are bits 8/9, PPU_0/1 bits 10/11); stock rocket always waits for the DPU pair
PC_IRQ_BITS = {"DPU": (1 << 8) | (1 << 9), "PPU": (1 << 10) | (1 << 11)}
IRQ_MASK_VALID = PC_IRQ_BITS["DPU"] | PC_IRQ_BITS["PPU"]
#: kernel/ patch 0003: a chained kick runs at most this many tasks (PC_TASK_CON.TASK_NUMBER is 12 bits)
CHAIN_TASKS_PER_KICK = 0xFFF
#: driver version that understands drm_rocket_job.flags (kernel/ patch 0003)
CHAIN_VERSION = (1, 1)
#: driver version whose files of one process share one address space (kernel/ patch 0004)
SHARED_VM_VERSION = (1, 2)
#: driver version that takes a job-level interrupt mask, so PPU-only tasks complete (kernel/ patch 0005)
IRQ_MASK_VERSION = (1, 3)


def irq_mask_of(blocks: tuple[str, ...]) -> int:
    """drm_rocket_job.irq_mask for a job that ends on any of `blocks`' interrupts."""
    return sum(PC_IRQ_BITS[b] for b in sorted(set(blocks)))


def irq_blocks_of(mask: int) -> tuple[str, ...]:
    """The blocks whose interrupts `mask` (a valid irq_mask) waits for."""
    return tuple(b for b, bits in PC_IRQ_BITS.items() if mask & bits)

# --- dma-buf.h / sync_file.h -----------------------------------------------------------

class DmaBufExportSyncFile(Struct):
    _fields_ = [("flags", u32), ("fd", s32)]


class SyncFileInfo(Struct):
    _fields_ = [
        ("name", ctypes.c_char * 32),
        ("status", s32),
        ("flags", u32),
        ("num_fences", u32),
        ("pad", u32),
        ("sync_fence_info", u64),
    ]


class SyncFenceInfo(Struct):
    _fields_ = [
        ("obj_name", ctypes.c_char * 32),
        ("driver_name", ctypes.c_char * 32),
        ("status", s32),
        ("flags", u32),
        ("timestamp_ns", u64),
    ]


DMA_BUF_SYNC_READ = 1 << 0  # export: the fences a reader waits for (the writers')
DMA_BUF_SYNC_WRITE = 2 << 0

# --- request numbers -------------------------------------------------------------------

DRM_IOCTL_VERSION = ioc(IOC_READ | IOC_WRITE, DRM_IOCTL_BASE, 0x00, ctypes.sizeof(DrmVersion))
DRM_IOCTL_GEM_CLOSE = ioc(IOC_WRITE, DRM_IOCTL_BASE, 0x09, ctypes.sizeof(DrmGemClose))
DRM_IOCTL_PRIME_HANDLE_TO_FD = ioc(IOC_READ | IOC_WRITE, DRM_IOCTL_BASE, 0x2D, ctypes.sizeof(DrmPrimeHandle))
DRM_IOCTL_PRIME_FD_TO_HANDLE = ioc(IOC_READ | IOC_WRITE, DRM_IOCTL_BASE, 0x2E, ctypes.sizeof(DrmPrimeHandle))

DRM_ROCKET_CREATE_BO = 0x00
DRM_ROCKET_SUBMIT = 0x01
DRM_ROCKET_PREP_BO = 0x02
DRM_ROCKET_FINI_BO = 0x03

DRM_IOCTL_ROCKET_CREATE_BO = ioc(IOC_READ | IOC_WRITE, DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_ROCKET_CREATE_BO,
                                 ctypes.sizeof(RocketCreateBo))
DRM_IOCTL_ROCKET_SUBMIT = ioc(IOC_WRITE, DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_ROCKET_SUBMIT,
                              ctypes.sizeof(RocketSubmit))
DRM_IOCTL_ROCKET_PREP_BO = ioc(IOC_WRITE, DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_ROCKET_PREP_BO,
                               ctypes.sizeof(RocketPrepBo))
DRM_IOCTL_ROCKET_FINI_BO = ioc(IOC_WRITE, DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_ROCKET_FINI_BO,
                               ctypes.sizeof(RocketFiniBo))

DMA_BUF_IOCTL_EXPORT_SYNC_FILE = ioc(IOC_READ | IOC_WRITE, DMA_BUF_BASE, 2, ctypes.sizeof(DmaBufExportSyncFile))
SYNC_IOC_FILE_INFO = ioc(IOC_READ | IOC_WRITE, SYNC_IOC_MAGIC, 4, ctypes.sizeof(SyncFileInfo))


@dataclass(frozen=True)
class AbiEntry:
    """One ioctl of the ABI: what we encode next to what the UAPI documents."""

    name: str
    request: int
    struct: type[Struct]
    uapi_size: int  # struct size the header defines (LP64)
    uapi_request: int | None  # request number documented in docs/hw-rocket-and-mesa.md §1.2 (rocket only)


ABI: tuple[AbiEntry, ...] = (
    AbiEntry("DRM_IOCTL_ROCKET_CREATE_BO", DRM_IOCTL_ROCKET_CREATE_BO, RocketCreateBo, 24, 0xC0186440),
    AbiEntry("DRM_IOCTL_ROCKET_SUBMIT", DRM_IOCTL_ROCKET_SUBMIT, RocketSubmit, 24, 0x40186441),
    AbiEntry("DRM_IOCTL_ROCKET_PREP_BO", DRM_IOCTL_ROCKET_PREP_BO, RocketPrepBo, 16, 0x40106442),
    AbiEntry("DRM_IOCTL_ROCKET_FINI_BO", DRM_IOCTL_ROCKET_FINI_BO, RocketFiniBo, 8, 0x40086443),
    AbiEntry("DRM_IOCTL_VERSION", DRM_IOCTL_VERSION, DrmVersion, 64, None),
    AbiEntry("DRM_IOCTL_GEM_CLOSE", DRM_IOCTL_GEM_CLOSE, DrmGemClose, 8, None),
    AbiEntry("DRM_IOCTL_PRIME_HANDLE_TO_FD", DRM_IOCTL_PRIME_HANDLE_TO_FD, DrmPrimeHandle, 12, None),
    AbiEntry("DRM_IOCTL_PRIME_FD_TO_HANDLE", DRM_IOCTL_PRIME_FD_TO_HANDLE, DrmPrimeHandle, 12, None),
    AbiEntry("DMA_BUF_IOCTL_EXPORT_SYNC_FILE", DMA_BUF_IOCTL_EXPORT_SYNC_FILE, DmaBufExportSyncFile, 8, None),
    AbiEntry("SYNC_IOC_FILE_INFO", SYNC_IOC_FILE_INFO, SyncFileInfo, 56, None),
)

#: structs passed by pointer inside SUBMIT / SYNC_IOC_FILE_INFO, with the size the UAPI defines
NESTED_STRUCTS: tuple[tuple[str, type[Struct], int], ...] = (
    ("drm_rocket_task", RocketTask, 8),
    ("drm_rocket_job (1.0)", RocketJob, 40),
    ("drm_rocket_job (1.1, patch 0003)", RocketJobV11, 48),
    ("drm_rocket_job (1.3, patch 0005)", RocketJobV13, 48),
    ("sync_fence_info", SyncFenceInfo, 80),
)

TASK_STRUCT_SIZE = ctypes.sizeof(RocketTask)
JOB_STRUCT_SIZE_V10 = ctypes.sizeof(RocketJob)
JOB_STRUCT_SIZE_V11 = ctypes.sizeof(RocketJobV11)
