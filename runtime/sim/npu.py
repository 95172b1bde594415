"""The NPU as the kernel sees it: three cores sharing one IOVA space.

`Npu.run_job` does what Linux rocket does with one job (rocket_job.c): all of
its tasks on one core, one kick per task (TASK_NUMBER = 1, PC_DATA_AMOUNT =
(regcmd_count + 1) / 2 - 1), or, for a hardware chain (a batched-submit kernel),
one kick with TASK_NUMBER = number of tasks that the PC follows through the
tails. CBUF contents are only trusted within one job.
"""

from __future__ import annotations

from typing import Sequence

from rkc.ir.npu.regcmd import PC_AMOUNT_MAX
from rkc.runtime.sim.errors import HangError, PcAmountError, QuirkRejection, SimError
from rkc.runtime.sim.executor import CoreState, execute, fetch_task
from rkc.runtime.sim.memory import IovaSpace
from rkc.runtime.sim.quirks import DEFAULT, Quirks
from rkc.runtime.sim.stats import JobStats, TaskStats

CORES = 3
INTEGER_PRECISIONS = ("int8", "int16", "int4")
MAX_TASKS_PER_KICK = 0xFFF  # PC_TASK_CON.TASK_NUMBER is 12 bits


def kernel_amount(regcmd_count: int) -> int:
    """PC_REGISTER_AMOUNTS the kernel programs for a task (rocket_job.c)."""
    if regcmd_count <= 0:
        raise PcAmountError(f"regcmd_count={regcmd_count}: the kernel rejects empty tasks (-EINVAL)")
    amount = (regcmd_count + 1) // 2 - 1
    if amount > PC_AMOUNT_MAX:
        raise PcAmountError(f"a task of {regcmd_count} entries needs PC_DATA_AMOUNT={amount}, which does not "
                            f"fit 16 bits (at most {2 * (PC_AMOUNT_MAX + 1)} entries per task)",
                            register="PC_REGISTER_AMOUNTS")
    return amount


class Npu:
    def __init__(self, mem: IovaSpace, quirks: Quirks = DEFAULT, cores: int = CORES) -> None:
        self.mem = mem
        self.quirks = quirks
        self.cores = [CoreState(i) for i in range(cores)]

    def run_job(self, label: str, lane: int, tasks: Sequence[tuple[int, int]], chained: bool) -> JobStats:
        """Execute one job's tasks [(regcmd IOVA, entry count)] on core `lane`
        the way rocket does: one kick per task, or one chained kick."""
        job = self.begin_job(label, lane, chained)
        index = 0
        try:
            if not tasks:
                raise PcAmountError("a job with no tasks (the kernel rejects it with -EINVAL)")
            if chained:
                if len(tasks) > MAX_TASKS_PER_KICK:
                    raise PcAmountError(f"{len(tasks)} tasks in one kick; PC_TASK_CON.TASK_NUMBER holds at most "
                                        f"{MAX_TASKS_PER_KICK}")
                self.kick(job, tasks[0][0], kernel_amount(tasks[0][1]), len(tasks), expected=tasks)
            else:
                for index, (iova, count) in enumerate(tasks):
                    self.kick(job, iova, kernel_amount(count), 1, first_index=index)
        except SimError as exc:
            raise exc.located(job=label, task=index if tasks else None)
        return job

    def begin_job(self, label: str, lane: int, chained: bool = False) -> JobStats:
        """A new job on core `lane`: nothing left in its CBUF is trusted any more."""
        self.cores[lane % len(self.cores)].cbuf.reset()
        return JobStats(label, lane, chained)

    def kick(self, job: JobStats, iova: int, amount: int, task_number: int = 1, first_index: int = 0,
             expected: Sequence[tuple[int, int]] | None = None) -> None:
        """What the kernel starts with PC_BASE_ADDRESS=iova, PC_REGISTER_AMOUNTS=amount,
        PC_TASK_CON.TASK_NUMBER=task_number and OP_EN (rocket_job.c): run
        `task_number` tasks, following the tails' links after the first. With
        `expected` (the job's task list), every link must reach the listed task."""
        state = self.cores[job.lane % len(self.cores)]
        job.kicks += 1
        index = first_index
        try:
            if not 1 <= task_number <= MAX_TASKS_PER_KICK:
                raise PcAmountError(f"TASK_NUMBER={task_number} does not fit 12 bits (1..{MAX_TASKS_PER_KICK})")
            for k in range(task_number):
                index = first_index + k
                task = fetch_task(state, self.mem, iova, amount)
                stats = TaskStats(job.label, index, job.lane, task.enable, "")
                execute(state, self.mem, self.quirks, task, stats)
                if k > 0 and stats.precision in INTEGER_PRECISIONS and self.quirks.chained_integer_tasks == "reject":
                    raise QuirkRejection(f"an {stats.precision} task after the first of a chained kick: reported "
                                         "wrong on hardware (Q1); submit integer tasks one kick each")
                stats.dma_read["PC_REGCMD"] += (task.enable_entry + 1) * 8
                job.tasks.append(stats)
                if k + 1 < task_number:
                    nxt = expected[index + 1] if expected is not None else None
                    iova, amount = self._follow(task, nxt)
        except SimError as exc:
            raise exc.located(job=job.label, task=index)

    @staticmethod
    def _follow(task, expected: tuple[int, int] | None) -> tuple[int, int]:
        link = task.link
        where = dict(entry=task.regs.entry("PC_REGISTER_AMOUNTS"), register="PC_REGISTER_AMOUNTS")
        if link.address is None or link.amount is None or link.amount == 0:
            raise HangError("chained kick: the tail does not link to a next task (PC_BASE_ADDRESS / "
                            "PC_REGISTER_AMOUNTS not written or 0) before TASK_NUMBER is reached", **where)
        address = link.address & ~0xF
        if expected is not None and address != expected[0]:
            raise HangError(f"chained kick: the tail links to {address:#x} but the job's next task is at "
                            f"{expected[0]:#x}", entry=task.regs.entry("PC_BASE_ADDRESS"),
                            register="PC_BASE_ADDRESS")
        return address, link.amount
