"""The Device interface: everything that runs a model talks to the NPU through it.

Two implementations: the built-in simulator (`runtime.sim`) and the mainline
rocket driver (`runtime.rocket`). The interface mirrors the rocket UAPI
(docs/hardware-facts.md §1.2-1.3) so that both fit it unchanged:

* a buffer object (BO) has a handle, a size, a 32-bit IOVA (the address the
  NPU uses) and a host view (the CPU mapping);
* the CPU brackets every access to a BO the NPU may touch with
  `prepare_cpu_access` (wait for the NPU's writes, make caches coherent for the
  CPU: rocket PREP_BO) and `finish_cpu_access` (hand it back: rocket FINI_BO);
  the simulator enforces it (a BO's host view is read-only outside the bracket);
* `submit` queues jobs; a job is an ordered list of tasks that run on one core,
  each task being the IOVA of its first regcmd entry and its entry count (tail
  included), plus the BOs it reads and writes (used only for ordering). A job's
  `lane` selects the submission queue (one rocket fd per core); jobs on
  different lanes may run on different cores at the same time.
* `wait` blocks until a submission has finished, or raises.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

IOVA_LIMIT = 1 << 32  # every NPU address field is 32 bits wide


@dataclass(eq=False)
class BufferObject:
    handle: int
    size: int
    iova: int
    host: np.ndarray  # uint8 view of the CPU mapping, `size` bytes

    def __repr__(self) -> str:
        return f"BO(handle={self.handle}, size={self.size}, iova={self.iova:#x})"


@dataclass(frozen=True)
class Task:
    regcmd_iova: int
    regcmd_count: int  # 64-bit entries, tail included


@dataclass
class Job:
    tasks: Sequence[Task]
    in_bos: Sequence[BufferObject] = ()
    out_bos: Sequence[BufferObject] = ()
    lane: int = 0
    label: str = ""  # names the job in errors (e.g. "segment 3 job 1")


@dataclass
class Counters:
    """What the device counted (the simulator counts everything; rocket counts
    what the host sees: submits, jobs, tasks, kicks)."""

    submits: int = 0
    jobs: int = 0
    tasks: int = 0
    kicks: int = 0
    macs: int = 0
    dma_read: dict[str, int] = field(default_factory=dict)  # bytes per DMA engine
    dma_written: dict[str, int] = field(default_factory=dict)
    modelled_seconds: float = 0.0  # performance model (simulator only)

    @property
    def ddr_bytes(self) -> int:
        return sum(self.dma_read.values()) + sum(self.dma_written.values())


class Submission:
    """Handle returned by `Device.submit`, passed to `Device.wait`."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.jobs = list(jobs)
        self.done = False
        self.error: Exception | None = None  # what `wait` raises (a job failed)


class Device(ABC):
    """Abstract NPU device; see the module docstring for the contract."""

    #: "sim" or "rocket"
    kind: str = "?"
    #: number of submission queues that can run concurrently (NPU cores)
    lanes: int = 1
    #: True when a job can run as one hardware-chained kick (tails followed by the PC)
    supports_chaining: bool = False
    completes_ppu: bool = False  # the kernel ends a task on the PPU interrupt too (kernel/patches/0005)

    def __init__(self) -> None:
        self._counters = Counters()  # implementations add to it as they submit

    @abstractmethod
    def create_bo(self, size: int) -> BufferObject:
        """Allocate a zero-filled BO of at least `size` bytes with an IOVA."""

    def create_guard_bo(self, size: int) -> BufferObject:
        """A BO that no job may touch (runtime/loader.py maps one at IOVA 0).
        The simulator refuses any DMA into it; a board just has the page."""
        return self.create_bo(size)

    @abstractmethod
    def free_bo(self, bo: BufferObject) -> None:
        """Release a BO; its IOVA and host view become invalid."""

    @abstractmethod
    def prepare_cpu_access(self, bo: BufferObject, timeout_s: float = 5.0) -> None:
        """Wait for NPU writes to `bo` and make it coherent for the CPU."""

    @abstractmethod
    def finish_cpu_access(self, bo: BufferObject) -> None:
        """Hand `bo` back to the NPU after CPU writes."""

    @abstractmethod
    def submit(self, jobs: Sequence[Job], chained: bool = False) -> Submission:
        """Queue `jobs` in order. With `chained`, each job runs as one kick whose
        tasks are linked by their tails (needs `supports_chaining`)."""

    @abstractmethod
    def wait(self, submission: Submission, timeout_s: float = 5.0) -> None:
        """Block until every job of `submission` finished; raise if one failed."""

    @property
    def counters(self) -> Counters:
        """Running totals since the device was opened (or counters reset)."""
        return self._counters

    def reset_counters(self) -> None:
        """Start counting afresh."""
        self._counters = Counters()

    def close(self) -> None:
        """Release every resource (BOs, file descriptors)."""

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, jobs: Sequence[Job], chained: bool = False, timeout_s: float = 5.0) -> None:
        """Submit and wait."""
        self.wait(self.submit(jobs, chained), timeout_s)

    def prepare_submit(self, jobs: Sequence[Job], chained: bool = False) -> Callable[[], None]:
        """A function that submits `jobs` and waits for them, for a program that
        runs the same jobs every time (runtime/plan.py builds one per NPU step
        at load). A device may check at preparation what cannot change between
        calls; this default does all the work per call, looking `submit` and
        `wait` up each time (a wrapped device method is honoured)."""
        return lambda: self.wait(self.submit(jobs, chained))
