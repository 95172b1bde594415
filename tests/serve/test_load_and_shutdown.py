"""`rkrun serve` as real processes under load and at shutdown (the null device,
the tiny chat model): 64 concurrent streaming clients through the openai client,
each answered or refused with 503 + Retry-After, the server's RSS flat across
rounds, slow readers stalling nobody; SIGTERM with requests in flight: new
connections refused, in-flight ones finished or ended with a last event within
--grace, exit 0."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from serve.conftest import Http, get_json

RKRUN = Path(sys.executable).parent / "rkrun"
CLIENTS = 64
RSS_MARGIN = 0.05  # RSS after the load rounds within 5 % of RSS after the warm-up round


class Served:
    """`rkrun serve MODEL --device null ARGS` in a subprocess; .url, .port, .pid."""

    def __init__(self, model: Path, *args: str, device: str = "null") -> None:
        self.p = subprocess.Popen([str(RKRUN), "serve", str(model), "--port", "0", "--device", device, *args],
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stderr.readline()
        assert " on http://127.0.0.1:" in line, line
        self.url = line.split(" on ")[1].split("/ ")[0]
        self.port, self.pid = int(self.url.rsplit(":", 1)[1]), self.p.pid
        while " ready (" not in (ready := self.p.stderr.readline()):  # the socket answers at once; the model loads
            assert ready, "rkrun serve ended before the model was ready"

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS:")).split()[1])

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=60)
        finally:
            self.p.stderr.close()

    def __enter__(self) -> "Served":
        return self

    def __exit__(self, *exc) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        if not self.p.stderr.closed:
            self.p.stderr.close()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _stream_one(url: str, seed: int) -> tuple[str, float]:
    """One streamed chat through the openai client: ("ok" | "refused" | "failed: ...", when it ended)."""
    rng = random.Random(seed)
    words = "the cat and dog run in the world at one time".split()
    try:
        text, finish = "", None
        for ch in _client(url).chat.completions.create(
                model="tiny-chat", messages=[{"role": "user", "content": " ".join(rng.choices(words, k=8))}],
                max_tokens=rng.randint(4, 24), temperature=0, stream=True):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        return ("ok" if finish in ("length", "stop") else f"failed: finish {finish}"), time.monotonic()
    except openai.APIStatusError as exc:
        retry = exc.response.headers.get("retry-after", "")
        if exc.status_code in (429, 503) and retry.isdigit() and int(retry) >= 1:
            return "refused", time.monotonic()
        return f"failed: HTTP {exc.status_code}", time.monotonic()
    except Exception as exc:  # noqa: BLE001 (counted: the test shows what)
        return f"failed: {type(exc).__name__}: {exc}", time.monotonic()


def _round(url: str, seed: int) -> list[tuple[str, float]]:
    """CLIENTS streamed chats at once (a barrier starts them together)."""
    results: list = [None] * CLIENTS
    start = threading.Barrier(CLIENTS)

    def run(i: int) -> None:
        start.wait()
        results[i] = _stream_one(url, seed * 1000 + i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    return results


def _slow_reader(url: str, out: dict, go_on: threading.Event) -> None:
    """A streamed chat whose client reads its first event, then nothing until go_on is set, then the rest."""
    with Http(url, timeout=120) as h:
        r = h.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "the slow cat"}],
                                                       "max_tokens": 200, "temperature": 0, "stream": True})
        out["status"], events = r.status, [r.readline()]
        out["first"] = time.monotonic()
        go_on.wait(300)
        while line := r.readline():
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
        out["events"] = events


def test_64_streaming_clients_and_slow_readers(tiny_chat_rkbin):
    with Served(tiny_chat_rkbin, "--queue", "16") as server:
        _round(server.url, 0)  # warm-up: numba's kernels loaded, the prefix cache and the allocator's pools filled
        before = server.rss_kib()
        # two slow readers that stop reading after their first event, and two rounds of 64 behind them
        slow, go_on = [{}, {}], threading.Event()
        readers = [threading.Thread(target=_slow_reader, args=(server.url, s, go_on)) for s in slow]
        for t in readers:
            t.start()
        for _ in range(3000):  # bounded: 30 s
            if all("first" in s for s in slow):
                break
            time.sleep(0.01)
        results = _round(server.url, 1) + _round(server.url, 2)
        health = get_json(server.url, "/health")["queue"]
        go_on.set()
        for t in readers:
            t.join(timeout=120)
        after = server.rss_kib()
        assert server.stop() == 0
    outcomes = [r for r, _ in results]
    failed = [r for r in outcomes if r.startswith("failed")]
    assert not failed, failed[:5]
    served, refused = outcomes.count("ok"), outcomes.count("refused")
    assert served >= CLIENTS // 4 and served + refused == 2 * CLIENTS
    growth = (after - before) / before
    print(f"\n{2 * CLIENTS} streamed chats from {CLIENTS} concurrent openai clients (queue 16): {served} served, "
          f"{refused} refused with 503 + Retry-After, 0 failed; server RSS {before / 1024:.1f} -> "
          f"{after / 1024:.1f} MiB ({growth * 100:+.2f} %)")
    assert growth <= RSS_MARGIN
    # the two rounds were served while the slow readers read nothing; the NPU thread did not wait for them:
    # every job had ended (the slow ones' pieces buffered in their job's event queue, at most max_tokens of
    # them) before the slow readers read on, and then they got every event
    assert all(j["ended"] is not None for j in health["jobs"])
    for s in slow:
        assert s["status"] == 200 and s["events"][-1] == b"[DONE]"
        assert json.loads(s["events"][-2])["choices"][0]["finish_reason"] in ("length", "stop")
    print(f"two slow readers stopped reading after their first event; the {2 * CLIENTS} chats behind them were "
          f"answered or refused {max(t for _, t in results) - max(s['first'] for s in slow):.2f} s later, all jobs "
          f"ended; then the slow readers read their {min(len(s['events']) for s in slow)}+ events to [DONE]")


def _stream_until_shutdown(url: str, out: dict, max_tokens: int) -> None:
    with Http(url, timeout=120) as h:
        r = h.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "the cat"}],
                                                       "max_tokens": max_tokens, "temperature": 0, "stream": True})
        out["status"] = r.status
        out["events"] = []
        while line := r.readline():
            if line.startswith(b"data: "):
                out["events"].append(line[6:].strip())


@pytest.mark.parametrize("grace,max_tokens", [(0.5, 200), (60.0, 24)])
def test_sigterm_drains_and_exits_0(tiny_chat_rkbin, grace, max_tokens):
    """SIGTERM with a stream in flight (the simulator: tens of ms a token): with a short grace the stream ends
    with a server_shutdown error event, with a long one it finishes ([DONE]); either way new connections are
    refused and the exit status is 0."""
    with Served(tiny_chat_rkbin, "--grace", str(grace), device="sim") as server:
        out: dict = {}
        reader = threading.Thread(target=_stream_until_shutdown, args=(server.url, out, max_tokens))
        reader.start()
        for _ in range(3000):  # bounded: 30 s
            if out.get("events"):
                break
            time.sleep(0.01)
        t = time.monotonic()
        server.p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(OSError):  # the listening socket is closed at once
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        code = server.p.wait(timeout=60)
        took = time.monotonic() - t
        server.p.stderr.close()
        reader.join(timeout=60)
    assert code == 0 and out["status"] == 200
    last = out["events"][-1]
    if grace < 1:
        error = json.loads(last)["error"]
        assert error["code"] == "server_shutdown" and error["type"] == "server_error"
        assert took < grace + 25  # bounded: the grace, uvicorn's second, the job's next token, unloading
    else:
        assert last == b"[DONE]"
        assert json.loads(out["events"][-2])["choices"][0]["finish_reason"] in ("length", "stop")
    print(f"\n--grace {grace}: exit 0 {took:.2f} s after SIGTERM; the stream in flight ended with {last[:80]!r}")
