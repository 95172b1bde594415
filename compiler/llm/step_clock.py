"""CPU time of an LLM compile's weight preparation per step, for its report
(one line) and for compiler/llm/budget.py's rates."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class StepClock:
    """CPU seconds of weight preparation per step (reading the GGUF, calibration,
    rotation, clip search, GPTQ, ...), each step timed on the thread that runs it
    (time.thread_time: the --jobs workers' steps add up to the process's CPU
    time, and a wait on another thread is not counted). The compile's report
    gives them in one line; budget's rates are fitted to them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - t0
            with self._lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + spent

    def take(self) -> dict[str, float]:
        """The seconds so far, and a fresh start."""
        with self._lock:
            out, self.seconds = self.seconds, {}
        return out


# the one clock of this process's weight preparation (build.compile_gguf reports and resets it)
STEPS = StepClock()
