"""rkrun serve's HTTP API through the real `openai` client (and raw HTTP for
what the client hides): chat and completions, streamed and not, the prefix
cache across turns, many clients on one NPU, and bad requests."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from serve.conftest import Http, get_json, post_json

CHAT = [{"role": "system", "content": "the cat is a model"}, {"role": "user", "content": "hello the world"}]
PROMPTS = ["the cat and the dog", "hello world", "one time in the world", "it was the model"]


@pytest.fixture
def server(serve, tiny_model):
    tiny_model.forget()
    return serve(tiny_model)


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_chat_not_streamed(server, reference_model):
    r = client(server).chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=10, temperature=0)
    reference_model.forget()
    want = reference_model.chat(CHAT, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.model == "tiny-chat" and r.object == "chat.completion"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (want.prompt_tokens, 10)
    assert r.usage.total_tokens == want.prompt_tokens + 10


def test_chat_streamed(server):
    c = client(server)
    plain = c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=10, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10 and len({ch.id for ch in chunks}) == 1
    with Http(server.url) as h:
        raw = h.request("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "stream": True})
        assert raw.getheader("content-type").startswith("text/event-stream")
        events = [e for e in raw.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def test_completions_sampling_and_stop(server, reference_model):
    c = client(server)
    r = c.completions.create(model="tiny-chat", prompt="the cat", max_tokens=8, temperature=1.0, seed=11,
                             extra_body={"top_k": 20})  # top_k: not in the OpenAI API, as llama-server takes it
    reference_model.forget()
    want = reference_model.generate("the cat", max_tokens=8, temperature=1.0, seed=11, top_k=20)
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 8
    full = c.completions.create(model="tiny-chat", prompt="the dog", max_tokens=20, temperature=0).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    cut = c.completions.create(model="tiny-chat", prompt="the dog", max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny-chat", prompt="the dog", max_tokens=20, temperature=0, stop=stop, stream=True))
    assert streamed == cut.choices[0].text
    assert c.completions.create(prompt="the", model="tiny-chat").usage.completion_tokens == 16  # the default


def test_logprobs_chat_and_completions_streamed_and_not(server, reference_model):
    c = client(server)
    whole = c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=10, temperature=0,
                                      logprobs=True, top_logprobs=2)
    reference_model.forget()
    want = reference_model.chat(CHAT, max_tokens=10, temperature=0, logprobs=2).logprobs
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == len(want) == 10
    for got, p in zip(content, want):
        assert got.token == reference_model.tokenizer.token_piece(p.token)[0] and abs(got.logprob - p.logprob) < 1e-9
        assert got.bytes == reference_model.tokenizer.token_piece(p.token)[1]
        assert [t.logprob for t in got.top_logprobs] == [lp for _, lp in p.top] and len(p.top) == 2
    chunks = list(c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=10, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=2).choices[0].logprobs is None

    text = c.completions.create(model="tiny-chat", prompt="the dog", max_tokens=8, temperature=0, logprobs=3)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    assert all(len(top) <= 3 and max(top.values()) >= lp.token_logprobs[i] for i, top in enumerate(lp.top_logprobs))
    parts = [ch.choices[0].logprobs for ch in c.completions.create(
        model="tiny-chat", prompt="the dog", max_tokens=8, temperature=0, logprobs=3, stream=True)
        if ch.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset


def test_models_and_health(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny-chat"]
    health = get_json(server.url, "/health")
    assert health["status"] == "ok" and health["context_length"] == 256


def test_second_turn_prefills_only_its_new_tokens(server, tiny_model):
    c = client(server)
    first = c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=12, temperature=0)
    turn2 = [*CHAT, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "and the dog"}]
    before = get_json(server.url, "/health")["cache"]
    second = c.chat.completions.create(model="tiny-chat", messages=turn2, max_tokens=12, temperature=0)
    after = get_json(server.url, "/health")["cache"]
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert cached >= first.usage.prompt_tokens  # the whole first prompt (and what of the reply tokenizes alike)
    assert after["prefilled_tokens"] - before["prefilled_tokens"] == second.usage.prompt_tokens - cached
    assert after["cached_tokens"] - before["cached_tokens"] == cached
    print(f"\nturn 1: prompt {first.usage.prompt_tokens} tokens, all prefilled; turn 2: prompt "
          f"{second.usage.prompt_tokens} tokens, {cached} from the cache, "
          f"{second.usage.prompt_tokens - cached} prefilled")


def _stream_chat(url: str, prompt: str, max_tokens: int, log: list, lock: threading.Lock, t0: float,
                 drop_after: int | None = None) -> str:
    """One client: stream a chat reply; drop_after: disconnect after that many text chunks."""
    text, chunks = "", 0
    with lock:
        log.append((time.monotonic() - t0, prompt, "sends"))
    with Http(url, timeout=120) as http:
        r = http.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                          "max_tokens": max_tokens, "temperature": 0, "stream": True})
        assert r.status == 200
        with lock:
            log.append((time.monotonic() - t0, prompt, "accepted"))
        while line := r.readline().decode():
            line = line.strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                if chunks == 0:
                    with lock:
                        log.append((time.monotonic() - t0, prompt, "first token"))
                text += delta
                chunks += 1
                if drop_after is not None and chunks == drop_after:
                    with lock:
                        log.append((time.monotonic() - t0, prompt, f"disconnects after {chunks} chunks"))
                    return text  # leaving the with-block closes the connection
    with lock:
        log.append((time.monotonic() - t0, prompt, f"done, {chunks} chunks"))
    return text


def test_four_clients_one_disconnecting(server, reference_model):
    reference_model.forget()
    want = {p: reference_model.chat([{"role": "user", "content": p}], max_tokens=24, temperature=0).text
            for p in PROMPTS}
    assert len(set(want.values())) == len(PROMPTS)  # distinct answers: a leak would show
    log, lock, got, t0 = [], threading.Lock(), {}, time.monotonic()
    dropper = PROMPTS[1]

    def run(p: str) -> None:
        got[p] = _stream_chat(server.url, p, 200 if p == dropper else 24, log, lock, t0,
                              drop_after=3 if p == dropper else None)

    threads = []
    for p in PROMPTS:  # arrival order: one after another, a few ms apart
        threads.append(threading.Thread(target=run, args=(p,)))
        threads[-1].start()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for p in PROMPTS:
        if p != dropper:
            assert got[p] == want[p], p
    assert got[dropper] and want[dropper].startswith(got[dropper])
    for _ in range(200):  # the dropped job ends on its own
        queue = get_json(server.url, "/health")["queue"]
        jobs = queue["jobs"]
        if all(j["ended"] is not None for j in jobs):
            break
        time.sleep(0.05)
    jobs = sorted(jobs, key=lambda j: j["id"])
    # the timeline's origin is on this clock: the jobs were queued after the test's start, before now
    assert t0 <= queue["t0"] + jobs[0]["queued"] and queue["t0"] + jobs[-1]["ended"] <= time.monotonic()
    for j in jobs:  # the engine's time to the first piece lies inside the job's start -> first piece (1 us rounding)
        assert 0 < j["first_token_engine_s"] <= j["first_token"] - j["started"] + 2e-6
        stamps = [j[k] for k in ("received", "queued", "started", "encoded", "first_token", "first_written", "ended")
                  if j[k] is not None]
        assert stamps == sorted(stamps) and len(stamps) >= 6, j  # the request's steps in their order
    print("\nclient timeline (s since the first request):")
    for t, p, what in sorted(log):
        print(f"  {t:7.3f}  {p!r:26} {what}")
    print("server jobs (s since the server started):")
    for j in jobs:
        print(f"  job {j['id']}: queued {j['queued']:.3f} started {j['started']:.3f} first token "
              f"{j['first_token']:.3f} ended {j['ended']:.3f} {j['outcome']} after {j['tokens']} tokens")
    assert [j["outcome"] for j in jobs][1] == "cancelled"
    assert all(j["outcome"] in ("length", "stop") for k, j in enumerate(jobs) if k != 1)
    for a, b in zip(jobs, jobs[1:]):  # one at a time, in arrival order
        assert a["queued"] <= b["queued"] and a["ended"] <= b["started"]
    assert jobs[1]["tokens"] < 200  # stopped at the disconnect, not at max_tokens


def _jobs_when(url: str, done, tries: int = 3000) -> list[dict]:
    """/health's job records once done(jobs) holds (bounded: 30 s on a loaded machine)."""
    for _ in range(tries):
        jobs = sorted(get_json(url, "/health")["queue"]["jobs"], key=lambda j: j["id"])
        if done(jobs):
            return jobs
        time.sleep(0.01)
    raise AssertionError(f"the server's jobs never got there: {jobs}")


def test_non_streaming_client_disconnecting_is_cancelled(server, reference_model):
    """A client that closes its socket while its (non-streamed) reply is being
    generated: its job stops at the next token and the one queued behind it runs."""
    import socket
    from urllib.parse import urlsplit

    long_chat = [{"role": "user", "content": PROMPTS[1]}]
    reference_model.forget()
    assert reference_model.chat(long_chat, max_tokens=200, temperature=0).finish_reason == "length"  # runs on
    want = reference_model.chat([{"role": "user", "content": PROMPTS[2]}], max_tokens=6, temperature=0).text
    u = urlsplit(server.url)
    body = json.dumps({"messages": long_chat, "max_tokens": 200, "temperature": 0}).encode()
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    _jobs_when(server.url, lambda jobs: jobs and jobs[-1]["first_token"] is not None)  # it is generating
    queued: dict = {}
    behind = threading.Thread(target=lambda: queued.update(r=post_json(server.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 6, "temperature": 0})))
    behind.start()
    _jobs_when(server.url, lambda jobs: len(jobs) == 2)
    sock.close()  # gone without reading a byte of the answer
    behind.join(timeout=120)
    assert not behind.is_alive()
    status, _, reply = queued["r"]
    assert status == 200 and reply["choices"][0]["message"]["content"] == want
    gone, second = _jobs_when(server.url, lambda jobs: all(j["ended"] is not None for j in jobs))
    assert gone["outcome"] == "cancelled" and 0 < gone["tokens"] < 200
    assert second["outcome"] == "length" and second["started"] >= gone["ended"]
    assert get_json(server.url, "/health")["cache"]["cancelled"] >= 1


def test_full_queue_answers_503_with_retry_after(serve, tiny_model):
    server = serve(tiny_model, queue_size=1)
    body = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 200, "temperature": 0,
            "stream": True}
    with Http(server.url) as first:
        first.request("POST", "/v1/chat/completions", body).readline()  # the first job is running
        waiting = threading.Thread(target=post_json, args=(server.url, "/v1/chat/completions",
                                                           {**body, "stream": False, "max_tokens": 2}))
        waiting.start()
        for _ in range(200):
            if server.worker.waiting() == 1:
                break
            time.sleep(0.01)
        status, headers, error = post_json(server.url, "/v1/chat/completions", body)
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert error["error"]["code"] == "queue_full"
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    assert get_json(server.url, "/health")["queue"]["rejected"] == 1


LONG = "the " * 300
BAD = {"/v1/chat/completions": [  # (raw body, status, param)
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"messages": "hello"}', 400, "messages"),
    (b'{"messages": []}', 400, "messages"),
    (b'{"messages": [{"role": "user"}]}', 400, "messages[0].content"),
    (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}', 400, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}', 400, "stop"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400, "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0, "max_completion_tokens": 1}', 400,
     "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "seed": -4}', 400, "seed"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', 400, "top_logprobs"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}', 400, "top_logprobs"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 3}', 400, "logprobs"),
    (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, "messages[0].content"),
    (json.dumps({"messages": [{"role": "user", "content": LONG}]}).encode(), 400, "messages"),
    (b"[" * 100000 + b"]" * 100000, 400, None),
    (b"x" * (1 << 21), 413, None),
], "/v1/completions": [
    (b"{not json", 400, None),
    (b'{"max_tokens": 4}', 400, "prompt"),
    (b'{"prompt": 7}', 400, "prompt"),
    (b'{"prompt": ["a", "b"]}', 400, "prompt"),
    (b'{"prompt": [1, 2, 3]}', 400, "prompt"),
    (b'{"prompt": "the", "max_tokens": 0}', 400, "max_tokens"),
    (b'{"prompt": "the", "top_k": 1.5}', 400, "top_k"),
    (b'{"prompt": "the", "logprobs": 21}', 400, "logprobs"),
    (b'{"prompt": "the", "logprobs": true}', 400, "logprobs"),
    (b'{"prompt": "the", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop"),
    (b'{"prompt": "the", "model": "llama"}', 404, "model"),
    (b'{"prompt": "the", "stream_options": {"include_usage": []}}', 400, "stream_options.include_usage"),
    (b'{"prompt": "\\udfff"}', 400, "prompt"),
    (json.dumps({"prompt": LONG}).encode(), 400, "prompt"),
]}


@pytest.mark.parametrize("path,raw,status,param", [(path, *case) for path, cases in BAD.items() for case in cases],
                         ids=[f"{path.rsplit('/', 1)[1]}-{i}" for path, cases in BAD.items() for i in range(len(cases))])
def test_bad_requests_get_openai_errors(server, path, raw, status, param):
    got, _, body = post_json(server.url, path, raw)
    assert got == status, body
    error = body["error"]
    assert error["message"] and error["type"] == "invalid_request_error" and error["param"] == param
    ok, _, _ = post_json(server.url, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "the"}], "max_tokens": 2})
    assert ok == 200  # still serving


def test_bad_requests_through_the_client(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": LONG}])
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=CHAT)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny-chat", prompt="the", max_tokens=0)
    with Http(server.url) as h:
        assert h.json("GET", "/v1/nothing")[0] == 404
        assert h.json("GET", "/v1/chat/completions")[0] == 405


def test_a_client_leaving_the_queue_is_skipped(serve, tiny_model):
    server = serve(tiny_model)
    body = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 200, "temperature": 0,
            "stream": True}
    with Http(server.url) as first:
        first.request("POST", "/v1/chat/completions", body).readline()  # running
        for stream in (True, False):
            with Http(server.url) as second:
                second.conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": stream}),
                                    {"Content-Type": "application/json"})
                for _ in range(3000):  # bounded: 30 s on a loaded machine; ends as soon as it is queued
                    if server.worker.waiting() == 1:
                        break
                    time.sleep(0.01)
                assert server.worker.waiting() == 1
            # the second client has gone while waiting: wait (bounded) for the server to notice
            # before the first one leaves, or the job could start first and end "cancelled"
            for _ in range(3000):
                if server.worker.waiting() == 0:
                    break
                time.sleep(0.01)
            assert server.worker.waiting() == 0
        # the first client goes too
    for _ in range(400):
        jobs = get_json(server.url, "/health")["queue"]["jobs"]
        if all(j["ended"] is not None for j in jobs):
            break
        time.sleep(0.05)
    assert [j["outcome"] for j in jobs] == ["cancelled", "skipped", "skipped"]
    assert jobs[0]["tokens"] < 200
