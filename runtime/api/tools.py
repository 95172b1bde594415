"""OpenAI function calling and structured output over a chat template.

In: `tools` ([{"type": "function", "function": {name, description,
parameters}}]), `tool_choice` ("auto", "none", "required" or
{"type": "function", "function": {"name"}}), `response_format`
({"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
{name, schema, strict}}), and a history that may hold assistant messages
with `tool_calls` and "tool" messages with their results.

The prompt: a template that reads a `tools` variable (Qwen's, Llama 3's)
gets the tools and the history as they are (a call's arguments as an object,
as Hugging Face templates expect); any other template (Gemma's, plain
ChatML) gets a system message describing the tools and the reply format
(`{"name": ..., "arguments": {...}}`), calls written as that JSON in the
assistant's turn, and tool results as a user turn (templates such as Gemma's
accept only alternating user/assistant turns).

Out: the reply parsed for calls: one or more JSON objects {"name",
"arguments" (or Llama 3's "parameters")}, bare, in a list, in a ```json fence
or in Hermes/Qwen <tool_call> blocks, each naming one of the tools. With
tool_choice "required" or a named function, decoding is constrained to such
an object (constrain.py), so the reply is a call whatever the model."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from rkc.runtime.api.errors import RequestError

CHOICES = ("auto", "none", "required")
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names

FALLBACK_PROMPT = ("You can call the following tools (functions). To call a tool, reply with only a JSON object "
                   '{{"name": <the tool\'s name>, "arguments": <an object of its arguments>}} and nothing else; '
                   "you will get the result in the next message. {when}\n\nTools:\n{tools}")
WHEN = {"auto": "If no tool is needed, answer normally.", "required": "You must call one of the tools.",
        "function": "You must call the tool {name}."}


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # as the request gave them, checked
    choice: str  # "auto", "none", "required" or "function" (the named one: `name`)
    name: str | None = None

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def constrained(self) -> bool:
        return self.choice in ("required", "function")

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema of one call of the allowed tool(s)."""
        def one(fn: dict[str, Any]) -> dict[str, Any]:
            params = fn.get("parameters") or {"type": "object", "properties": {}}
            return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                    "required": ["name", "arguments"], "additionalProperties": False}
        fns = [t["function"] for t in self.tools if self.choice != "function" or t["function"]["name"] == self.name]
        return one(fns[0]) if len(fns) == 1 else {"anyOf": [one(f) for f in fns]}


def check_tools(tools: Any, tool_choice: Any) -> ToolRequest | None:
    """The checked request; None when there are no tools or tool_choice is "none"."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise RequestError("tools must be a non-empty array", "tools")
    seen = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise RequestError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -",
                               f"tools[{i}].function.name")
        if name in seen:
            raise RequestError(f"tools[{i}]: a second tool named {name!r}", f"tools[{i}].function.name")
        seen.add(name)
        if not isinstance(fn.get("parameters", {}), dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               f"tools[{i}].function.parameters")
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in seen:
            raise RequestError(f"tool_choice names no tool of the request ({name!r})", "tool_choice")
        return ToolRequest(tools, "function", name)
    if choice not in CHOICES:
        raise RequestError('tool_choice must be "auto", "none", "required" or {"type": "function", '
                           '"function": {"name": ...}}', "tool_choice")
    return None if choice == "none" else ToolRequest(tools, choice)


def check_response_format(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema the reply must match ({"type": "object"} for json_object); None for text."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be a JSON schema object",
                               "response_format")
        return schema
    raise RequestError('response_format.type must be "text", "json_object" or "json_schema"', "response_format")


def constrained_schema(tools: ToolRequest | None, response: dict[str, Any] | None) -> dict[str, Any] | None:
    """What decoding is constrained to: a call when one is required; the response format (or a call, if tools
    may be called) otherwise; None: free text."""
    if tools is not None and tools.constrained:
        return tools.call_schema()
    if response is None:
        return None
    return response if tools is None else {"anyOf": [response, tools.call_schema()]}


def template_takes_tools(template: str | None) -> bool:
    """Does the chat template read a `tools` variable (then it renders them its own way)?"""
    if not template:
        return False
    import jinja2
    from jinja2 import meta

    try:
        return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateError:
        return False  # render_chat reports the template's error


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _call_json(calls: list[dict[str, Any]]) -> str:
    objs = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])} for c in calls]
    return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)


def for_template(messages: list[dict[str, Any]], tools: ToolRequest | None,
                 native: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) to render: as they are for a template that takes tools (native), else rewritten into
    plain system/user/assistant turns."""
    if native:
        out = []
        for m in messages:
            if m.get("tool_calls"):
                calls = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                         for c in m["tool_calls"]]
                m = {**m, "tool_calls": calls}
            out.append(m)
        return out, (tools.tools if tools is not None else None)
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            line = f"Result of {m.get('name') or names.get(m.get('tool_call_id'), 'the tool')}: {m['content']}"
            if out and out[-1].get("tool_results"):  # results of parallel calls: one user turn
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + line}
            else:
                out.append({"role": "user", "content": line, "tool_results": True})
        elif m.get("tool_calls"):
            text = "\n".join(filter(None, [m["content"], _call_json(m["tool_calls"])]))
            out.append({"role": "assistant", "content": text})
        else:
            out.append(m)
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    if tools is not None:
        when = WHEN[tools.choice].format(name=tools.name)
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools.tools)
        prompt = FALLBACK_PROMPT.format(when=when, tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


def _objects(text: str) -> list[Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else [value]


def parse_calls(text: str, names: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool calls) of a reply: ("", calls) when the reply is calls of the named tools (content before
    Hermes/Qwen <tool_call> blocks kept), (text, []) otherwise."""
    s = text.strip()
    if "<tool_call>" in s:
        head = s[:s.index("<tool_call>")].strip()
        objs: list[Any] | None = []
        for block in _BLOCK.findall(s):
            got = _objects(block)
            objs = None if got is None or objs is None else objs + got
    else:
        head, fence = "", _FENCE.match(s)
        objs = _objects(fence.group(1) if fence else s)
    calls = []
    for obj in objs or [None]:
        if not isinstance(obj, dict) or obj.get("name") not in names:
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string already
            args = _arguments(args)
        if not isinstance(args, dict):
            return text, []
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
    return head, calls


class CallHolder:
    """Streamed text, held back while it may still be a tool call (it begins
    with "{", "[", a ``` fence or <tool_call>; everything when a call is
    required), passed on as soon as it cannot be; `finish()` parses what was held."""

    _STARTS = ("{", "[", "```", "<tool_call>")

    def __init__(self, tools: ToolRequest) -> None:
        self.tools, self.held, self.passing = tools, "", False

    def push(self, piece: str) -> str:
        if self.passing:
            return piece
        self.held += piece
        s = self.held.lstrip()
        if self.tools.constrained or not s or any(s.startswith(p) or p.startswith(s) for p in self._STARTS):
            return ""
        self.passing, held, self.held = True, self.held, ""
        return held

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the text still to emit, the calls)."""
        held, self.held = self.held, ""
        return parse_calls(held, self.tools.names) if held else ("", [])


def check_history(m: dict[str, Any], i: int) -> dict[str, Any]:
    """The tool fields of messages[i] (an assistant's tool_calls, a tool result's tool_call_id), checked."""
    out: dict[str, Any] = {}
    if m["role"] == "tool":
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise RequestError(f"messages[{i}].{key} must be a string", f"messages[{i}].{key}")
                out[key] = m[key]
    calls = m.get("tool_calls")
    if calls is not None:
        if m["role"] != "assistant" or not isinstance(calls, list):
            raise RequestError(f"messages[{i}].tool_calls must be an array, in an assistant message",
                               f"messages[{i}].tool_calls")
        checked = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                    and isinstance(fn.get("arguments", ""), str)):
                raise RequestError(f"messages[{i}].tool_calls[{j}] must be {{id, type: function, function: "
                                   f"{{name, arguments (a JSON string)}}}}", f"messages[{i}].tool_calls")
            checked.append({"id": str(c.get("id") or f"call_{i}_{j}"), "type": "function",
                            "function": {"name": fn["name"], "arguments": fn.get("arguments") or "{}"}})
        if checked:
            out["tool_calls"] = checked
    return out
