"""rkrun serve's HTTP API as an OpenAPI 3.1 description (served at
/openapi.json): the request bodies are made from schema.py's field tables, so
what the description says a field may hold is what the server checks; the
ranges are the Python API's (runtime/api/llm.py). tests/serve/test_api_fuzz.py
fuzzes the server from it (schemathesis)."""

from __future__ import annotations

from typing import Any

from rkc.runtime.api.llm import ROLES
from rkc.runtime.llm.generate import MAX_TOP_LOGPROBS
from rkc.runtime.serve import schema

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
# what a field's value may be beyond its JSON type (the Python API's checks, stated for clients)
_RANGES: dict[str, dict[str, Any]] = {
    "max_tokens": {"minimum": 1}, "max_completion_tokens": {"minimum": 1},
    "temperature": {"minimum": 0, "maximum": 2}, "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"minimum": 0}, "seed": {"minimum": 0, "maximum": 2 ** 64 - 1}, "n": {"enum": [1, None]},
    # a completion's logprobs (a count; a chat's is a boolean) and a chat's top_logprobs: alternatives per token
    "logprobs": {"minimum": 0, "maximum": MAX_TOP_LOGPROBS}, "top_logprobs": {"minimum": 0, "maximum": MAX_TOP_LOGPROBS},
}
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_SHAPES: dict[str, dict[str, Any]] = {  # arrays and objects: what they hold
    "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "properties": {
            "role": {"enum": list(ROLES)},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}}}},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": 4, "items": {"type": "string"}},
                       {"type": "null"}]},
    "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "maxItems": 1,
                                              "items": {"type": "string"}}]},
    # include_usage null is "not given", as every optional field's null is (schema.parse)
    "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": ["boolean", "null"]}}},
}


def _field(name: str, types: tuple[type, ...], required: bool) -> dict[str, Any]:
    if name in _SHAPES:
        return _SHAPES[name]
    kinds = list(dict.fromkeys(_JSON_TYPES[t] for t in types))
    if "integer" in kinds and "number" in kinds:
        kinds.remove("integer")
    return {"type": kinds if required else [*kinds, "null"], **_RANGES.get(name, {})}


def _body(kind: str) -> dict[str, Any]:
    fields = schema.CHAT if kind == "chat" else schema.COMPLETION
    required = list(schema.REQUIRED[kind])
    body = {"type": "object", "required": required,
            "properties": {name: _field(name, types, name in required) for name, types in fields.items()}}
    if "max_completion_tokens" in fields:  # one limit, under either name (schema.parse)
        body["not"] = {"required": ["max_tokens", "max_completion_tokens"],
                       "properties": {"max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"}}}
    return body


_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _errors(*statuses: int) -> dict[str, Any]:
    words = {400: "invalid request", 404: "no such model or route", 405: "method not allowed",
             413: "body larger than 1 MiB", 500: "the device failed (code device_error)",
             503: "queue full or shutting down; Retry-After says when to try again"}
    out = {}
    for s in statuses:
        out[str(s)] = {"description": words[s], "content": {"application/json": {"schema": _ERROR}}}
        if s == 503:
            out[str(s)]["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}
    return out


def _generation(kind: str, summary: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary, "operationId": kind,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _body(kind)}}},
        "responses": {"200": {"description": "the answer (JSON), or server-sent events when stream is true",
                              "content": {"application/json": {"schema": {"type": "object"}},
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                      **_errors(400, 404, 413, 500, 503)}}}


def _get(summary: str, media: str = "application/json") -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": {"description": summary,
                                                              "content": {media: {"schema": {}}}}}}}


def describe(version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI document of the server's routes."""
    return {"openapi": "3.1.0", "info": {"title": "rkrun serve", "version": version,
                                         "description": "OpenAI-compatible API of an LLM on the RK3588 NPU"},
            "paths": {"/v1/chat/completions": _generation("chat", "the assistant's reply to messages"),
                      "/v1/completions": _generation("completion", "the continuation of a prompt"),
                      "/v1/models": _get("the served model"),
                      "/health": _get("status, queue and prefix cache"),
                      "/openapi.json": _get("this description"),
                      "/": _get("the chat page", "text/html")}}
