"""What the simulator counts per task, per job and in total."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class TaskStats:
    job: str
    index: int  # task index in its job
    lane: int
    enable: int  # op-enable block mask
    precision: str  # CORE precision of a convolution task ("" if none)
    macs: int = 0
    dma_read: Counter = field(default_factory=Counter)  # bytes per DMA engine
    dma_written: Counter = field(default_factory=Counter)
    cbuf_banks: int = 0  # data + weight banks the task claims
    modelled_seconds: float = 0.0  # filled in by the performance model

    @property
    def dma_bytes(self) -> int:
        return sum(self.dma_read.values()) + sum(self.dma_written.values())


@dataclass
class JobStats:
    label: str
    lane: int
    chained: bool
    tasks: list[TaskStats] = field(default_factory=list)
    kicks: int = 0
    modelled_seconds: float = 0.0

    @property
    def macs(self) -> int:
        return sum(t.macs for t in self.tasks)

    @property
    def cbuf_banks(self) -> int:
        """The most CBUF banks any task of the job claims."""
        return max((t.cbuf_banks for t in self.tasks), default=0)

    @property
    def dma_read(self) -> Counter:
        return sum((t.dma_read for t in self.tasks), Counter())

    @property
    def dma_written(self) -> Counter:
        return sum((t.dma_written for t in self.tasks), Counter())
