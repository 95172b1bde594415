"""What a request body may hold, and the OpenAI-style error body for what it
must not. Field values' ranges are the Python API's to check (RequestError);
here: JSON shape and types, before a request is queued."""

from __future__ import annotations

import json
from typing import Any

from rkc.runtime.api.llm import RequestError
from rkc.runtime.llm.generate import MAX_TOP_LOGPROBS

NUMBER, INT, STR, BOOL, LIST, DICT = (int, float), (int,), (str,), (bool,), (list,), (dict,)

# field -> the JSON types it may have (None is always allowed: "not given")
SAMPLING = {"model": STR, "stream": BOOL, "max_tokens": INT, "temperature": NUMBER, "top_p": NUMBER,
            "top_k": INT, "seed": INT, "stop": STR + LIST, "n": INT, "stream_options": DICT, "user": STR}
CHAT = {**SAMPLING, "messages": LIST, "max_completion_tokens": INT, "tools": LIST, "tool_choice": STR + DICT,
        "response_format": DICT, "parallel_tool_calls": BOOL, "logprobs": BOOL, "top_logprobs": INT}
COMPLETION = {**SAMPLING, "prompt": STR + LIST, "logprobs": INT}
REQUIRED = {"chat": ("messages",), "completion": ("prompt",)}
# request field -> the keyword of LlmModel.chat / generate
KEYWORDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
            "top_p": "top_p", "top_k": "top_k", "seed": "seed", "stop": "stop"}
CHAT_KEYWORDS = {**KEYWORDS, "tools": "tools", "tool_choice": "tool_choice", "response_format": "response_format"}


class HttpError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind, self.headers = status, param, code, kind, headers or {}

    @classmethod
    def of(cls, exc: RequestError) -> "HttpError":
        return cls(400, str(exc), exc.param, exc.code)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "an array",
             dict: "an object"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def parse(raw: bytes, kind: str, model_id: str) -> dict[str, Any]:
    """The body as a dict whose fields have the right JSON types; HttpError otherwise."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise HttpError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the request body must be a JSON object")
    fields = CHAT if kind == "chat" else COMPLETION
    for name, types in fields.items():
        value = body.get(name)
        bad_bool = isinstance(value, bool) and bool not in types  # JSON true is no integer
        if value is not None and (bad_bool or not isinstance(value, types)):
            raise HttpError(400, f"{name} must be {_type_name(types)}", name)
    for name in REQUIRED[kind]:
        if body.get(name) is None:
            raise HttpError(400, f"{name} is required", name)
    if body.get("model") not in (None, model_id):
        raise HttpError(404, f"the model {body['model']!r} does not exist (this server has {model_id!r})", "model",
                        "model_not_found")
    usage = (body.get("stream_options") or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise HttpError(400, "stream_options.include_usage must be a boolean", "stream_options.include_usage")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise HttpError(400, "max_tokens and max_completion_tokens are one limit: give one of them", "max_tokens")
    if kind == "chat" and body.get("top_logprobs") is not None:
        if not body.get("logprobs"):
            raise HttpError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        if not 0 <= body["top_logprobs"] <= MAX_TOP_LOGPROBS:
            raise HttpError(400, f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
    if body.get("n") not in (None, 1):
        raise HttpError(400, "n must be 1 (one choice per request)", "n")
    prompt = body.get("prompt")
    if isinstance(prompt, list):  # the API allows a batch; one prompt here
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise HttpError(400, "prompt must be a string (or an array of one string)", "prompt")
        body["prompt"] = prompt[0]
    return body


def keywords(body: dict[str, Any], kind: str = "completion") -> dict[str, Any]:
    """LlmModel keyword arguments from the request's sampling fields (and a chat's tools and response format,
    and logprobs: a chat's boolean with its top_logprobs, a completion's count of alternatives)."""
    names = CHAT_KEYWORDS if kind == "chat" else KEYWORDS
    out = {names[k]: v for k, v in body.items() if k in names and v is not None}
    if kind == "chat" and body.get("logprobs"):
        out["logprobs"] = body.get("top_logprobs") or 0
    elif kind != "chat" and body.get("logprobs") is not None:
        out["logprobs"] = body["logprobs"]
    return out
