"""Helpers for the rocket-device tests: hand-built regcmd tasks and a toy NPU.

`IncrementExecutor` is NOT a model of the NPU: it gives each task a visible,
order-sensitive effect (dst[i] = src[i] + 1 over COPY_BYTES, with the
addresses taken from the task's CNA_FEATURE_DATA_ADDR and DPU_DST_BASE_ADDR)
so tests can see whether data flowed through the emulated kernel's memory,
caches and fences in the right order. Numerical results come from the
simulator executor, not from this."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rkc.ir.npu import regcmd
from rkc.ir.npu.regcmd import RegcmdBuilder
from rkc.ir.npu.registers import Block
from rkc.runtime.device import BufferObject, Task
from rkc.runtime.rocket.executors import NpuMemory, check_startable

COPY_BYTES = 64
ENABLE = (Block.CNA, Block.CORE, Block.DPU)


def task_entries(src: int, dst: int, enable=ENABLE, extra: int = 0) -> np.ndarray:
    """A minimal task: feature address, destination address, `extra` filler
    writes, then the 4-entry tail."""
    b = RegcmdBuilder()
    b.write("CNA_FEATURE_DATA_ADDR", src)
    for _ in range(extra):
        b.write("CNA_CBUF_CON0", DATA_BANK=1, WEIGHT_BANK=11)
    b.write("DPU_DST_BASE_ADDR", dst)
    b.finish(enable)
    return b.array()


def put_task(bo: BufferObject, offset: int, entries: np.ndarray) -> Task:
    """Write `entries` into `bo` at `offset` (CPU side; caller does FINI)."""
    raw = entries.astype("<u8").view(np.uint8)
    bo.host[offset: offset + raw.nbytes] = raw
    return Task(bo.iova + offset, len(entries))


def chain_tasks(bo: BufferObject, specs: list[tuple[int, int]], stride: int = 256) -> list[Task]:
    """Tasks (src, dst) laid out every `stride` bytes in `bo`, tails linked."""
    arrays = [task_entries(s, d) for s, d in specs]
    tasks = [Task(bo.iova + i * stride, len(a)) for i, a in enumerate(arrays)]
    for i in range(len(arrays) - 1):
        regcmd.link_tail(arrays[i], tasks[i + 1].regcmd_iova, tasks[i + 1].regcmd_count)
    for i, a in enumerate(arrays):
        put_task(bo, i * stride, a)
    return tasks


@dataclass
class IncrementExecutor:
    """Toy NPU for data-flow tests (see the module docstring)."""

    tasks_run: list[int] = field(default_factory=list)

    def run_task(self, memory: NpuMemory, iova: int, entries: np.ndarray,
                 irq_blocks: tuple[str, ...] = ("DPU",)) -> None:
        check_startable(memory, entries, irq_blocks)
        regs = {d.register.name: d.value for d in regcmd.decode(entries) if d.register is not None}
        src, dst = regs["CNA_FEATURE_DATA_ADDR"], regs["DPU_DST_BASE_ADDR"]
        data = np.frombuffer(memory.read(src, COPY_BYTES), np.uint8)
        memory.write(dst, (data + 1).astype(np.uint8).tobytes())
        self.tasks_run.append(iova)


class RecordingKernel:
    """Wraps a KernelInterface and records every ioctl's struct bytes as sent."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.sent: list[tuple[int, int, bytes]] = []

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def ioctl(self, fd: int, request: int, arg) -> int:
        self.sent.append((fd, request, bytes(memoryview(arg).cast("B"))))
        return self.inner.ioctl(fd, request, arg)
