"""rkrun serve soak: a real `rkrun serve` process (the tiny synthetic chat model
of bench/server.py, the null device) under mixed traffic for a set time
(default 30 minutes): chats and completions, streamed and not, through the
real openai client, plus clients that disconnect mid-stream or before their
answer. Each client is a thread with its own seeded random choice of what to
send next; together they keep the server's bounded queue near full, so some
requests are refused with 503 + Retry-After (counted, not errors).

Reports requests served, errors by kind (anything but an answer, an
intended disconnect or a 429/503 with Retry-After is an error), p50/p99 time
to first token of the streamed requests (the client's clock: request sent to
the first text chunk), the server's RSS over time (sampled from /proc), and
how the server ended (SIGTERM at the end: exit status 0 expected).
Prints a table, and with --json one object (also written to --out).

    PYTHONPATH=$PWD python bench/soak.py [--minutes 30] [--clients 12] [--queue 8] [--json] [--out soak.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import start_server, tiny_chat_model  # noqa: E402 (bench/server.py: the same tiny model)

WORDS = "the cat and dog run in world at one time a model small board hello".split()
KINDS = ("chat", "chat_stream", "completion", "completion_stream", "drop_stream", "drop_waiting")
WEIGHTS = (2, 4, 1, 2, 1, 1)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Soak:
    def __init__(self, port: int, seconds: float, clients: int, seed: int) -> None:
        self.port, self.deadline, self.clients, self.seed = port, time.monotonic() + seconds, clients, seed
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()  # "served", "dropped (intended)", "refused 503", "error: ..."
        self.by_kind: Counter = Counter()
        self.ttft: list[float] = []
        self.seen: set[type] = set()

    def record(self, kind: str, outcome: str, ttft: float | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.by_kind[kind] += 1
            if ttft is not None:
                self.ttft.append(ttft)

    def client(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0, timeout=120)
        while time.monotonic() < self.deadline:
            kind = rng.choices(KINDS, WEIGHTS)[0]
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))
            tokens = rng.randint(1, 48)
            try:
                outcome, ttft = getattr(self, kind)(api, rng, text, tokens)
            except openai.APIStatusError as exc:
                retry = exc.response.headers.get("retry-after")
                if exc.status_code in (429, 503) and retry and int(retry) >= 1:
                    outcome, ttft = f"refused {exc.status_code}", None
                    time.sleep(min(float(retry), 1.0) * rng.random())
                else:
                    outcome, ttft = f"error: HTTP {exc.status_code}", None
            except Exception as exc:  # noqa: BLE001 (counted by kind: the soak's report)
                outcome, ttft = f"error: {type(exc).__name__}", None
                if type(exc) not in self.seen:  # each kind's first traceback, for whoever reads the log
                    self.seen.add(type(exc))
                    traceback.print_exc()
            self.record(kind, outcome, ttft)

    # -- the kinds of request --------------------------------------------------------------
    def chat(self, api, rng, text, tokens):
        r = api.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": text}],
                                        max_tokens=tokens, temperature=rng.choice([0, 0.8]))
        return ("served" if r.choices[0].finish_reason in ("length", "stop") else "error: finish"), None

    def completion(self, api, rng, text, tokens):
        r = api.completions.create(model="tiny-chat", prompt=text, max_tokens=tokens, temperature=0)
        return ("served" if r.choices[0].finish_reason in ("length", "stop") else "error: finish"), None

    def _stream(self, t0: float, chunks, pick) -> tuple[str, float | None]:
        ttft, finish = None, None
        for ch in chunks:
            if ch.choices and pick(ch.choices[0]) and ttft is None:
                ttft = time.monotonic() - t0
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        return ("served" if finish in ("length", "stop") else "error: stream ended early"), ttft

    def chat_stream(self, api, rng, text, tokens):
        return self._stream(time.monotonic(), api.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": text}], max_tokens=tokens, temperature=0,
            stream=True), lambda c: c.delta.content)

    def completion_stream(self, api, rng, text, tokens):
        return self._stream(time.monotonic(), api.completions.create(model="tiny-chat", prompt=text, max_tokens=tokens,
                                                   temperature=0, stream=True), lambda c: c.text)

    def drop_stream(self, api, rng, text, tokens):
        """A streamed chat whose client closes the connection after a few events."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": text}], "max_tokens": 200, "stream": True}),
                {"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                retry = r.getheader("retry-after")
                refused = r.status in (429, 503) and retry and int(retry) >= 1
                return (f"refused {r.status}" if refused else f"error: HTTP {r.status}"), None
            for _ in range(rng.randint(1, 6)):
                if not r.readline():
                    break
        finally:
            conn.close()
        return "dropped (intended)", None

    def drop_waiting(self, api, rng, text, tokens):
        """A non-streamed chat whose client leaves before the answer (maybe while queued)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 200})
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            time.sleep(rng.random() * 0.05)
        finally:
            conn.close()
        return "dropped (intended)", None


def soak(model: Path, seconds: float, clients: int, queue: int, sample_s: float, seed: int) -> dict:
    p, port = start_server(model, "--device", "null", "--queue", str(queue))
    try:
        warm = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        warm.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "warm up"}],
                                     max_tokens=4)  # the first request of a process loads numba's kernels
        run = Soak(port, seconds, clients, seed)
        t0 = time.monotonic()
        rss = [(0.0, rss_kib(p.pid))]
        threads = [threading.Thread(target=run.client, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        while time.monotonic() < run.deadline and p.poll() is None:
            time.sleep(min(sample_s, max(0.0, run.deadline - time.monotonic())))
            if p.poll() is None:
                rss.append((round(time.monotonic() - t0, 1), rss_kib(p.pid)))
        for t in threads:
            t.join(timeout=180)
        crashed = p.poll() is not None
        if not crashed:
            rss.append((round(time.monotonic() - t0, 1), rss_kib(p.pid)))
            health = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            health.request("GET", "/health")
            cache = json.loads(health.getresponse().read())
            health.close()
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
    # RSS "flat": the last sample against the one after the first tenth of the run (the warm-up: numba's kernels,
    # the prefix cache's slots and the allocator's pools filled)
    warm = next((kib for t, kib in rss if t >= seconds / 10), rss[-1][1])
    errors = {k: v for k, v in run.outcomes.items() if k.startswith("error")}
    return {"seconds": seconds, "clients": clients, "queue": queue, "seed": seed,
            "requests": sum(run.outcomes.values()), "outcomes": dict(run.outcomes), "by_kind": dict(run.by_kind),
            "errors": sum(errors.values()), "crashed": crashed, "exit_status": code,
            "ttft_p50_ms": None if not run.ttft else percentile(run.ttft, 0.5) * 1e3,
            "ttft_p99_ms": None if not run.ttft else percentile(run.ttft, 0.99) * 1e3,
            "rss_kib": rss, "rss_warm_kib": warm, "rss_end_kib": rss[-1][1],
            "rss_growth_pct": (rss[-1][1] - warm) / warm * 100,
            "server_cache": None if crashed else {k: cache["cache"][k] for k in ("requests", "cancelled")},
            "server_rejected": None if crashed else cache["queue"]["rejected"]}


def print_table(row: dict) -> None:
    print(f"rkrun serve soak: {row['seconds'] / 60:.1f} min, {row['clients']} clients, queue {row['queue']}, "
          f"--device null, seed {row['seed']}")
    print(f"{'requests':40} {row['requests']:>10}")
    for k, v in sorted(row["outcomes"].items()):
        print(f"{'  ' + k:40} {v:>10}")
    for k, v in sorted(row["by_kind"].items()):
        print(f"{'  sent as ' + k:40} {v:>10}")
    print(f"{'errors (target 0)':40} {row['errors']:>10}")
    print(f"{'server crashed (target no)':40} {str(row['crashed']):>10}")
    print(f"{'exit status after SIGTERM (target 0)':40} {row['exit_status']:>10}")
    for q in ("p50", "p99"):
        v = row[f"ttft_{q}_ms"]
        print(f"{'time to first token ' + q + ' (streamed)':40} {'-' if v is None else f'{v:.1f} ms':>10}")
    warm, end = row["rss_warm_kib"] / 1024, row["rss_end_kib"] / 1024
    print(f"{'RSS after warm-up / at the end':40} {warm:>6.1f} / {end:.1f} MiB")
    print(f"{'RSS growth after warm-up (flat: <= 5 %)':40} {row['rss_growth_pct']:>9.2f} %")
    print("RSS over time (s: MiB): " + ", ".join(f"{t:.0f}: {k / 1024:.1f}" for t, k in row["rss_kib"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--queue", type=int, default=8)
    ap.add_argument("--sample", type=float, default=30.0, help="seconds between RSS samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the JSON object here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        row = soak(tiny_chat_model(Path(d), (1, 4, 16)), args.minutes * 60, args.clients, args.queue,
                   args.sample, args.seed)
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=1))
    if args.json:
        print(json.dumps(row, indent=1))
    else:
        print_table(row)


if __name__ == "__main__":
    main()
