"""Fault injection, for tests only: a Device wrapper whose NPU submissions fail
on demand, as a board's do when the kernel resets a core (JobFailed: the
completion fence carries an error).

Selected by the environment, never by a production option:
RKC_TEST_DEVICE_FAULTS=1 wraps every device open_device() opens (disarmed:
the tests arm it through `engine.device.arm(n)`); =every:N also fails every
Nth submission from the start (a subprocess's server, the soak). Unset (the
normal case): no wrapper, nothing on any hot path."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

from rkc.ir.errors import RkcError
from rkc.runtime.device import BufferObject, Device, Job, Submission
from rkc.runtime.rocket.errors import JobFailed

ENV = "RKC_TEST_DEVICE_FAULTS"


class FaultyDevice(Device):
    """`inner` with submissions that fail when armed: arm(n) fails the nth
    submission from now (once); every=N fails each Nth. Everything else is
    the inner device's."""

    def __init__(self, inner: Device, every: int | None = None) -> None:
        super().__init__()
        self.inner, self.every = inner, every
        self.kind, self.lanes, self.supports_chaining = inner.kind, inner.lanes, inner.supports_chaining
        self.completes_ppu = inner.completes_ppu
        self.submits = 0  # submissions so far (direct and prepared)
        self.failed = 0  # submissions failed on purpose
        self._fail_at: int | None = None
        self._lock = threading.Lock()

    def arm(self, after: int = 1) -> None:
        """Fail the `after`th submission from now."""
        with self._lock:
            self._fail_at = self.submits + after

    def _tick(self, label: str) -> None:
        with self._lock:
            self.submits += 1
            fail = self.submits == self._fail_at or (self.every and self.submits % self.every == 0)
            if self.submits == self._fail_at:
                self._fail_at = None
            if fail:
                self.failed += 1
        if fail:
            raise JobFailed(f"job {label}: injected device fault (submission {self.submits}, {ENV})")

    # -- the Device interface: the inner device's, with the count --------------------
    def submit(self, jobs: Sequence[Job], chained: bool = False) -> Submission:
        self._tick(jobs[0].label if jobs else "?")
        return self.inner.submit(jobs, chained)

    def prepare_submit(self, jobs: Sequence[Job], chained: bool = False) -> Callable[[], None]:
        run, label = self.inner.prepare_submit(jobs, chained), (jobs[0].label if jobs else "?")

        def faulty() -> None:
            self._tick(label)
            run()
        return faulty

    def wait(self, submission: Submission, timeout_s: float = 5.0) -> None:
        self.inner.wait(submission, timeout_s)

    def create_bo(self, size: int) -> BufferObject:
        return self.inner.create_bo(size)

    def create_guard_bo(self, size: int) -> BufferObject:
        return self.inner.create_guard_bo(size)

    def free_bo(self, bo: BufferObject) -> None:
        self.inner.free_bo(bo)

    def prepare_cpu_access(self, bo: BufferObject, timeout_s: float = 5.0) -> None:
        self.inner.prepare_cpu_access(bo, timeout_s)

    def finish_cpu_access(self, bo: BufferObject) -> None:
        self.inner.finish_cpu_access(bo)

    @property
    def counters(self):
        return self.inner.counters

    def reset_counters(self) -> None:
        self.inner.reset_counters()

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # device-specific extras (the simulator's, rocket's)
        return getattr(self.inner, name)


def from_env(device: Device) -> Device:
    """`device`, wrapped when RKC_TEST_DEVICE_FAULTS asks for it."""
    spec = os.environ.get(ENV)
    if not spec:
        return device
    if spec == "1":
        return FaultyDevice(device)
    kind, _, n = spec.partition(":")
    if kind != "every" or not n.isdigit() or int(n) < 1:
        raise RkcError(f"{ENV}={spec!r}: expected 1 or every:N (N >= 1)")
    return FaultyDevice(device, every=int(n))
