"""Prometheus metrics of `rkrun serve` at /metrics (prometheus-client, the
text exposition format a Prometheus server scrapes).

Three sources, each counted once where it is known:

* HTTP requests, by endpoint and status: an ASGI wrapper around the app sees
  every response start (`requests`);
* generations, by kind and outcome (the finish reason, "rejected" or
  "failed"), their time to first token and the gaps between streamed pieces:
  the NPU thread reports each job (`job_done`, `piece_gap`);
* running totals read at scrape time, not mirrored: the model's counters
  (prompt tokens prefilled and taken from the prefix cache, tokens
  generated), the engine's time in prefill and decode, the device's NPU
  submits, jobs and tasks, the queue's depth.

Prefill and decode tokens per second: rate(rkc_prefill_tokens_total) /
rate(rkc_prefill_seconds_total) (decode likewise); the latest request's are
gauges too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from rkc.runtime.serve.worker import Job

# seconds; a first token on the NPU is tens of ms, on the simulator or behind a queue up to minutes
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# seconds between streamed pieces: a decode token is 3-50 ms on the null device and the NPU
GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ENDPOINTS = ("/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)  # one per app: several servers in one process
        self.model = None  # the LlmModel, once loaded
        self.worker = None
        self.requests = Counter("rkc_http_requests", "HTTP requests by endpoint and response status",
                                ["endpoint", "status"], registry=r)
        self.jobs = Counter("rkc_generations", "Generations the NPU thread ran, by kind and outcome (the finish "
                            "reason, rejected: a bad request found there, failed: an internal error)",
                            ["kind", "outcome"], registry=r)
        self.ttft = Histogram("rkc_time_to_first_token_seconds", "Request received to its first text piece",
                              ["kind"], buckets=TTFT_BUCKETS, registry=r)
        self.gap = Histogram("rkc_inter_token_seconds", "Time between a generation's text pieces (a piece is "
                             "a token, or a few while a character or a stop string is incomplete)",
                             buckets=GAP_BUCKETS, registry=r)
        self.last_rate = Gauge("rkc_last_tokens_per_second", "The latest generation's tokens per second",
                               ["phase"], registry=r)
        r.register(_Totals(self))

    # -- hooks -------------------------------------------------------------------------
    def job_done(self, job: "Job") -> None:
        """The NPU thread, after each job (whatever its outcome)."""
        self.jobs.labels(job.kind, job.outcome).inc()
        if job.first_token_at is not None:
            self.ttft.labels(job.kind).observe(job.first_token_at - (job.received_at or job.queued_at))
        t = self.model.timings if self.model is not None and job.first_token_at is not None else None
        if t is not None:
            if t.prefill_s > 0 and t.prompt_tokens:
                self.last_rate.labels("prefill").set(t.prompt_tokens / t.prefill_s)
            if t.decode_s > 0 and t.decode_runs:
                self.last_rate.labels("decode").set(t.decode_runs / t.decode_s)

    def piece_gap(self, seconds: float) -> None:
        self.gap.observe(seconds)

    # -- the endpoint ---------------------------------------------------------------------
    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST



class CountRequests:
    """ASGI middleware: each HTTP response counted by its endpoint (unknown paths: "other") and status."""

    def __init__(self, app: Callable, metrics: ServerMetrics) -> None:
        self.app, self.requests = app, metrics.requests

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        requests = self.requests

        async def send_counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, send_counted)


class _Totals:
    """Running totals, read when scraped."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def describe(self) -> list:
        return []  # read at scrape time: nothing to check at registration

    def collect(self) -> Iterator:
        m = self.m
        model, worker = m.model, m.worker
        yield GaugeMetricFamily("rkc_ready", "1 once the model is loaded and its kernels compiled",
                                value=float(model is not None and worker is not None))
        if worker is not None:
            yield GaugeMetricFamily("rkc_queue_waiting", "Requests waiting for the NPU", value=worker.waiting())
            yield GaugeMetricFamily("rkc_queue_capacity", "Requests that may wait (beyond: 503)",
                                    value=worker.capacity)
            yield CounterMetricFamily("rkc_queue_rejected", "Requests refused with 503: the queue was full",
                                      value=worker.rejected)
        if model is None:
            return
        s, times = model.stats, model.engine.times
        for name, doc, value in (
                ("rkc_prefill_tokens", "Prompt tokens prefilled", s.prefilled_tokens),
                ("rkc_cached_prompt_tokens", "Prompt tokens whose KV came from the prefix cache", s.cached_tokens),
                ("rkc_generated_tokens", "Tokens generated", s.generated_tokens),
                ("rkc_prefill_seconds", "Wall time prefilling", s.prefill_s),
                ("rkc_decode_seconds", "Wall time decoding (the tokens after each request's first)",
                 s.decode_s),
                ("rkc_decode_runs", "Decode program runs (one a token after each request's first)",
                 s.decode_runs),
                ("rkc_engine_npu_seconds", "Engine time in NPU submits (submit to done)", times.npu_s),
                ("rkc_engine_cpu_seconds", "Engine time in host steps", times.cpu_s)):
            yield CounterMetricFamily(name, doc, value=value)
        device = model.engine.device
        if device is not None:
            c = device.counters
            for name, doc, value in (("rkc_npu_submits", "Submissions to the NPU device", c.submits),
                                     ("rkc_npu_jobs", "NPU jobs submitted", c.jobs),
                                     ("rkc_npu_tasks", "NPU tasks (register command lists) submitted", c.tasks)):
                yield CounterMetricFamily(name, doc, value=value)
