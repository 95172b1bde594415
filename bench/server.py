"""rkrun serve benchmark, on the tiny synthetic chat model (tests/llm/synth.py:
qwen3 shapes, the ChatML template, a context of 1024, compiled fp16 with rkc
compile's default prefill chunks, or --chunks) served by a real `rkrun serve`
process on 127.0.0.1, streamed by a plain HTTP client:

* server overhead per streamed token: the same request (same cache history)
  through the server and through the Python API in this process
  (rkc.load(...).chat(..., stream=True): the engine's own loop of prefill,
  decode, sampling, detokenizing), the difference over the tokens. What is
  left is the server's: HTTP, JSON, the queue and thread hand-off, SSE.
  Measured twice: in CPU time (the server process's, from /proc, against this
  process's for the API call), which the other jobs of a shared machine hardly
  move, and in wall time (the client's, request to `data: [DONE]`; fastest
  run), which they do; on this 2-core machine shared by other jobs both are
  noise of a few ms around an engine time of ~45 ms per token. So, third, the
  server's own CPU time per streamed piece, timed in the threads where it is
  spent (the server's /health job record: the hand-off from the NPU thread,
  the SSE write through uvicorn to the socket; the per-token path, without
  the thread switches and the request's fixed costs).
  Target <= 1 ms. (Also shown: the engine's time inside its program steps.)
* time to first token of a chat's second turn (its history in the prefix
  cache) against the first turn's, same conversation, for a short and a long
  first turn (a system prompt of ~170 and ~900 tokens). Target <= 20 %. Seen
  by the client (request to the first text chunk) and by the server (its job
  record: queued to the first piece, without HTTP and the client's and the
  event loop's scheduling), and in CPU time of the server's NPU thread from
  the job's start to its first piece: what the other jobs of a shared machine
  hardly move (on the null device the whole of the host's work; on the
  simulator the simulator's too; BLAS helper threads not counted). Beside
  each ratio, its floor: the second turn's prefilled tokens against the first
  turn's (the work a cached turn cannot skip: the ratio if time were exactly
  linear in the prefilled tokens), and the cost per request that tokens do
  not explain: F of the fit T = F + c x tokens through the two turns (per
  rep, then the median). Where the server's time goes: the engine's program
  runs up to the first piece (prefill, and a decode if the first token makes
  no text yet) and the rest (the wait in the queue, chat template,
  tokenizing, the cache's pick, sampling, detokenizing); and the client's time outside the server: request
  to queued (connect, HTTP, parsing), first piece to the client (the
  hand-off, SSE, the event loop), on one clock (CLOCK_MONOTONIC, the
  server's /health gives its timeline's origin). Each turn's time to first
  token is printed cut at those stamps (`TIMELINE`). The chats' requests
  each open a new connection (http.client's way), or with --keep-alive share
  one kept-alive connection, as the openai client (httpx's pool) and a
  browser's fetch do: no TCP connect and no new uvicorn connection per
  request; the conversations and their order are the same either way.

Prints a table, and with --json one object.

    PYTHONPATH=$PWD python bench/server.py [--device sim] [--reps 5] [--tokens 32] [--chunks 1,32,128,512]
        [--keep-alive] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf
from rkc.ir.rkbin import read_rkbin

ROOT = Path(__file__).resolve().parents[1]
CLAUSE = "the cat and the dog run in the world at one time; "
SYSTEMS = {"short": "You are a small model on a board. " + CLAUSE * 4, "long": "You are a model. " + CLAUSE * 24}
TARGET_OVERHEAD_MS, TARGET_TTFT = 1.0, 0.20


def tiny_chat_model(workdir: Path, chunks: tuple[int, ...] | None) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("synth", ROOT / "tests/llm/synth.py")
    synth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synth)
    CHATML, write_model = synth.CHATML, synth.write_model

    out = workdir / "tiny-chat.rkbin"
    compile_gguf(write_model(workdir / "tiny-chat.gguf", "qwen3", chat_template=CHATML, context_length=1024), out,
                 LlmCompileOptions("fp16", prefill_chunks=chunks))
    return out


def stream_chat(port: int, messages: list[dict], max_tokens: int,
                conn: http.client.HTTPConnection | None = None) -> dict:
    """Wall time to the first text chunk and to [DONE]; the reply; chunks.
    conn: a kept-alive connection to send it on; None: a new connection for
    this request, closed after it."""
    keep = conn is not None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0, sent = time.perf_counter(), time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    first, first_at, text, usage, pieces = None, None, "", None, 0
    while line := r.readline():
        line = line.decode().strip()
        if line == "data: [DONE]":
            break
        if line.startswith("data: "):
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for c in event["choices"]:
                if c["delta"].get("content"):
                    if first is None:
                        first, first_at = time.perf_counter() - t0, time.monotonic()
                    text += c["delta"]["content"]
                    pieces += 1
    r.read()  # the stream's last chunk: the connection is ready for its next request
    total = time.perf_counter() - t0
    if not keep:
        conn.close()
    return {"ttft_s": first, "total_s": total, "text": text, "usage": usage, "pieces": pieces, "sent": sent,
            "first_at": first_at}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def last_jobs(port: int, n: int = 1) -> tuple[list[dict], float]:
    """The server's records of its latest n jobs, oldest first, and their
    timeline's origin on CLOCK_MONOTONIC."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/health")
    queue = json.loads(conn.getresponse().read())["queue"]
    conn.close()
    return queue["jobs"][-n:], queue["t0"]


def fixed_cost(t1: float, t2: float, n1: int, n2: int) -> float:
    """F of T = F + c x n through (n1, t1) and (n2, t2): the cost per request
    that the prefilled tokens do not explain."""
    return (t2 * n1 - t1 * n2) / (n1 - n2)


# A turn's time to first token, cut at the stamps of the client and the server's job record (one clock):
# (figure, its description)
TIMELINE = [("http_in", "client sends -> handler (connect, HTTP parse, route)"),
            ("parse", "handler -> queued (body, JSON, schema)"),
            ("queue", "queued -> the NPU thread starts it"),
            ("encode", "chat template, tokenizing, checks"),
            ("engine", "engine program runs (prefill)"),
            ("rest", "cache pick, sampling, detokenizing, waits"),
            ("hand_off", "first piece: NPU thread -> event loop -> socket"),
            ("http_out", "socket -> client (SSE read, JSON)")]


def turn_figures(r: dict, job: dict, t0: float) -> dict:
    """One chat turn's times (s) as the client, the server and its NPU thread saw them."""
    u = r["usage"]
    at = {k: t0 + job[k] for k in ("received", "queued", "started", "encoded", "first_token", "first_written")}
    return {"client": r["ttft_s"], "server": job["first_token"] - job["queued"], "npu_cpu": job["first_token_cpu_s"],
            "engine": job["first_token_engine_s"], "queue": at["started"] - at["queued"],
            "http_in": at["received"] - r["sent"], "parse": at["queued"] - at["received"],
            "encode": at["encoded"] - at["started"],
            "rest": at["first_token"] - at["encoded"] - job["first_token_engine_s"],
            "hand_off": at["first_written"] - at["first_token"], "http_out": r["first_at"] - at["first_written"],
            "prompt": u["prompt_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"],
            "prefilled": u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]}


def chat_figures(turns: list[tuple[dict, dict]]) -> dict:
    """Medians over the reps of each turn's figures, the ratios, their floor
    and the unexplained cost per request."""
    med = statistics.median
    out = {}
    for i, name in enumerate(("first_turn", "second_turn")):
        out[name] = {k: med(t[i][k] for t in turns) * (1 if k in ("prompt", "cached", "prefilled") else 1e3)
                     for k in turns[0][i]}
    out["floor"] = med(b["prefilled"] / a["prefilled"] for a, b in turns)
    for k in ("client", "server", "npu_cpu"):
        out[f"{k}_ratio"] = med(b[k] / a[k] for a, b in turns)
        out[f"{k}_fixed_ms"] = med(fixed_cost(a[k], b[k], a["prefilled"], b["prefilled"]) for a, b in turns) * 1e3
    return out


def start_server(model: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """`rkrun serve MODEL --port 0 ARGS` in a subprocess, once its model is loaded: (the process, its port). The
    socket answers at once (/health 503 "loading"); the model is ready at its second line."""
    p = subprocess.Popen([str(Path(sys.executable).parent / "rkrun"), "serve", str(model), "--port", "0", *args],
                         stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    if "http://127.0.0.1:" not in line:
        p.kill()
        raise SystemExit(f"rkrun serve did not start: {line.strip()}")
    while " ready (" not in (ready := p.stderr.readline()):
        if not ready:
            raise SystemExit(f"rkrun serve ended before its model was ready: {line.strip()}")
    return p, int(line.split("http://127.0.0.1:")[1].split("/")[0])


def bench(model: Path, device: str, reps: int, tokens: int, keep_alive: bool = False) -> dict:
    import rkc

    direct = rkc.load(model, device=device)
    p, port = start_server(model, "--device", device)
    try:
        # one chat each first: the first call of a process loads the compiled kernels (numba's cache)
        warm = [{"role": "user", "content": "warm up"}]
        direct.chat(warm, max_tokens=4, temperature=0)
        # the two-turn chats' connection: one kept alive for them all, or a new one per request (None)
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=300) if keep_alive else None
        stream_chat(port, warm, 4, kept)
        overhead, cpu_overhead, steps, per_token = [], [], [], []
        chats = {k: [] for k in SYSTEMS}  # per rep: (first turn, second turn) figures
        stream = []
        for rep in range(reps):
            # the token stream: the server against the Python API, same request, same cache history
            messages = [{"role": "user", "content": f"rep {rep}: the cat and"}]
            t, c = time.perf_counter(), time.process_time()
            want = direct.chat(messages, max_tokens=tokens, temperature=0, stream=True)
            for _ in want:
                pass
            direct_s, direct_cpu = time.perf_counter() - t, time.process_time() - c
            c = cpu_seconds(p.pid)
            r = stream_chat(port, messages, tokens)
            server_cpu = cpu_seconds(p.pid) - c
            assert r["text"] == want.result.text
            n = r["usage"]["completion_tokens"]
            overhead.append((r["total_s"] - direct_s) / n)
            cpu_overhead.append((server_cpu - direct_cpu) / n)
            per_token.append(direct_s / n)
            (job,), _ = last_jobs(port)
            steps.append(job["engine_s"] / n)
            stream.append(job["stream_s"] / r["pieces"])
            # two-turn chats: time to first token with and without the history cached. The direct model replays
            # them once the rep's chats are done (its cache following the server's), not between them: after a
            # burst of CPU in this process a loaded machine's scheduler ran it late for its next request, 2-10
            # ms counted as the server's, and only in the turns that came after one.
            replay = []
            for kind, system in SYSTEMS.items():
                first = [{"role": "system", "content": f"{rep}. {system}"}, {"role": "user", "content": "hello"}]
                a = stream_chat(port, first, 8, kept)
                second = first + [{"role": "assistant", "content": a["text"]},
                                  {"role": "user", "content": "and the dog?"}]
                b = stream_chat(port, second, 8, kept)
                (ja, jb), t0 = last_jobs(port, 2)
                replay += [first, second]
                chats[kind].append((turn_figures(a, ja, t0), turn_figures(b, jb, t0)))
            for chat in replay:
                direct.chat(chat, max_tokens=8, temperature=0)
        if kept:
            kept.close()
    finally:
        p.terminate()
        p.wait(timeout=30)
        p.stderr.close()
        direct.close()
    med = statistics.median
    return {"device": device, "reps": reps, "tokens": tokens, "keep_alive": keep_alive,
            "api_ms_per_token": med(per_token) * 1e3, "engine_steps_ms_per_token": med(steps) * 1e3,
            "overhead_cpu_ms_per_token": med(cpu_overhead) * 1e3, "stream_ms_per_piece": med(stream) * 1e3,
            "overhead_wall_ms_per_token": min(overhead) * 1e3,
            "ttft": {k: chat_figures(turns) for k, turns in chats.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="sim")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--chunks", help="prefill chunk sizes, e.g. 1,32,128,512 (default: rkc compile's)")
    ap.add_argument("--keep-alive", action="store_true",
                    help="send the two-turn chats on one kept-alive connection, as the openai client's httpx pool "
                         "and a browser do (default: a new connection per request)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        chunks = tuple(int(c) for c in args.chunks.split(",")) if args.chunks else None  # None: the compiler's
        model = tiny_chat_model(Path(d), chunks)
        row = bench(model, args.device, args.reps, args.tokens, args.keep_alive)
        row["chunks"] = read_rkbin(model).module.metadata["prefill_chunks"]  # the chunks compiled
    if args.json:
        print(json.dumps(row, indent=1))
    else:
        print_table(row)


def print_table(row: dict) -> None:
    print(f"rkrun serve, tiny chat model, prefill chunks {','.join(map(str, row['chunks']))}, "
          f"--device {row['device']}, medians of {row['reps']} runs, the chats "
          f"{'on one kept-alive connection' if row['keep_alive'] else 'a new connection per request'}")
    print(f"{'figure':52} {'value':>12} {'target':>9}")
    print(f"{'Python API time per streamed token (the reference)':52} {row['api_ms_per_token']:9.2f} ms")
    print(f"{'  of which in the engine program steps':52} {row['engine_steps_ms_per_token']:9.2f} ms")
    print(f"{'server overhead per streamed token, CPU time':52} {row['overhead_cpu_ms_per_token']:9.2f} ms "
          f"{'<= 1 ms':>9}")
    print(f"{'server overhead per streamed token, wall (fastest)':52} {row['overhead_wall_ms_per_token']:9.2f} ms "
          f"{'<= 1 ms':>9}")
    print(f"{'server CPU time per streamed piece, in its threads':52} {row['stream_ms_per_piece']:9.3f} ms "
          f"{'<= 1 ms':>9}")
    for kind, t in row["ttft"].items():
        a, b = t["first_turn"], t["second_turn"]
        print(f"{f'{kind} chat: time to first token, first turn':52} {a['client']:9.1f} ms"
              f"   ({a['prompt']:.0f} prompt tokens, {a['prefilled']:.0f} prefilled)")
        print(f"{f'{kind} chat: time to first token, second turn':52} {b['client']:9.1f} ms"
              f"   ({b['cached']:.0f} of {b['prompt']:.0f} from the cache, {b['prefilled']:.0f} prefilled)")
        for key, seen in (("client", "client"), ("server", "in the server"), ("npu_cpu", "NPU thread CPU time")):
            print(f"{f'{kind} chat: second / first, {seen}':52} {t[key + '_ratio'] * 100:10.1f} % {'<= 20 %':>9}"
                  f"   ({a[key]:.1f}, {b[key]:.1f} ms; floor {t['floor'] * 100:.1f} %, "
                  f"not explained by tokens {t[key + '_fixed_ms']:.1f} ms)")
        print(f"{f'{kind} chat, time to first token (ms, medians)':52} {'first':>9} {'second':>9}")
        for key, what in TIMELINE:
            print(f"{'  ' + what:52} {a[key]:9.2f} {b[key]:9.2f}")


if __name__ == "__main__":
    main()
