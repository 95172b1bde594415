"""Seeing a job's completion fence from userspace.

The rocket UAPI has no out-fence, and SUBMIT returns 0 even when it dropped a
job. What it does do is attach each queued job's fence, as a write fence, to
every BO in the job's out list. So the device gives each job a private
"witness" BO in its out list and asks the dma-buf layer about that BO's fences:

* DRM_IOCTL_PRIME_HANDLE_TO_FD exports the witness as a dma-buf (once);
* DMA_BUF_IOCTL_EXPORT_SYNC_FILE (READ) snapshots its unsignalled write fences
  into a sync_file: right after SUBMIT that is exactly the job's fence if the
  job was queued and has not finished yet;
* SYNC_IOC_FILE_INFO reads the sync_file's status: 0 active, 1 signalled, <0 the
  fence's error (-ECANCELED when the kernel reset the core after its 500 ms job
  timeout; the data the job left behind is then garbage).

dma_resv's iterators skip signalled fences (drivers/dma-buf/dma-resv.c,
dma_resv_iter_walk_unlocked, torvalds/linux 047a1b877ed48098bed71fcfb1d4891e1b54441d),
so a job that finished before the snapshot looks like a dropped one. The device
resolves that with the scheduler's order: jobs of one fd run in order, so a job
with no fence after one that is still active was never queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from rkc.runtime.rocket import uapi
from rkc.runtime.rocket.kernel import KernelInterface

ACTIVE, SIGNALED = 0, 1


@dataclass(frozen=True)
class FenceStatus:
    status: int  # 0 active, 1 signalled, < 0 error (negative errno)
    num_fences: int

    @property
    def active(self) -> bool:
        return self.status == ACTIVE

    @property
    def failed(self) -> bool:
        return self.status < 0


def export_dmabuf(kernel: KernelInterface, fd: int, handle: int) -> int:
    arg = uapi.DrmPrimeHandle(handle=handle, flags=uapi.DRM_CLOEXEC | uapi.DRM_RDWR, fd=-1)
    kernel.ioctl(fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, arg)
    return arg.fd


def import_dmabuf(kernel: KernelInterface, fd: int, dmabuf_fd: int) -> int:
    arg = uapi.DrmPrimeHandle(handle=0, flags=0, fd=dmabuf_fd)
    kernel.ioctl(fd, uapi.DRM_IOCTL_PRIME_FD_TO_HANDLE, arg)
    return arg.handle


def export_write_fences(kernel: KernelInterface, dmabuf_fd: int) -> int:
    """A sync_file holding the BO's unsignalled write fences (what a reader waits for)."""
    arg = uapi.DmaBufExportSyncFile(flags=uapi.DMA_BUF_SYNC_READ, fd=-1)
    kernel.ioctl(dmabuf_fd, uapi.DMA_BUF_IOCTL_EXPORT_SYNC_FILE, arg)
    return arg.fd


def sync_file_status(kernel: KernelInterface, sync_fd: int) -> FenceStatus:
    info = uapi.SyncFileInfo()  # num_fences = 0: the kernel only reports count and status
    kernel.ioctl(sync_fd, uapi.SYNC_IOC_FILE_INFO, info)
    return FenceStatus(info.status, info.num_fences)
