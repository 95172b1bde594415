"""What the simulator raises when a stream would misbehave on the hardware.

Every error is an `RkcError` (one line, non-zero exit in the CLIs) and names
where it happened: the job, the task (index in the job), the regcmd entry and
the register involved. Blocks raise with what they know (register, entry);
the executor adds the job and task on the way out.

One class per kind of fault, so tests (and callers that want to react) can
tell them apart.
"""

from __future__ import annotations

from rkc.ir.errors import RkcError


class SimError(RkcError):
    """A stream the RK3588 NPU would not execute as intended."""

    def __init__(self, what: str, *, register: str | None = None, entry: int | None = None,
                 job: str | None = None, task: int | None = None) -> None:
        self.what = what
        self.register = register
        self.entry = entry
        self.job = job
        self.task = task
        super().__init__(self._text())

    def located(self, *, job: str | None = None, task: int | None = None,
                entry: int | None = None, register: str | None = None) -> "SimError":
        """Fill in context the raiser did not know (never overrides)."""
        self.job = self.job if self.job is not None else job
        self.task = self.task if self.task is not None else task
        self.entry = self.entry if self.entry is not None else entry
        self.register = self.register if self.register is not None else register
        self.args = (self._text(),)
        return self

    def _text(self) -> str:
        where = []
        if self.job is not None:
            where.append(f"job {self.job}")
        if self.task is not None:
            where.append(f"task {self.task}")
        if self.entry is not None:
            where.append(f"entry {self.entry}")
        if self.register is not None:
            where.append(self.register)
        prefix = ", ".join(where)
        return f"NPU sim: {prefix}: {self.what}" if prefix else f"NPU sim: {self.what}"

    def __str__(self) -> str:
        return self._text()


class MemoryAccessError(SimError):
    """A DMA touches an address outside every BO, or runs across a BO's end."""


class AlignmentError(SimError):
    """An address or stride does not have the alignment its field requires."""


class CbufError(SimError):
    """The task's CBUF banks overflow (data + weight > 12, a tile larger than its banks)."""


class FieldError(SimError):
    """A field holds a value out of its range, or reserved bits are set."""


class UnknownRegisterError(SimError):
    """An entry targets no known block, or a block offset with no register."""


class StaleRegisterError(SimError):
    """An enabled block needs a register this task did not write (its value
    would come from whatever the ping-pong group held before)."""


class NoWritebackError(SimError):
    """The task never raises the DPU interrupt rocket waits for (job timeout)."""


class HangError(SimError):
    """The program would stall the NPU: an armed DMA with nothing to feed it,
    an op-enable without the 0x0041 marker, a fetch window without op-enable."""


class PcAmountError(SimError):
    """A task is too long for, or disagrees with, the PC's 16-bit fetch amount."""


class GeometryError(SimError):
    """Blocks disagree about the data cube (sizes, channels, output shape)."""


class UnsupportedError(SimError):
    """A mode the sources describe but nobody has shown working on the RK3588
    (or that the simulator does not model yet): rejected rather than guessed."""


class QuirkRejection(UnsupportedError):
    """Rejected by the reading of an open hardware question (runtime/sim/quirks.py)."""
