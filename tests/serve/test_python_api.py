"""rkc.load: an LLM's generate/chat (plain and streamed, stops, sampling, the
prefix cache) and an ONNX model's run."""

from __future__ import annotations

import numpy as np
import pytest

import rkc
from rkc.runtime.api.llm import RequestError
from rkc.runtime.api.stops import StopScanner

CHAT = [{"role": "system", "content": "the cat is a model"}, {"role": "user", "content": "hello the world"}]


def test_import_rkc_is_light():
    import subprocess
    import sys

    code = ("import sys, rkc; print('rkc.' in ' '.join(sys.modules), callable(rkc.load), "
            "'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "False"]  # the model code comes with the first load()


def test_stream_equals_plain_and_counts_tokens(tiny_model):
    plain = tiny_model.chat(CHAT, max_tokens=12, temperature=0)
    stream = tiny_model.chat(CHAT, max_tokens=12, temperature=0, stream=True)
    pieces = list(stream)
    assert "".join(pieces) == plain.text == stream.result.text and len(pieces) > 1
    assert plain.completion_tokens == 12 and plain.finish_reason == "length"
    assert plain.prompt_tokens == len(tiny_model.encode_chat(CHAT))


def test_seeded_sampling_repeats(tiny_model):
    a = tiny_model.generate("the cat", max_tokens=10, temperature=1.0, seed=5)
    b = tiny_model.generate("the cat", max_tokens=10, temperature=1.0, seed=5)
    c = tiny_model.generate("the cat", max_tokens=10, temperature=1.0, seed=6)
    assert a.text == b.text and a.text != c.text


def test_stop_string_cuts_the_text(tiny_model):
    full = tiny_model.generate("the dog and", max_tokens=24, temperature=0).text
    stop = full[len(full) // 2: len(full) // 2 + 3]  # from the continuation itself
    got = tiny_model.generate("the dog and", max_tokens=24, temperature=0, stop=[stop, "\x00never"])
    assert got.text == full[:full.index(stop)] and got.finish_reason == "stop"


@pytest.mark.parametrize("stops,pieces,want", [
    (["END"], ["abc E", "N", "D more"], "abc "),
    (["END"], ["abc E", "x"], "abc Ex"),
    (["ab", "b c"], ["xa", "b c"], "x"),
])
def test_stop_scanner_holds_back_partial_stops(stops, pieces, want):
    scanner = StopScanner(stops)
    out = "".join(scanner.push(p) for p in pieces) + scanner.flush()
    assert out == want


def test_second_turn_reuses_the_first_turns_kv_and_answers_the_same(tiny_model, reference_model):
    tiny_model.forget()
    first = tiny_model.chat(CHAT, max_tokens=10, temperature=0)
    turn2 = [*CHAT, {"role": "assistant", "content": first.text}, {"role": "user", "content": "and the dog"}]
    before = tiny_model.stats.prefilled_tokens
    second = tiny_model.chat(turn2, max_tokens=10, temperature=0)
    n1 = len(tiny_model.encode_chat(CHAT))
    assert second.cached_tokens >= n1  # all of the first turn's prompt
    assert tiny_model.stats.prefilled_tokens - before == second.prompt_tokens - second.cached_tokens
    assert tiny_model.timings.prompt_tokens == second.prompt_tokens - second.cached_tokens
    reference_model.forget()
    fresh = reference_model.chat(turn2, max_tokens=10, temperature=0)
    assert fresh.cached_tokens == 0 and fresh.text == second.text


def test_sliding_window_layers_reuse_only_what_they_kept(synth_rkbin):
    """gemma3's tiny model has a window of 6: a prefix is reused only when the
    window layers still hold the keys the next query sees (their window and
    kvcache.ROLLBACK positions before it, more until a slide drops them);
    the answers never change."""
    from rkc.runtime.llm.kvcache import ROLLBACK

    with rkc.load(synth_rkbin("gemma3"), device="sim", cache_slots=1) as model, \
            rkc.load(synth_rkbin("gemma3"), device="sim") as fresh:
        prompt = "the cat and the dog run in the world"
        cached = []
        # (a window layer's buffer: at most 2 x 6 + ROLLBACK + a chunk of 16 rows)
        for reply, follow in ((6, "{first} at one time"), (6, " of"), (ROLLBACK + 40, " of")):
            model.forget()
            first = model.generate(prompt, max_tokens=reply, temperature=0, ignore_eos=True)
            follow = prompt + follow.format(first=first.text)
            got = model.generate(follow, max_tokens=6, temperature=0)
            fresh.forget()
            want = fresh.generate(follow, max_tokens=6, temperature=0)
            assert got.text == want.text, follow
            cached.append(got.cached_tokens)
        # parting from the cache 5 positions before its end: past the window, within ROLLBACK;
        # ROLLBACK + 39 before it: no longer held
        assert cached[0] > 0 and cached[1] > 0 and cached[2] == 0, cached


def test_kv_cache_truncate_keeps_what_later_queries_see():
    from rkc.runtime.llm.kvcache import ROLLBACK, KVCache

    cache = KVCache(2, [6, 0], n_ctx=256)
    for p in range(200):  # one position at a time, as decode stores them: the window layer's buffer slides
        for layer in (0, 1):
            cache.append(layer, np.ones((1, 1, 4)), np.ones((1, 1, 4)), np.asarray([p]))
    assert cache.length == 200
    assert not cache.truncate(10) and not cache.truncate(201) and cache.length == 200
    n = 200 - ROLLBACK  # a query at n sees n - 5..n: the window layer holds ROLLBACK before its window
    assert cache.truncate(n)
    assert cache.length == n and cache.pos[0].tolist() == list(range(n - 6, n))
    assert cache.pos[1].tolist() == list(range(n))


def test_two_conversations_keep_their_slots(tiny_model):
    tiny_model.forget()
    a = [{"role": "user", "content": "the cat"}]
    b = [{"role": "user", "content": "the dog and the world"}]
    ra, rb = tiny_model.chat(a, max_tokens=4, temperature=0), tiny_model.chat(b, max_tokens=4, temperature=0)
    again = tiny_model.chat([*a, {"role": "assistant", "content": ra.text}, {"role": "user", "content": "x"}],
                            max_tokens=4, temperature=0)
    assert again.cached_tokens >= ra.prompt_tokens
    again_b = tiny_model.chat([*b, {"role": "assistant", "content": rb.text}, {"role": "user", "content": "y"}],
                              max_tokens=4, temperature=0)
    assert again_b.cached_tokens >= rb.prompt_tokens


@pytest.mark.parametrize("kwargs,param", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
    (dict(top_k=-2), "top_k"), (dict(seed=-1), "seed"), (dict(stop=[1]), "stop"),
])
def test_bad_arguments_name_the_parameter(tiny_model, kwargs, param):
    with pytest.raises(RequestError) as info:
        tiny_model.generate("the", **kwargs)
    assert info.value.param == param


def test_bad_messages_and_long_prompts(tiny_model):
    for messages in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 3}], "hi"):
        with pytest.raises(RequestError):
            tiny_model.chat(messages)
    with pytest.raises(RequestError, match="context holds") as info:
        tiny_model.generate("the " * tiny_model.n_ctx)
    assert info.value.code == "context_length_exceeded"


def test_an_empty_prompt_without_bos_is_a_request_error(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model.tokenizer, "add_bos", False)  # as Qwen's GGUFs say
    with pytest.raises(RequestError, match="empty") as info:
        tiny_model.generate("")
    assert info.value.param == "prompt"


def test_onnx_model_runs(tmp_path):
    from onnx_models import example, onnxruntime_outputs, save
    from rkc.compiler.build import BuildOptions, build
    from rkc.runtime.execute import InputError

    path = save(example("mlp").build_model(), tmp_path / "mlp.onnx")
    build(path, tmp_path / "mlp.rkbin", BuildOptions())
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with rkc.load(tmp_path / "mlp.rkbin") as model:
        assert model.inputs == ["x"]
        got = model.run({"x": x})
        with pytest.raises(InputError):
            model.run({"y": x})
    for name, want in onnxruntime_outputs(path, {"x": x}).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-2, atol=1e-2)


def test_cancel_from_another_thread_stops_at_the_next_token(tiny_model):
    import threading

    cancel = threading.Event()
    stream = tiny_model.generate("the cat", max_tokens=100, temperature=0, stream=True, cancel=cancel)
    pieces = [next(stream)]
    threading.Thread(target=cancel.set).start()
    pieces += list(stream)
    r = stream.result
    assert r.finish_reason == "cancelled" and r.completion_tokens < 100
    assert tiny_model.generate("the cat", max_tokens=100, temperature=0).text.startswith("".join(pieces))


def test_a_lone_surrogate_is_a_request_error(tiny_model):
    with pytest.raises(RequestError) as info:
        tiny_model.chat([{"role": "user", "content": "a\ud800b"}])
    assert info.value.param == "messages[0].content"
    with pytest.raises(RequestError) as info:
        tiny_model.generate("\udfff")
    assert info.value.param == "prompt"


def _kv_bound(model) -> int:
    """The module docstring's bound on one slot's KV memory (ctx rows a layer that keeps a cache)."""
    cfg = model.engine.cfg
    row = [cfg.n_head_kv_of(i) * sum(cfg.head_dim_of(i)) * 6 + 8  # K and V heads, fp32 + fp16; the position
           for i in range(cfg.n_layer) if cfg.kv_layer(i) == i]
    return model.n_ctx * sum(row)


def test_kv_bytes_counts_the_buffers_a_slot_keeps_and_forget_frees_them(tiny_model):
    """A slot keeps its KV buffers between requests: the next request into it
    stores there (kv_bytes unchanged), what it reserved counts as memory in
    use, within the documented bound, and forget() frees it."""
    tiny_model.forget()
    assert tiny_model.kv_bytes == 0
    tiny_model.generate("the cat and the dog and the world", max_tokens=4, temperature=0)
    one = tiny_model.kv_bytes
    tiny_model.generate("a world", max_tokens=4, temperature=0)  # no shared prefix but BOS: the other slot
    two = tiny_model.kv_bytes
    assert 0 < one < two <= tiny_model.cache_slots * _kv_bound(tiny_model)
    got = tiny_model.generate("dog cat world", max_tokens=6, temperature=0)  # the first slot again
    assert got.cached_tokens <= 1 and tiny_model.kv_bytes == two  # into the buffers it kept
    tiny_model.forget()
    assert tiny_model.kv_bytes == 0


def test_a_new_prompt_reuses_the_buffers_and_answers_as_a_fresh_cache(tiny_model):
    """Generation from position 0 (rkrun's, a slot whose prefix is not kept)
    resets the cache: the next prompt stores into the buffers the last one
    grew and gets the tokens a fresh cache gives."""
    from rkc.runtime.llm.generate import Generator, Sampler

    encode = tiny_model.tokenizer.encode
    gen, fresh = Generator(tiny_model.engine, 64), Generator(tiny_model.engine, 64)
    list(gen.generate(encode("the cat and the dog and the world and the cat"), 12, Sampler(0.0)))
    held, nbytes = gen.cache._k[0], gen.cache.nbytes
    ids = encode("dog cat world")
    got = list(gen.generate(ids, 8, Sampler(0.0), stop_at_eos=False))
    assert gen.cache._k[0] is held and gen.cache.nbytes == nbytes
    assert got == list(fresh.generate(ids, 8, Sampler(0.0), stop_at_eos=False)) and len(got) == 8


def test_token_logprob_matches_a_float64_log_softmax():
    from rkc.runtime.llm.generate import token_logprob

    rng = np.random.default_rng(7)
    for scale, n in ((1.0, 50), (30.0, 1000), (1e4, 262144)):  # 1e4: exp would overflow without the max taken out
        logits = (rng.standard_normal(n) * scale).astype(np.float32)
        z = logits.astype(np.float64)
        want = z - z.max() - np.log(np.sum(np.exp(z - z.max())))
        token = int(rng.integers(n))
        got = token_logprob(logits, token, 5)
        assert got.token == token and abs(got.logprob - want[token]) <= 1e-12 * max(1.0, abs(want[token]))
        best = np.argsort(-want, kind="stable")[:5]
        assert [t for t, _ in got.top] == best.tolist()
        assert np.allclose([lp for _, lp in got.top], want[best], rtol=0, atol=1e-12 * max(1.0, scale))


def test_logprobs_follow_the_tokens_generated(tiny_model):
    greedy = tiny_model.generate("the cat and", max_tokens=8, temperature=0, logprobs=3)
    assert greedy.logprobs is not None and len(greedy.logprobs) == greedy.completion_tokens == 8
    raw = b"".join(bytes(tiny_model.tokenizer.token_piece(p.token)[1]) for p in greedy.logprobs)
    decoded = raw.decode("utf-8", errors="replace")  # the text holds back a last token's incomplete character
    assert decoded.startswith(greedy.text) and set(decoded[len(greedy.text):]) <= {"\ufffd"}
    for p in greedy.logprobs:
        assert len(p.top) == 3 and p.top[0] == (p.token, p.logprob)  # greedy takes the most likely
        assert [lp for _, lp in p.top] == sorted((lp for _, lp in p.top), reverse=True) and p.logprob <= 0
    sampled = tiny_model.generate("the cat and", max_tokens=8, temperature=1.0, seed=3, logprobs=0)
    assert [p.top for p in sampled.logprobs] == [()] * 8
    assert all(p.logprob <= 0 for p in sampled.logprobs)
    stream = tiny_model.generate("the cat and", max_tokens=8, temperature=0, logprobs=3, stream=True)
    pieces = list(stream)
    assert "".join(pieces) == greedy.text and tuple(stream.logprobs) == stream.result.logprobs
    # (the prefix cache's reuse computes the prompt's KV by another chunk plan: the logits move by float rounding)
    assert [p.token for p in stream.result.logprobs] == [p.token for p in greedy.logprobs]
    assert np.allclose([p.logprob for p in stream.result.logprobs], [p.logprob for p in greedy.logprobs], atol=1e-3)
    assert tiny_model.generate("the cat and", max_tokens=4, temperature=0).logprobs is None


@pytest.mark.parametrize("value", [-1, 21, 2.5, True])
def test_bad_logprobs_are_request_errors(tiny_model, value):
    with pytest.raises(RequestError) as info:
        tiny_model.generate("the", logprobs=value)
    assert info.value.param == "logprobs"
