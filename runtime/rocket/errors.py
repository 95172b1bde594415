"""Errors of the rocket device. All are user-facing (RkcError): one line that
names the job (its label, e.g. the segment) or the BO, and what happened."""

from rkc.ir.errors import RkcError


class RocketError(RkcError):
    """The rocket device could not be opened or used."""


class JobRejected(RocketError):
    """Userspace validation refused a job before SUBMIT (the kernel would have
    dropped it silently, or the NPU would have faulted or hung)."""


class JobDropped(RocketError):
    """The kernel accepted SUBMIT but never queued the job (it returns 0 anyway)."""


class JobTimeout(RocketError):
    """The job did not finish before the deadline."""


class JobFailed(RocketError):
    """The job's completion fence carries an error: the kernel reset the core
    (500 ms job timeout) or the scheduler cancelled it."""
