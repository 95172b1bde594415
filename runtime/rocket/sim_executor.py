"""The simulator as the NPU behind the emulated kernel.

`SimExecutor` is an NpuModel: the emulated kernel hands it each job with the
kicks it programmed, and it runs them with runtime.sim's Npu (PC, CNA, CORE,
DPU, PPU) over the job's IOMMU domain. The simulator sees exactly the memory
the NPU would: the objects mapped in that file's domain, at their IOVAs, as
they are in DRAM (not the CPU's cached view), so a missing FINI_BO, a BO not
mapped in the job's domain or a dangling address all show up as they would on
the board. Anything the simulator refuses becomes an NpuFault, which the
kernel turns into a reset job with an errored fence.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rkc.runtime.rocket.executors import NpuFault, PageTable
from rkc.runtime.sim.errors import SimError
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.npu import Npu
from rkc.runtime.sim.quirks import DEFAULT, Quirks


def domain_space(table: PageTable) -> IovaSpace:
    """An IovaSpace whose BOs are the objects mapped in `table`, sharing their memory."""
    space = IovaSpace()
    for iova, nbytes, store in table.mappings():
        bo = space.create_at(iova, nbytes)
        bo.host = np.frombuffer(store, np.uint8)  # the object's DRAM, not a copy
    return space


class SimExecutor:
    def __init__(self, quirks: Quirks = DEFAULT) -> None:
        self.quirks = quirks
        self.jobs: list = []  # runtime.sim JobStats of every job run, for tests and probes

    def run_job(self, table: PageTable, core: int, tasks: list[tuple[int, int]], kicks: list[int],
                label: str, irq_blocks: tuple[str, ...] | None = None) -> None:
        # which interrupt completes a task is the kernel's choice: a job's irq_mask (kernel/
        # patch 0005) names it, else the stock reading of Q12 in self.quirks stands
        quirks = self.quirks if irq_blocks is None else replace(self.quirks, completion_blocks=irq_blocks)
        npu = Npu(domain_space(table), quirks)
        try:
            if all(k == 1 for k in kicks):
                self.jobs.append(npu.run_job(label, core, tasks, chained=False))
                return
            first = 0
            for number in kicks:  # > 4095 tasks: one chained kick per slice
                self.jobs.append(npu.run_job(label, core, tasks[first:first + number], chained=number > 1))
                first += number
        except SimError as exc:
            raise NpuFault(str(exc)) from exc
