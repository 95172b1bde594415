"""rkrun serve when things go wrong inside (the simulator, real numbers): a
device error in the middle of a job (injected through runtime/faults.py's
FaultyDevice, RKC_TEST_DEVICE_FAULTS) fails that request with a 500 or an SSE
error event, drops its KV slot, and the next request runs and answers as a
fresh model would; a client that disconnects frees the NPU at once; and under
concurrency no request's tokens reach another's (KV and prefix-cache
isolation: each conversation's answers equal those of a model that served it
alone)."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from serve.conftest import Http, post_json
from serve.test_openai_api import _jobs_when

LONG = [{"role": "user", "content": "hello world"}]  # the tiny model runs on to max_tokens (test_openai_api)


@pytest.fixture(scope="module")
def faulty_model(tiny_chat_rkbin):
    """The tiny chat model on the simulator behind a FaultyDevice (disarmed until a test arms it)."""
    import rkc
    from rkc.runtime.faults import ENV, FaultyDevice

    os.environ[ENV] = "1"
    try:
        model = rkc.load(tiny_chat_rkbin, device="sim")
    finally:
        del os.environ[ENV]
    assert isinstance(model.engine.device, FaultyDevice)
    with model:
        yield model


@pytest.fixture
def server(serve, faulty_model):
    faulty_model.forget()
    return serve(faulty_model)


def _events(response) -> list:
    return [json.loads(line[6:]) for line in response.read().decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def _fresh(model, messages, max_tokens: int) -> str:
    model.forget()
    return model.chat(messages, max_tokens=max_tokens, temperature=0).text


def test_device_error_mid_stream(server, faulty_model, reference_model):
    device, stats = faulty_model.engine.device, faulty_model.stats
    failed0, faults0 = stats.failed, device.failed
    with Http(server.url) as h:
        r = h.request("POST", "/v1/chat/completions", {"messages": LONG, "max_tokens": 200, "temperature": 0,
                                                       "stream": True})
        assert r.status == 200
        first = r.readline()  # the first piece is out: the job is generating
        assert first.startswith(b"data: ")
        device.arm(1)  # the next NPU submission fails
        events = _events(r)
    error = events[-1]["error"]
    assert error["code"] == "device_error" and error["type"] == "server_error"
    assert error["message"].startswith("the device failed during this request: job ")
    assert "injected device fault" in error["message"] and "\n" not in error["message"]
    assert device.failed == faults0 + 1 and stats.failed == failed0 + 1
    (job,) = _jobs_when(server.url, lambda jobs: jobs and jobs[-1]["ended"] is not None)
    assert job["outcome"] == "failed" and server.worker.waiting() == 0
    # the next request runs; the failed job's slot was dropped: nothing of it is reused, and the answer is a
    # fresh model's
    status, _, reply = post_json(server.url, "/v1/chat/completions", {"messages": LONG, "max_tokens": 12,
                                                                      "temperature": 0})
    assert status == 200
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert reply["choices"][0]["message"]["content"] == _fresh(reference_model, LONG, 12)
    print(f"\nmid-stream device error -> SSE error event: {error['message']}")


def test_device_error_in_prefill_is_a_500(server, faulty_model, reference_model):
    chat = [{"role": "user", "content": "the cat and the dog"}]
    faulty_model.engine.device.arm(1)
    status, _, body = post_json(server.url, "/v1/chat/completions", {"messages": chat, "max_tokens": 6})
    assert status == 500 and body["error"]["code"] == "device_error", body
    for stream in (False, True):  # the server goes on, streamed or not
        with Http(server.url) as h:
            r = h.request("POST", "/v1/chat/completions", {"messages": chat, "max_tokens": 6, "temperature": 0,
                                                           "stream": stream})
            assert r.status == 200
            text = (json.loads(r.read())["choices"][0]["message"]["content"] if not stream else
                    "".join(e["choices"][0]["delta"].get("content") or "" for e in _events(r) if e["choices"]))
        assert text == _fresh(reference_model, chat, 6)


def test_repeated_faults_leak_no_slot(server, faulty_model, reference_model):
    """Ten requests each failed at a different submission (prefill, decode): every one answered 500 or an error
    event, the queue empty after each, and then a request answers as a fresh model would."""
    chat = [{"role": "user", "content": "one time in the world"}]
    device = faulty_model.engine.device
    n0 = device.submits
    post_json(server.url, "/v1/chat/completions", {"messages": chat, "max_tokens": 10, "temperature": 0})
    per_request = device.submits - n0
    outcomes = []
    for k in range(1, 11):
        if k % 2:  # half from an empty cache, half reusing the previous request's prefix
            faulty_model.forget()
        device.arm(1 + (k * per_request) // 11)
        with Http(server.url) as h:
            r = h.request("POST", "/v1/chat/completions", {"messages": chat, "max_tokens": 10, "temperature": 0,
                                                           "stream": True})
            if r.status == 200:
                events = _events(r)
                outcomes.append("event" if events and "error" in events[-1] else "done")
            else:
                outcomes.append(f"{r.status} {json.loads(r.read())['error']['code']}")
        assert server.worker.waiting() == 0
    assert all(o in ("event", "500 device_error") for o in outcomes), outcomes
    device.arm(10 ** 9)  # disarmed
    status, _, reply = post_json(server.url, "/v1/chat/completions", {"messages": chat, "max_tokens": 10,
                                                                      "temperature": 0})
    assert status == 200 and reply["choices"][0]["message"]["content"] == _fresh(reference_model, chat, 10)
    print(f"\n10 injected faults ({per_request} submissions a request): {outcomes}")


def test_disconnect_frees_the_npu_at_once(server):
    with Http(server.url) as h:
        r = h.request("POST", "/v1/chat/completions", {"messages": LONG, "max_tokens": 200, "temperature": 0,
                                                       "stream": True})
        r.readline()
        r.readline()
        t = time.monotonic()
    (job,) = _jobs_when(server.url, lambda jobs: jobs and jobs[-1]["ended"] is not None)
    freed = time.monotonic() - t
    assert job["outcome"] == "cancelled" and job["tokens"] < 200
    assert freed < 2.0  # a token or two on the simulator, and the poll
    status, _, _ = post_json(server.url, "/v1/completions", {"prompt": "the", "max_tokens": 2})
    assert status == 200
    print(f"\ndisconnect -> job ended after {job['tokens']} tokens, seen {freed * 1e3:.0f} ms after the close")


CONVERSATIONS = [f"you are model number {i}; the {w} runs" for i, w in enumerate(["cat", "dog", "world", "time"])]
# best two logits this close are a near-tie: where the prompt was split between a cached prefix and a new
# chunk moves float32 sums by a rounding, which may flip it (the tiny random model's fp16 logits tie exactly)
TIE = 1e-2


def _greedy_up_to_a_tie(model, messages: list, served: str, n: int) -> bool:
    """Whether `served` is `model`'s greedy answer to `messages` served alone, or follows it until a
    step whose best two logits lie within TIE and goes its own way from there (a tie flipped)."""
    from rkc.runtime.llm.generate import Generator

    model.forget()
    if served == model.chat(messages, max_tokens=n, temperature=0).text:
        return True
    gaps: list[float] = []

    def pick(logits: np.ndarray) -> int:
        best, second = np.argsort(-np.asarray(logits, np.float64))[:2]
        gaps.append(float(logits[best] - logits[second]))
        return int(best)

    tokens = list(Generator(model.engine).generate(model.encode_chat(messages), n, pick))
    decode = model.engine.tokenizer.decode
    for k in range(1, len(tokens) + 1):
        if not served.startswith(decode(tokens[:k])):  # token k - 1 is where `served` left the greedy path
            return gaps[k - 1] <= TIE
    return False


def test_no_tokens_cross_requests_under_concurrency(serve, faulty_model, reference_model):
    """Four two-turn conversations at once through a server whose prefix cache has 2 slots (evictions, shared
    template prefixes): each answer is that of a model serving the conversation alone, up to a near-tie
    (`_greedy_up_to_a_tie`); another conversation's tokens would not be."""
    faulty_model.forget()
    server = serve(faulty_model)
    turn2 = {"role": "user", "content": "and then?"}
    alone = {s: _fresh(reference_model, [{"role": "system", "content": s}, {"role": "user", "content": "hello"}], 8)
             for s in CONVERSATIONS}
    assert len(set(alone.values())) > 1  # different answers: a leak would show
    got: dict = {}

    def converse(system: str) -> None:
        first = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
        _, _, r1 = post_json(server.url, "/v1/chat/completions", {"messages": first, "max_tokens": 8,
                                                                  "temperature": 0})
        a = r1["choices"][0]["message"]["content"]
        _, _, r2 = post_json(server.url, "/v1/chat/completions", {
            "messages": [*first, {"role": "assistant", "content": a}, turn2], "max_tokens": 8, "temperature": 0})
        got[system] = (a, r2["choices"][0]["message"]["content"])

    threads = [threading.Thread(target=converse, args=(s,)) for s in CONVERSATIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(got) == sorted(CONVERSATIONS)
    for system, (a, b) in got.items():
        first = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
        assert _greedy_up_to_a_tie(reference_model, first, a, 8), (system, a, alone[system])
        # the second turn as the served conversation had it (its own first answer)
        assert _greedy_up_to_a_tie(reference_model, [*first, {"role": "assistant", "content": a}, turn2], b, 8), \
            (system, b)
