"""Several boards behind a router (docs/api.md, "Several boards"): three
`rkrun serve` processes on the simulator behind LiteLLM's proxy, run with
the shipped examples/cluster/litellm.yaml (its board addresses replaced by the
replicas' loopback ports, its probe interval shortened), and the real openai
client in front. A conversation stays on one replica (its prefix cache serves
the later turns); one replica killed (SIGKILL) under load loses no request,
and the router's health check marks it down. (The simulator, not the null
device: a reply is compared with another replica's, and the null device's
outputs are whatever its buffers last held, which differ with a replica's
history; the tiny model's chat of 8 tokens costs ~0.1 s simulated.)"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import yaml

from serve.conftest import Http, post_json
from scratch import scratch_dir

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROUTER_CONFIG = ROOT / "examples" / "cluster" / "litellm.yaml"
BIN = Path(sys.executable).parent
REPLICAS = 3
PROBE_INTERVAL = 2  # seconds between the router's background health checks (the example: 15)


def _wait(what: str, ready, timeout: float, proc: subprocess.Popen, log: Path):
    """ready()'s first truthy value, polled until `timeout` seconds; fails with the process's log if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        value = ready()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"{what} not ready in {timeout} s:\n{log.read_text()[-3000:]}")


def _answers(url: str) -> bool:
    try:
        with Http(url, timeout=2) as h:
            return h.request("GET", "/health/readiness").status == 200
    except OSError:
        return False


def _start(log: Path, argv: list[str], env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    with open(log, "w") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env), log


def _cpu_seconds(proc: subprocess.Popen) -> float:
    """User + system CPU time of a running process (Linux /proc), for a figure the machine's load hardly moves."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """The replicas (processes, urls) and the router (url, key) in front of them."""

    def __init__(self, tmp: Path, rkbin: Path) -> None:
        self.router, self.procs = None, []
        try:
            self._start(tmp, rkbin)
        except BaseException:
            self.stop()
            raise

    def _start(self, tmp: Path, rkbin: Path) -> None:
        t = time.monotonic()
        model = tmp / "model.rkbin"  # the served name the example config asks for (openai/model)
        shutil.copy(rkbin, model)
        self.urls = [f"http://127.0.0.1:{_free_port()}" for _ in range(REPLICAS)]
        config = yaml.safe_load(ROUTER_CONFIG.read_text())
        boards = config["model_list"]
        assert len(boards) == REPLICAS
        for board, url in zip(boards, self.urls):
            board["litellm_params"]["api_base"] = url + "/v1"
        config["general_settings"]["health_check_interval"] = PROBE_INTERVAL
        (tmp / "litellm.yaml").write_text(yaml.safe_dump(config))
        self.key = "sk-" + secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{_free_port()}"
        # all four start at once (the router's start is the longest); its first probes may find the replicas
        # still loading: they count as up once a probe passes
        env = dict(os.environ, LITELLM_MASTER_KEY=self.key, LITELLM_LOCAL_MODEL_COST_MAP="True")
        self.router_log = tmp / "router.log"
        self.router, _ = _start(self.router_log, [
            str(BIN / "litellm"), "--config", str(tmp / "litellm.yaml"), "--host", "127.0.0.1",
            "--port", self.url.rsplit(":", 1)[1]], env)
        logs = []
        for i, url in enumerate(self.urls):
            proc, log = _start(tmp / f"replica{i}.log", [str(BIN / "rkrun"), "serve", str(model), "--port",
                                                         url.rsplit(":", 1)[1], "--device", "sim"])
            self.procs.append(proc)
            logs.append(log)
        for i, (proc, log) in enumerate(zip(self.procs, logs)):
            # the socket answers at once; the model (its host kernels compiled) is ready at the "ready" line
            _wait(f"replica {i}", lambda: " ready (" in log.read_text(), 300, proc, log)
            status, _, body = post_json(self.urls[i], "/v1/chat/completions",
                                        {"model": "model", "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 2})
            assert status == 200, body
        _wait("the router", lambda: _answers(self.url), 120, self.router, self.router_log)
        _wait("the router's probes", lambda: len(self.router_health().get("healthy_endpoints", ())) == REPLICAS,
              10 * PROBE_INTERVAL, self.router, self.router_log)
        cpu = [_cpu_seconds(p) for p in (self.router, *self.procs)]
        print(f"\nthree replicas and the router up in {time.monotonic() - t:.1f} s; CPU time: router {cpu[0]:.1f} s, "
              f"replicas {', '.join(f'{c:.1f}' for c in cpu[1:])} s")

    def client(self) -> openai.OpenAI:
        # max_retries=0: every answer is the router's doing, not the client's own retries
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0, timeout=60)

    def router_health(self) -> dict:
        with Http(self.url) as h:
            h.conn.request("GET", "/health", headers={"Authorization": f"Bearer {self.key}"})
            r = h.conn.getresponse()
            assert r.status == 200
            return json.loads(r.read())

    def stop(self) -> None:
        """The router first (it holds connections to the replicas), then the replicas, each told by SIGINT."""
        if self.router is not None and self.router.poll() is None:
            self.router.send_signal(signal.SIGINT)
            # its server stops at once; the process lingers ~10 s more (LiteLLM's exit): not waited for
            _stopped(self.router, lambda: "Finished server process" in self.router_log.read_text(), 30)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs:
            _stopped(p, lambda: False, 30)


def _stopped(proc: subprocess.Popen, done, timeout: float) -> None:
    """Wait until `proc` exits or done() (then SIGKILL what is left), SIGKILL at `timeout` s."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def cluster(request, tiny_chat_rkbin, tmp_path_factory):
    c = Cluster(scratch_dir(request, tmp_path_factory, "cluster"), tiny_chat_rkbin)
    yield c
    c.stop()


def _chat(client: openai.OpenAI, messages, max_tokens: int, session: str | None = None):
    """(the completion, the replica's api_base, the router's retries)."""
    headers = {"x-litellm-session-id": session} if session else None
    raw = client.chat.completions.with_raw_response.create(model="rkc", messages=messages, max_tokens=max_tokens,
                                                            temperature=0, extra_headers=headers)
    return (raw.parse(), raw.headers["x-litellm-model-api-base"].removesuffix("/v1"),
            int(raw.headers.get("x-litellm-attempted-retries", 0)))


def _conversation(client: openai.OpenAI, session: str | None, turns: int) -> tuple[list[str], list[int]]:
    """(the replica of each turn, each turn's cached prompt tokens)."""
    messages = [{"role": "system", "content": "the cat is a model"}]
    replicas, cached = [], []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"hello the world {turn}"})
        r, replica, _ = _chat(client, messages, 4, session)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
        replicas.append(replica)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return replicas, cached


def test_conversation_stays_on_one_replica(cluster):
    """Sent with a session id, every turn of a conversation reaches the replica of its first: the later turns
    find the earlier ones in its prefix cache. (Without one, the example's random routing spreads the turns:
    three conversations of three turns would all stay put by chance with probability (1/9)^3.)"""
    c = cluster.client()
    for n in range(REPLICAS):
        replicas, cached = _conversation(c, f"conversation-{n}", 3)
        print(f"conversation-{n}: replicas {[cluster.urls.index(u) for u in replicas]}, cached prompt tokens {cached}")
        assert len(set(replicas)) == 1, replicas
        assert all(t > 0 for t in cached[1:]), cached
    replicas, cached = _conversation(c, None, 6)
    print(f"no session id: replicas {[cluster.urls.index(u) for u in replicas]}, cached prompt tokens {cached}")


def test_streamed_chat_through_the_router(cluster):
    messages = [{"role": "user", "content": "hello the cat"}]
    plain = cluster.client().chat.completions.create(model="rkc", messages=messages, max_tokens=6, temperature=0)
    chunks = list(cluster.client().chat.completions.create(model="rkc", messages=messages, max_tokens=6,
                                                           temperature=0, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        plain.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_a_replica_killed_under_load_loses_no_request(cluster):
    """Six clients send 60 chats; replica 1 is SIGKILLed once 20 are answered. Every chat is answered (by the
    router's retry on another replica when its own died), the router's health check marks it down, and a
    conversation pinned to it goes on on the others."""
    clients, total, kill_after, max_tokens = 6, 60, 20, 8
    prompts = [f"the cat and the dog {i}" for i in range(total)]
    direct = {p: post_json(cluster.urls[0], "/v1/chat/completions",
                           {"model": "model", "messages": [{"role": "user", "content": p}], "max_tokens": 1})[2]
              ["usage"]["prompt_tokens"] for p in prompts[:3]}
    victim = cluster.procs[1]
    # a conversation pinned to the victim (a new session's first turn goes to a random replica: bounded tries)
    c = cluster.client()
    for n in range(40):
        pinned = {"session": f"victim-{n}", "messages": [{"role": "user", "content": "hello the world"}]}
        r, replica, _ = _chat(c, pinned["messages"], 2, pinned["session"])
        if replica == cluster.urls[1]:
            pinned["messages"].append({"role": "assistant", "content": r.choices[0].message.content})
            break
    else:
        pytest.fail("40 new sessions and none went to replica 1")
    answered, lock = [], threading.Lock()
    killed_at = []

    def one(prompt: str):
        try:
            r, replica, retries = _chat(cluster.client(), [{"role": "user", "content": prompt}], max_tokens)
        except Exception as exc:  # noqa: BLE001 (a lost request: counted, reported)
            return prompt, None, None, 0, repr(exc)
        with lock:
            answered.append(prompt)
            if len(answered) == kill_after:
                victim.send_signal(signal.SIGKILL)
                killed_at.append(len(answered))
        return prompt, r, replica, retries, None

    t = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, prompts))
    elapsed = time.monotonic() - t
    assert killed_at and victim.wait(timeout=10) == -signal.SIGKILL

    lost = [(p, err) for p, r, _, _, err in results if r is None]
    retried = sum(1 for *_, retries, _ in results if retries)
    served = Counter(cluster.urls.index(replica) for _, r, replica, _, _ in results if r is not None)
    print(f"\n{total} chats, {clients} clients, {elapsed:.1f} s; replica 1 killed after {kill_after} answers: "
          f"answered {total - len(lost)}, lost {len(lost)}, retried by the router {retried}; "
          f"answered a replica {dict(sorted(served.items()))}")
    assert not lost, lost[:3]
    for p, r, *_ in results:
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == max_tokens
        if p in direct:
            assert r.usage.prompt_tokens == direct[p]
    assert retried >= 1  # the dead replica was tried (in flight or next) and the router went elsewhere

    # the background probe (every PROBE_INTERVAL s) marks it down; the others stay up
    deadline = time.monotonic() + 10 * PROBE_INTERVAL
    while time.monotonic() < deadline:
        health = cluster.router_health()
        down = {e["api_base"].removesuffix("/v1") for e in health["unhealthy_endpoints"]}
        if down:
            break
        time.sleep(0.5)
    up = {e["api_base"].removesuffix("/v1") for e in health["healthy_endpoints"]}
    print(f"router /health: down {sorted(cluster.urls.index(u) for u in down)}, "
          f"up {sorted(cluster.urls.index(u) for u in up)}")
    assert down == {cluster.urls[1]} and up == {cluster.urls[0], cluster.urls[2]}

    # and the router sends nothing more there: the next chats are all answered by the others, without retries
    after = [_chat(cluster.client(), [{"role": "user", "content": p}], 2) for p in prompts[:6]]
    assert all(replica != cluster.urls[1] and retries == 0 for _, replica, retries in after)
    # the conversation pinned to the dead replica goes on elsewhere
    moved = []
    for turn in range(3):
        pinned["messages"].append({"role": "user", "content": f"one time in the world {turn}"})
        r, replica, retries = _chat(c, pinned["messages"], 2, pinned["session"])
        assert replica != cluster.urls[1] and r.usage.completion_tokens == 2
        moved.append(cluster.urls.index(replica))
        pinned["messages"].append({"role": "assistant", "content": r.choices[0].message.content})
    print(f"the conversation pinned to replica 1, its next turns: replicas {moved}")
