"""One NPU, many clients: a bounded first-come first-served queue in front of
one thread that owns the LlmModel (the tokenizer and the engine are used from
that thread only). Each job streams its events to the event loop of the
request that made it; a job whose client has gone is cancelled at its next
token (or skipped if it had not started)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rkc.runtime.api.llm import Completion, LlmModel, RequestError

log = logging.getLogger(__name__)

# events a job sends: ("piece", (str, [TokenLogprob] | None)), ("done", Completion), ("error", RequestError | Exception); the first of them
# says the request was valid (a piece or done) or not (error), and the response begins with it. The request's
# disconnect watcher adds ("gone", None); the end of shutdown's grace period ("shutdown", None) (Worker.drain).

# How long the NPU thread waits for a streamed job's first piece to reach the socket before it computes the next
# token. The wait ends as soon as the event loop has written it (~1 ms); the bound only keeps one stuck client from
# holding up the queue.
FIRST_PIECE_WAIT_S = 1.0


@dataclass
class Job:
    kind: str  # "chat" (input: messages) or "completion" (input: prompt)
    input: Any
    options: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    streamed: bool = False  # the client reads server-sent events: its first piece is flushed before the next token
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    first_piece_sent: threading.Event = field(default_factory=threading.Event)  # written to the socket (or gone)
    id: int = 0
    received_at: float | None = None  # the handler began: the request line and headers parsed, the route found
    queued_at: float = 0.0
    started_at: float | None = None
    encoded_at: float | None = None  # the prompt's tokens ready (chat template, tokenizing, the checks)
    first_token_at: float | None = None
    first_written_at: float | None = None  # the first piece written to the socket (streamed jobs)
    first_token_cpu_s: float | None = None  # CPU time of the NPU thread from the start to the first piece
    first_token_engine_s: float | None = None  # of which in the engine's program runs (prefill, any decode before it)
    ended_at: float | None = None
    outcome: str = "queued"
    tokens: int = 0
    engine_s: float = 0.0  # the engine's own time in its program steps (NPU and CPU) for this job
    stream_s: float = 0.0  # CPU time of the server on this job's streamed pieces: the hand-off, the SSE writes
    ending: str | None = None  # set by end(): the response ends now, with this event

    def send(self, kind: str, value: Any = None) -> None:
        t = time.thread_time()
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        self.stream_s += time.thread_time() - t

    def cancel(self) -> None:
        """The client has gone (or its response ended): the NPU thread stops at the next token, waits for nothing."""
        self.cancelled.set()
        self.first_piece_sent.set()

    def end(self, reason: str) -> None:
        """The server ends the job (shutdown's grace period is over): it stops at the next token, and its response
        ends with `reason` as its last event (a stream: an SSE error event, ahead of pieces not yet written; a
        waiting request: 503)."""
        self.ending = reason
        self.cancel()
        if not self.loop.is_closed():
            self.send(reason)

    def timeline(self, t0: float) -> dict[str, Any]:
        at = lambda t: None if t is None else round(t - t0, 6)  # noqa: E731
        return {"id": self.id, "kind": self.kind, "received": at(self.received_at), "queued": at(self.queued_at),
                "started": at(self.started_at), "encoded": at(self.encoded_at), "first_token": at(self.first_token_at),
                "first_written": at(self.first_written_at), "ended": at(self.ended_at), "outcome": self.outcome,
                "first_token_cpu_s": None if self.first_token_cpu_s is None else round(self.first_token_cpu_s, 6),
                "first_token_engine_s": (None if self.first_token_engine_s is None
                                         else round(self.first_token_engine_s, 6)),
                "tokens": self.tokens, "engine_s": round(self.engine_s, 6), "stream_s": round(self.stream_s, 6)}


class QueueFull(Exception):
    def __init__(self, retry_after: int, message: str | None = None, code: str = "queue_full") -> None:
        super().__init__(message or f"the server is busy; retry in {retry_after} s")
        self.retry_after, self.code = retry_after, code


class Worker:
    def __init__(self, model: LlmModel, queue_size: int = 8, history: int = 64, metrics=None) -> None:
        self.model = model
        self.metrics = metrics  # a serve.metrics.ServerMetrics, told of each job and piece
        self.capacity = queue_size
        self._waiting: deque[Job | None] = deque()  # None: stop
        self._cv = threading.Condition()
        self.jobs: deque[Job] = deque(maxlen=history)  # recent jobs, for /health's timeline
        self.t0 = time.monotonic()
        self._ids = itertools.count(1)
        self._durations: deque[float] = deque(maxlen=16)
        self.rejected = 0
        self.draining = False  # shutting down: no new jobs
        self.stopped = False  # the NPU thread has been told to end
        self._drain_timer: threading.Timer | None = None
        self._open: weakref.WeakValueDictionary[int, Job] = weakref.WeakValueDictionary()  # responses not yet gone
        self.thread = threading.Thread(target=self._loop, name="rkc-npu", daemon=True)
        self.thread.start()

    # -- the event loop's side -----------------------------------------------------------
    def waiting(self) -> int:
        """Jobs waiting whose clients are still there (the others are skipped when reached)."""
        with self._cv:
            return sum(1 for j in self._waiting if j is not None and not j.cancelled.is_set())

    def submit(self, job: Job) -> Job:
        with self._cv:
            if self.draining:
                self.rejected += 1
                raise QueueFull(5, "the server is shutting down", "server_shutdown")
            if self.waiting() >= self.capacity:
                self.rejected += 1
                mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
                raise QueueFull(max(1, math.ceil(mean * (self.capacity + 1))))
            job.id, job.queued_at = next(self._ids), time.monotonic()
            self._open[job.id] = job
            self._waiting.append(job)
            self.jobs.append(job)
            self._cv.notify()
        return job

    def drain(self, grace_s: float) -> None:
        """Shutdown has begun: new jobs are refused; the running and waiting ones may finish within `grace_s`,
        then each is ended with a "shutdown" event (its client told so, by its stream or a 503)."""
        with self._cv:
            self.draining = True

        def end_all() -> None:  # every job whose response may still be open: queued, running, or still streaming
            with self._cv:
                jobs = [j for j in self._open.values() if not j.cancelled.is_set()]
            for job in jobs:
                job.end("shutdown")
        self._drain_timer = threading.Timer(grace_s, end_all)
        self._drain_timer.daemon = True
        self._drain_timer.start()

    def stop(self) -> None:
        """The NPU thread ends after the job it is running; a job submitted from now on is refused (503), never
        queued for a thread that is gone. Jobs still waiting are ended with a "shutdown" event."""
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        with self._cv:
            self.draining = self.stopped = True
            self._waiting.append(None)
            self._cv.notify()
        self.thread.join(timeout=30)
        with self._cv:
            left = [j for j in self._waiting if j is not None]
            self._waiting.clear()
        for job in left:
            job.end("shutdown")

    def status(self) -> dict[str, Any]:
        # t0: the timeline's origin on CLOCK_MONOTONIC, which a client on this machine reads too (time.monotonic)
        return {"waiting": self.waiting(), "capacity": self.capacity, "rejected": self.rejected,
                "t0": self.t0, "jobs": [j.timeline(self.t0) for j in list(self.jobs)]}

    # -- the NPU thread -------------------------------------------------------------------
    def _next(self) -> Job | None:
        with self._cv:
            while not self._waiting:
                self._cv.wait()
            return self._waiting.popleft()

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            job.started_at = time.monotonic()
            if job.cancelled.is_set():
                job.outcome, job.ended_at = "skipped", job.started_at
                if self.metrics is not None:
                    self.metrics.job_done(job)
                continue
            try:
                self._run(job)
            except RequestError as exc:
                job.outcome = "rejected"
                job.send("error", exc)
            except Exception as exc:  # a bug: this request fails, the server stays up
                log.exception("job %d failed", job.id)
                job.outcome = "failed"
                job.send("error", exc)
            job.ended_at = time.monotonic()
            self._durations.append(job.ended_at - job.started_at)
            if self.metrics is not None:
                self.metrics.job_done(job)

    def _run(self, job: Job) -> None:
        call = self.model.chat if job.kind == "chat" else self.model.generate
        times = self.model.engine.times
        steps0, cpu0 = times.npu_s + times.cpu_s, time.thread_time()
        stream = call(job.input, **job.options, stream=True, cancel=job.cancelled)  # set: stops at the next token
        job.encoded_at = time.monotonic()
        # The response begins with the first piece (the first event), not now: the event loop shares the GIL with
        # this thread, and beginning the response (headers, the first SSE event) while this thread prefills made
        # the two take turns at the GIL (a forced switch waits sys.getswitchinterval(), 5 ms): a cached chat
        # turn's prefill of ~2 ms came out 4-7 ms late (bench/server.py, null device).
        last, picked, told = None, stream.logprobs, 0  # picked: the tokens' logprobs so far (when asked for)
        for piece in stream:
            first = job.first_token_at is None
            if first:
                job.first_token_at, job.first_token_cpu_s = time.monotonic(), time.thread_time() - cpu0
                job.first_token_engine_s = times.npu_s + times.cpu_s - steps0
            elif self.metrics is not None:
                now = time.monotonic()
                self.metrics.piece_gap(now - (last or job.first_token_at))
                last = now
            news = None if picked is None else picked[told:]  # the tokens this piece's text came from
            told += len(news or ())
            job.send("piece", (piece, news))
            if first and job.streamed:
                # The event loop shares the GIL with this thread: while this thread computes, every step of the
                # loop (wake, hand the piece to the request, write the socket) waits for a GIL switch, up to
                # sys.getswitchinterval() (5 ms) each: a median 3-5 ms between the first token and the client, up
                # to 17 ms in single requests (bench/server.py's chats on the null device).
                # Blocked here this thread holds no GIL, so the loop writes the response start and the first
                # piece at once; the next token waits about a millisecond, once per request.
                job.first_piece_sent.wait(FIRST_PIECE_WAIT_S)
        result: Completion = stream.result
        job.tokens, job.outcome = result.completion_tokens, result.finish_reason
        job.engine_s = times.npu_s + times.cpu_s - steps0
        job.send("done", result)  # (the first event if there was no text at all: the model ended its turn at once)
