"""Tools (OpenAI function calling) and structured output (response_format):
the prompt each kind of template gets, the parsing of replies into tool
calls, the logits mask against numpy, and constrained decoding end to end
through the Python API and the real openai client. The model is the tiny
synthetic one (random weights, fixed seed): its text is noise, so a reply
that parses and validates is the mask's doing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import openai
import pydantic
import pytest

from rkc.runtime.api import chat_templates
from rkc.runtime.api import tools as T
from rkc.runtime.api.constrain import mask_logits
from rkc.runtime.api.llm import RequestError, render_chat
from serve.conftest import post_json

GEMMA_TEMPLATE = chat_templates.text("gemma")  # the built-in one: reads no tools
# a template that reads `tools` (the shape of the Hermes/Qwen ones: tools in the system turn, calls in
# <tool_call> blocks, results in "tool" turns), written for this test
HERMES = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
          "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
          "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, "
          "'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=10)
    days: int = pydantic.Field(ge=1, le=14)
    unit: Literal["celsius", "fahrenheit"]
    alerts: bool


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": Weather.model_json_schema()}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
ASK = [{"role": "user", "content": "the weather"}]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """The tiny ChatML model with a context that holds the tools' descriptions (the synthetic BPE spends about a
    token a character)."""
    import rkc
    from llm.synth import CHATML, write_model
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    d = tmp_path_factory.mktemp("tools")
    out = d / "tiny-chat.rkbin"
    compile_gguf(write_model(d / "tiny-chat.gguf", "qwen3", chat_template=CHATML, context_length=1024), out,
                 LlmCompileOptions("fp16", (1, 4, 16)))
    with rkc.load(out, device="sim") as model:
        yield model


# -- the mask --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_vocab", [1, 31, 32, 33, 1000, 4099])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mask_logits_matches_numpy(n_vocab, dtype):
    rng = np.random.default_rng(n_vocab)
    for words, density in [((n_vocab + 31) // 32, 0.5), ((n_vocab + 31) // 32, 0.97), (max(1, n_vocab // 32), 0.5)]:
        allowed = rng.random(words * 32) < density
        allowed[: 32 * (words // 3)] = True  # whole words all set and all clear
        allowed[32 * (words // 3): 32 * (2 * words // 3)] = False
        bits = np.packbits(allowed, bitorder="little").view(np.int32)
        logits = rng.standard_normal(n_vocab).astype(dtype)
        keep = np.zeros(n_vocab, bool)
        keep[: min(n_vocab, allowed.size)] = allowed[:n_vocab]
        want = np.where(keep, logits, -np.inf)
        got = mask_logits(logits, bits)
        assert np.shares_memory(got, logits) and np.array_equal(got, want) and np.array_equal(logits, want)
        frozen = rng.standard_normal(n_vocab).astype(dtype)
        frozen.flags.writeable = False
        assert np.array_equal(mask_logits(frozen, bits), np.where(keep, frozen, -np.inf))  # a copy


# -- prompts -----------------------------------------------------------------------------------------------
HISTORY = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
]


def _render(template, messages, tools):
    from rkc.runtime.api.llm import check_messages

    rendered, listed = T.for_template(check_messages(messages), tools, T.template_takes_tools(template))
    return render_chat(template, rendered, listed)


def test_fallback_prompt_for_a_template_without_tools():
    assert not T.template_takes_tools(GEMMA_TEMPLATE) and T.template_takes_tools(HERMES)
    request = T.check_tools([WEATHER], "auto")
    text = _render(GEMMA_TEMPLATE, HISTORY, request)
    prompt = T.FALLBACK_PROMPT.format(when=T.WHEN["auto"], tools=json.dumps(WEATHER))
    calls = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, ' \
            '{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    # the tools in the system text (Gemma: the first user turn), the calls as the model is asked to write them,
    # both results in one user turn: the turns still alternate
    assert text == (f"<start_of_turn>user\nbe brief\n\n{prompt}\n\nweather in Paris and Rome?<end_of_turn>\n"
                    f"<start_of_turn>model\n{calls}<end_of_turn>\n"
                    "<start_of_turn>user\nResult of get_weather: sunny\nResult of get_weather: rain<end_of_turn>\n"
                    "<start_of_turn>model\n")


def test_native_prompt_for_a_template_with_tools():
    text = _render(HERMES, HISTORY, T.check_tools([WEATHER, TIME], "auto"))
    listed = "".join(json.dumps(t, sort_keys=True) + "\n" for t in (WEATHER, TIME))  # Jinja's tojson sorts keys
    assert text == ("<|im_start|>system\n" + listed + "<|im_end|>\n"
                    "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nweather in Paris and Rome?<|im_end|>\n"
                    '<|im_start|>assistant\n<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}'
                    '</tool_call><tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>'
                    "<|im_end|>\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>tool\nrain<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # tool_choice "none": no tools in the prompt, the history still rendered
    assert "get_time" not in _render(HERMES, HISTORY, T.check_tools([WEATHER, TIME], "none"))


# -- parsing replies ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, content, calls", [
    ('{"name": "get_time", "arguments": {"zone": "UTC"}}', "", [("get_time", {"zone": "UTC"})]),
    (' [{"name": "get_time", "arguments": {"zone": "UTC"}}, {"name": "get_weather", "parameters": {"city": "x"}}]',
     "", [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "x"})]),
    ('```json\n{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}\n```', "", [("get_time", {"zone": "CET"})]),
    ('Let me look.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>'
     '{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
     "Let me look.", [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
    ('{"name": "get_news", "arguments": {}}', None, []),  # no such tool: text
    ('{"name": "get_time", "arguments": [1]}', None, []),
    ('{"name": "get_time", "arguments": {"zone"', None, []),  # cut short
    ("It is noon.", None, []),
])
def test_parse_calls(reply, content, calls):
    got_content, got = T.parse_calls(reply, ["get_weather", "get_time"])
    assert got_content == (reply if content is None else content)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)
    assert len({c["id"] for c in got}) == len(got)


def test_call_holder_streams_text_and_holds_calls():
    h = T.CallHolder(T.check_tools([TIME], "auto"))
    assert [h.push(p) for p in [" ", "It", " is", " noon"]] == ["", " It", " is", " noon"]
    assert h.finish() == ("", [])
    h = T.CallHolder(T.check_tools([TIME], "auto"))
    assert [h.push(p) for p in ["<tool", "_call>", '{"name": "get_time", "arguments": {}}']] == ["", "", ""]
    content, calls = h.finish()
    assert content == "" and calls[0]["function"]["name"] == "get_time"
    h = T.CallHolder(T.check_tools([TIME], "auto"))
    assert [h.push(p) for p in ["{", "not json"]] == ["", ""] and h.finish() == ("{not json", [])


@pytest.mark.parametrize("tools, choice, response_format, param", [
    ([], None, None, "tools"),
    ([{"type": "function"}], None, None, "tools[0]"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, None, "tools[0].function.name"),
    ([TIME, TIME], None, None, "tools[1].function.name"),
    ([TIME], "always", None, "tool_choice"),
    ([TIME], {"type": "function", "function": {"name": "get_weather"}}, None, "tool_choice"),
    (None, "required", None, "tool_choice"),
    (None, None, {"type": "xml"}, "response_format"),
    (None, None, {"type": "json_schema", "json_schema": {"name": "x"}}, "response_format"),
    (None, None, {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer",
                                                                                "minimum": "a"}}},
     "response_format"),
])
def test_bad_tool_requests(tool_model, tools, choice, response_format, param):
    with pytest.raises(RequestError) as e:
        tool_model.chat(ASK, max_tokens=4, tools=tools, tool_choice=choice, response_format=response_format)
    assert e.value.param == param


# -- constrained decoding -------------------------------------------------------------------------------------
def test_json_schema_python_api(tool_model):
    # no extra keys: a free key's string may outlast max_tokens (a seed on another CPU drew one)
    schema = {**Weather.model_json_schema(), "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    for seed in range(3):  # sampled at temperature 1.2 from noise: only the mask keeps it valid
        r = tool_model.chat(ASK, max_tokens=80, temperature=1.2, top_k=0, seed=seed, response_format=fmt)
        assert r.finish_reason == "stop", r
        Weather.model_validate_json(r.text, strict=True)
    r = tool_model.chat(ASK, max_tokens=80, temperature=0, response_format={"type": "json_object"},
                        stream=True)
    text = "".join(r)
    assert r.result.finish_reason in ("stop", "length")
    if r.result.finish_reason == "stop":  # a whole object (free keys may outlast max_tokens)
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


def test_required_and_named_tools_python_api(tool_model):
    for seed, choice in enumerate(("required", {"type": "function", "function": {"name": "get_time"}})):
        r = tool_model.chat(ASK, max_tokens=200, temperature=1.0, seed=seed, tools=[WEATHER, TIME],
                            tool_choice=choice)
        assert r.finish_reason == "tool_calls" and r.text == "" and len(r.tool_calls) == 1, r
        fn = r.tool_calls[0]["function"]
        if isinstance(choice, dict):
            assert fn["name"] == "get_time"
        if fn["name"] == "get_weather":
            Weather.model_validate_json(fn["arguments"], strict=True)
        else:
            assert json.loads(fn["arguments"])["zone"] in ("UTC", "CET")


@pytest.fixture
def tool_server(serve, tool_model):
    tool_model.forget()
    return serve(tool_model)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_openai_client_tools(tool_server):
    c = _client(tool_server)
    r = c.chat.completions.create(model="tiny-chat", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                  max_tokens=200, temperature=1.0, seed=4)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "get_time")
    json.loads(call.function.arguments)
    # the call and its result back in the history, streamed this time, the named tool
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny, 20 C"}]
    chunks = list(c.chat.completions.create(
        model="tiny-chat", messages=history, tools=[WEATHER, TIME], stream=True, max_tokens=200, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    Weather.model_validate_json(args, strict=True)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # auto: the noise is no call; its text streams as content
    r = c.chat.completions.create(model="tiny-chat", messages=ASK, tools=[TIME], max_tokens=6, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_openai_client_parse(tool_server):
    c = _client(tool_server)
    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    r = parse(model="tiny-chat", messages=ASK, response_format=Weather, max_tokens=80, temperature=1.0, seed=2)
    assert isinstance(r.choices[0].message.parsed, Weather)


def test_bad_tool_requests_http(tool_server):
    for body, param in [({"tools": "x"}, "tools"), ({"tools": [TIME], "tool_choice": "sometimes"}, "tool_choice"),
                        ({"response_format": {"type": "yaml"}}, "response_format")]:
        status, _, answer = post_json(tool_server.url, "/v1/chat/completions", {"messages": ASK, **body})
        assert status == 400 and answer["error"]["param"] == param
