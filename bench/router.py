"""What the router of several boards costs (docs/api.md, "Several boards"):
three `rkrun serve` processes (the tiny synthetic chat model, null device)
behind LiteLLM's proxy run with examples/cluster/litellm.yaml (its board
addresses pointed at the replicas' loopback ports, its background probes
off: a probe cycle is three one-token chats every 15 s), chats sent one after the
other by the openai client, alternately through the router and straight to a
replica:

* CPU time a chat of the router process against the replicas' (from /proc:
  what the other jobs of a shared machine hardly move), not streamed and
  streamed;
* the client's wall time a chat, median, through the router against straight
  to a replica (noise of the machine's load; the ratio is of one run);
* the router's start: CPU time to its first answer.

Prints a table, and with --json one object.

    PYTHONPATH=$PWD python bench/router.py [--chats 50] [--tokens 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import tiny_chat_model  # noqa: E402  (bench/server.py's model: the same tiny chat)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
REPLICAS = 3
MESSAGES = [{"role": "user", "content": "the cat and the dog run in the world"}]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args[0]} exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{url}: no answer in {timeout} s")


def chat(client: openai.OpenAI, model: str, tokens: int, stream: bool) -> float:
    t = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=tokens, temperature=0,
                                       stream=stream)
    if stream:
        for _ in r:
            pass
    return time.perf_counter() - t


def bench(work: Path, chats: int, tokens: int) -> dict:
    model = work / "model.rkbin"  # the served id the example config names (openai/model)
    tiny_chat_model(work, (1, 4, 16)).rename(model)
    replica_urls = [f"http://127.0.0.1:{free_port()}" for _ in range(REPLICAS)]
    config = yaml.safe_load((ROOT / "examples/cluster/litellm.yaml").read_text())
    for board, url in zip(config["model_list"], replica_urls):
        board["litellm_params"]["api_base"] = url + "/v1"
    config["general_settings"]["background_health_checks"] = False  # its probes' CPU would land in a chat's
    (work / "litellm.yaml").write_text(yaml.safe_dump(config))
    key, router_url = "sk-" + secrets.token_hex(16), f"http://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([str(BIN / "rkrun"), "serve", str(model), "--port", url.rsplit(":", 1)[1],
                               "--device", "null"], stderr=subprocess.DEVNULL) for url in replica_urls]
    router = subprocess.Popen([str(BIN / "litellm"), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
                               "--port", router_url.rsplit(":", 1)[1]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True"))
    try:
        for url, p in zip(replica_urls, procs):
            wait_http(url + "/health", p)
        wait_http(router_url + "/health/readiness", router)
        start_cpu = cpu_seconds(router.pid)
        via = openai.OpenAI(base_url=router_url + "/v1", api_key=key, max_retries=0, timeout=120)
        direct = [openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=120)
                  for u in replica_urls]
        for c, name in [(via, "rkc"), *((d, "model") for d in direct)]:  # warm: kernels, connections
            chat(c, name, tokens, False)
        row: dict = {"chats": chats, "tokens": tokens, "router_start_cpu_s": start_cpu}
        for stream in (False, True):
            kind = "streamed" if stream else "whole"
            router_cpu = replicas_cpu = 0.0
            wall = {"router": [], "direct": []}
            for i in range(chats):
                r0, s0 = cpu_seconds(router.pid), sum(cpu_seconds(p.pid) for p in procs)
                wall["router"].append(chat(via, "rkc", tokens, stream))
                router_cpu += cpu_seconds(router.pid) - r0
                replicas_cpu += sum(cpu_seconds(p.pid) for p in procs) - s0
                wall["direct"].append(chat(direct[i % REPLICAS], "model", tokens, stream))
            router_ms, direct_ms = (statistics.median(wall[k]) * 1e3 for k in ("router", "direct"))
            row[kind] = {"router_cpu_ms": router_cpu / chats * 1e3, "replica_cpu_ms": replicas_cpu / chats * 1e3,
                         "wall_router_ms": router_ms, "wall_direct_ms": direct_ms,
                         "wall_ratio": router_ms / direct_ms}
        row["load_average"] = os.getloadavg()[0]
        return row
    finally:
        for p in [router, *procs]:
            p.send_signal(signal.SIGINT)
        for p in [router, *procs]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chats", type=int, default=50, help="chats of each kind through the router (and as many direct)")
    ap.add_argument("--tokens", type=int, default=8, help="max_tokens a chat")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        row = bench(Path(work), args.chats, args.tokens)
    if args.json:
        print(json.dumps(row, indent=1))
        return
    print(f"router start: {row['router_start_cpu_s']:.1f} s CPU; {row['chats']} chats of {row['tokens']} tokens "
          f"a kind, load {row['load_average']:.1f}")
    print("| chat | router CPU a chat | answering replica's CPU | wall via router | wall direct | ratio |")
    print("|---|---|---|---|---|---|")
    for kind in ("whole", "streamed"):
        f = row[kind]
        print(f"| {kind} | {f['router_cpu_ms']:.1f} ms | {f['replica_cpu_ms']:.1f} ms | {f['wall_router_ms']:.1f} ms "
              f"| {f['wall_direct_ms']:.1f} ms | {f['wall_ratio']:.2f} |")


if __name__ == "__main__":
    main()
