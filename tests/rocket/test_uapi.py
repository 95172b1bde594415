"""The ioctl numbers and struct layouts the runtime encodes match the UAPI."""

import ctypes

import pytest

from rkc.runtime.rocket import uapi

# docs/hw-rocket-and-mesa.md §1.2 (from include/uapi/drm/rocket_accel.h, torvalds/linux f088104d)
ROCKET_REQUESTS = {
    "DRM_IOCTL_ROCKET_CREATE_BO": 0xC0186440,
    "DRM_IOCTL_ROCKET_SUBMIT": 0x40186441,
    "DRM_IOCTL_ROCKET_PREP_BO": 0x40106442,
    "DRM_IOCTL_ROCKET_FINI_BO": 0x40086443,
}

# (struct, field) -> byte offset, from the header's field order and natural alignment
OFFSETS = [
    (uapi.RocketCreateBo, "size", 0), (uapi.RocketCreateBo, "handle", 4),
    (uapi.RocketCreateBo, "dma_address", 8), (uapi.RocketCreateBo, "offset", 16),
    (uapi.RocketPrepBo, "handle", 0), (uapi.RocketPrepBo, "reserved", 4), (uapi.RocketPrepBo, "timeout_ns", 8),
    (uapi.RocketFiniBo, "handle", 0), (uapi.RocketFiniBo, "reserved", 4),
    (uapi.RocketTask, "regcmd", 0), (uapi.RocketTask, "regcmd_count", 4),
    (uapi.RocketJob, "tasks", 0), (uapi.RocketJob, "in_bo_handles", 8), (uapi.RocketJob, "out_bo_handles", 16),
    (uapi.RocketJob, "task_count", 24), (uapi.RocketJob, "task_struct_size", 28),
    (uapi.RocketJob, "in_bo_handle_count", 32), (uapi.RocketJob, "out_bo_handle_count", 36),
    (uapi.RocketJobV11, "flags", 40), (uapi.RocketJobV11, "reserved", 44),
    (uapi.RocketSubmit, "jobs", 0), (uapi.RocketSubmit, "job_count", 8),
    (uapi.RocketSubmit, "job_struct_size", 12), (uapi.RocketSubmit, "reserved", 16),
    (uapi.DrmVersion, "name_len", 16), (uapi.DrmVersion, "name", 24), (uapi.DrmVersion, "desc", 56),
    (uapi.DrmPrimeHandle, "fd", 8),
    (uapi.SyncFileInfo, "status", 32), (uapi.SyncFileInfo, "num_fences", 40),
    (uapi.SyncFileInfo, "sync_fence_info", 48),
]


@pytest.mark.parametrize("entry", uapi.ABI, ids=lambda e: e.name)
def test_request_numbers_and_sizes(entry):
    assert ctypes.sizeof(entry.struct) == entry.uapi_size
    assert uapi.ioc_fields(entry.request)[3] == entry.uapi_size
    if entry.name in ROCKET_REQUESTS:
        assert entry.request == ROCKET_REQUESTS[entry.name] == entry.uapi_request


@pytest.mark.parametrize("struct,name,offset", OFFSETS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_field_offsets(struct, name, offset):
    assert getattr(struct, name).offset == offset


def test_nested_struct_sizes():
    for name, struct, size in uapi.NESTED_STRUCTS:
        assert ctypes.sizeof(struct) == size, name


def test_generic_drm_requests():
    assert uapi.DRM_IOCTL_VERSION == 0xC0406400  # DRM_IOWR(0x00, 64-byte struct drm_version on LP64)
    assert uapi.DRM_IOCTL_GEM_CLOSE == 0x40086409
    assert uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD == 0xC00C642D
    assert uapi.DRM_IOCTL_PRIME_FD_TO_HANDLE == 0xC00C642E
