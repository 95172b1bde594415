"""/metrics (Prometheus text, parsed with prometheus_client's own parser):
the counters move by what a chat did; /health says 503 "loading" until the
model is loaded (and its kernels compiled), then 200."""

from __future__ import annotations

import threading

import openai
from prometheus_client.parser import text_string_to_metric_families

from serve.conftest import Http, get_json, post_json


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value."""
    with Http(url) as h:
        r = h.request("GET", "/metrics")
        assert r.status == 200 and r.getheader("content-type").startswith("text/plain")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_move_by_what_a_chat_did(serve, tiny_model):
    tiny_model.forget()
    server = serve(tiny_model)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    submits0 = tiny_model.engine.times.submits
    before = scrape(server.url)
    assert before[("rkc_ready", ())] == 1 and before[("rkc_queue_waiting", ())] == 0
    chunks = list(c.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "the cat"}],
                                            max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    pieces = sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason][0]
    status, _, _ = post_json(server.url, "/v1/chat/completions", {"messages": []})  # a bad request: 400
    assert status == 400
    after = scrape(server.url)

    assert delta(before, after, "rkc_http_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert delta(before, after, "rkc_http_requests_total", endpoint="/v1/chat/completions", status="400") == 1
    assert delta(before, after, "rkc_http_requests_total", endpoint="/metrics", status="200") == 1
    assert delta(before, after, "rkc_generations_total", kind="chat", outcome=finish) == 1
    assert delta(before, after, "rkc_generated_tokens_total") == usage.completion_tokens
    assert delta(before, after, "rkc_prefill_tokens_total") == (usage.prompt_tokens
                                                                - usage.prompt_tokens_details.cached_tokens)
    assert delta(before, after, "rkc_decode_runs_total") == usage.completion_tokens - 1
    assert delta(before, after, "rkc_time_to_first_token_seconds_count", kind="chat") == 1
    assert delta(before, after, "rkc_inter_token_seconds_count") == pieces - 1
    submits = tiny_model.engine.times.submits - submits0
    assert submits > 0 and delta(before, after, "rkc_npu_submits_total") == submits
    assert after[("rkc_last_tokens_per_second", (("phase", "decode"),))] > 0
    for phase in ("prefill", "decode"):
        assert delta(before, after, f"rkc_{phase}_seconds_total") > 0


def test_health_is_503_until_the_model_is_loaded(serve, tiny_model):
    tiny_model.forget()
    release = threading.Event()

    def load():
        assert release.wait(60)
        return tiny_model

    server = serve(load)
    with Http(server.url) as h:
        status, _, body = h.json("GET", "/health")
        assert status == 503 and body["status"] == "loading"
        status, headers, body = h.json("POST", "/v1/chat/completions",
                                       {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 503 and body["error"]["code"] == "loading" and int(headers["retry-after"]) >= 1
    assert scrape(server.url)[("rkc_ready", ())] == 0
    release.set()
    for _ in range(3000):  # bounded: 30 s
        with Http(server.url) as h:
            status, _, body = h.json("GET", "/health")
        if status == 200:
            break
        threading.Event().wait(0.01)
    assert status == 200 and body["status"] == "ok"
    assert scrape(server.url)[("rkc_ready", ())] == 1
    reply = get_json(server.url, "/v1/models")["data"][0]
    assert reply["id"] == "tiny-chat" and reply["chat_template"] == "gguf"
