"""The OpenAI-compatible HTTP API (Starlette): /v1/chat/completions,
/v1/completions, /v1/models, /health, /metrics (Prometheus), the chat page
at /, and the API's OpenAPI description at /openapi.json (openapi.py); API
keys in front of them (auth.py). Given a loader rather than a model, the app
answers at once and loads in a thread: /health and the API say 503 "loading"
until the model is loaded and its kernels compiled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from importlib import resources
from typing import Any, AsyncIterator, Callable, Iterable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rkc.ir.errors import RkcError
from rkc.runtime.api.llm import Completion, LlmModel, RequestError
from rkc.runtime.serve import logprobs, openapi, schema
from rkc.runtime.serve.auth import ApiKeyMiddleware
from rkc.runtime.serve.metrics import CountRequests, ServerMetrics
from rkc.runtime.serve.schema import HttpError
from rkc.runtime.serve.worker import Job, QueueFull, Worker

MAX_BODY = 1 << 20  # bytes; a chat that fits any context we run is far smaller
COMPLETION_MAX_TOKENS = 16  # the OpenAI default of /v1/completions (chat: until the end of the turn)


def _usage(r: Completion) -> dict[str, Any]:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


class Api:
    def __init__(self, model: LlmModel | None, worker: Worker | None, model_id: str,
                 metrics: ServerMetrics | None = None) -> None:
        self.model, self.worker = model, worker  # None while loading
        self.model_id = model_id
        self.counters = metrics or ServerMetrics()
        self.created = int(time.time())

    # -- shapes ---------------------------------------------------------------------
    def _chunk(self, kind: str, rid: str, created: int, text: str | None, finish: str | None,
               first: bool = False, picked: dict[str, Any] | None = None) -> dict[str, Any]:
        """One SSE chunk; `picked`: its choice's logprobs (logprobs.shaped), None when none were asked for."""
        if kind == "chat":
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": picked, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": picked, "finish_reason": finish}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": created, "model": self.model_id, "choices": [choice]}

    def _whole(self, kind: str, rid: str, created: int, r: Completion) -> dict[str, Any]:
        picked = logprobs.shaped(kind, r.logprobs, self._token_piece)
        if kind == "chat":
            choice = {"index": 0, "message": message(r), "logprobs": picked, "finish_reason": r.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": r.text, "logprobs": picked, "finish_reason": r.finish_reason}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": created, "model": self.model_id, "choices": [choice],
                "usage": _usage(r)}

    def _token_piece(self, token: int) -> tuple[str, list[int]]:
        return self.model.tokenizer.token_piece(token)

    # -- routes ----------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def models(self, request: Request) -> Response:
        if self.worker is None:
            return _loading()
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "rkc",
             "context_length": self.model.n_ctx, "chat_template": self.model.chat_template_source}]})

    async def health(self, request: Request) -> Response:
        if self.worker is None:
            return JSONResponse({"status": "loading", "model": self.model_id}, status_code=503)
        s = self.model.stats
        return JSONResponse({"status": "ok", "model": self.model_id, "context_length": self.model.n_ctx,
                             "queue": self.worker.status(),
                             "cache": {"slots": self.model.cache_slots, "kv_bytes": self.model.kv_bytes,
                                       "requests": s.requests, "prefilled_tokens": s.prefilled_tokens,
                                       "cached_tokens": s.cached_tokens, "generated_tokens": s.generated_tokens,
                                       "cancelled": s.cancelled}})

    async def metrics(self, request: Request) -> Response:
        body, content_type = self.counters.exposition()
        return Response(body, media_type=content_type)

    async def page(self, request: Request) -> Response:
        return HTMLResponse(resources.files("rkc.runtime.serve").joinpath("static/chat.html").read_text("utf-8"))

    # -- generation ---------------------------------------------------------------------
    async def _generate(self, request: Request, kind: str) -> Response:
        received = time.monotonic()
        if self.worker is None:
            return _loading()
        # everything the handler needs is made before the job is queued: from then on the NPU thread wants the
        # GIL, and the handler should reach its first await (the loop idle) at once
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        try:
            body = schema.parse(await _read_body(request), kind, self.model_id)
            options = schema.keywords(body, kind)
            if kind == "completion":
                options.setdefault("max_tokens", COMPLETION_MAX_TOKENS)
            job = Job(kind, body["messages"] if kind == "chat" else body["prompt"], options,
                      asyncio.get_running_loop(), streamed=bool(body.get("stream")), received_at=received)
            watcher = asyncio.ensure_future(_watch_disconnect(request, job))
            try:
                self.worker.submit(job)
            except QueueFull:
                watcher.cancel()
                raise
        except HttpError as exc:
            return _error(exc)
        except QueueFull as exc:
            return _error(HttpError(503, str(exc), kind="server_error", code=exc.code,
                                    headers={"Retry-After": str(exc.retry_after)}))
        except ClientDisconnect:
            return Response(status_code=400)
        streaming = False
        try:  # while queued and prefilling: the first event says whether the request was valid
            event, value = await job.events.get()
            if event == "gone":
                return Response(status_code=499)  # nobody to answer: the client has gone
            if event in ("error", "shutdown"):
                return _error(_failure(event, value))
            if body.get("stream"):
                streaming = True  # from here the stream ends the watcher
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return _JobStream(job, watcher, self._sse(job, (event, value), kind, rid, created, include_usage),
                                  media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            while event == "piece":
                event, value = await job.events.get()
            if event == "done":
                return JSONResponse(self._whole(kind, rid, created, value))
            if event in ("error", "shutdown"):
                return _error(_failure(event, value))
            return Response(status_code=499)
        finally:
            if not streaming:
                watcher.cancel()

    async def _sse(self, job: Job, first: tuple[str, Any], kind: str, rid: str, created: int,
                   include_usage: bool) -> AsyncIterator[str]:
        """The job's events as SSE, from its first (a piece, or done if there was no text). The chat's role chunk
        goes out in one write with the first piece: one wake-up of the client, not two."""
        def event(obj: dict[str, Any]) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        head = event(self._chunk(kind, rid, created, None, None, first=True)) if kind == "chat" else ""
        piece_of = self._token_piece
        told, offset = 0, 0  # logprobs: the tokens the chunks have carried, and their text's characters
        name, value = first
        while True:
            if name == "piece":
                t = time.thread_time()  # CPU time: waiting for the GIL the NPU thread holds is none
                text, picked = value
                shape = logprobs.shaped(kind, picked, piece_of, offset)
                if picked:
                    told += len(picked)
                    offset += sum(len(piece_of(p.token)[0]) for p in picked)
                yield head + event(self._chunk(kind, rid, created, text, None, picked=shape))
                head = ""
                if job.first_written_at is None:
                    job.first_written_at = time.monotonic()
                job.first_piece_sent.set()  # resumed: uvicorn has written it to the socket
                job.stream_s += time.thread_time() - t  # to JSON, SSE, through uvicorn to the socket
            elif name == "done":
                tail = "".join(event({**self._chunk(kind, rid, created, None, None), "choices": [choice]})
                               for choice in tool_call_deltas(value))
                rest = None if value.logprobs is None else value.logprobs[told:]  # tokens no piece carried (a stop)
                tail += event(self._chunk(kind, rid, created, None, value.finish_reason,
                                          picked=logprobs.shaped(kind, rest, piece_of, offset)))
                if include_usage:
                    tail += event({"id": rid, "object": self._chunk(kind, rid, created, None, None)["object"],
                                   "created": created, "model": self.model_id, "choices": [],
                                   "usage": _usage(value)})
                yield head + tail + "data: [DONE]\n\n"
                return
            elif name == "gone":
                return
            else:  # a failure or shutdown mid-stream: the status is sent already; say so in the stream
                yield head + event(_failure(name, value).body())
                return
            name, value = ("shutdown", None) if job.ending else await job.events.get()


def message(r: Completion) -> dict[str, Any]:
    """A chat reply's message: its text, or its tool calls (content null when there is no text, as OpenAI's)."""
    if not r.tool_calls:
        return {"role": "assistant", "content": r.text}
    return {"role": "assistant", "content": r.text or None, "tool_calls": list(r.tool_calls)}


def tool_call_deltas(r: Completion) -> list[dict[str, Any]]:
    """A streamed reply's tool calls as OpenAI streams them: per call, a delta with its index, id, type and
    name (arguments ""), then one with its arguments; the client concatenates the arguments by index."""
    out = []
    for i, call in enumerate(r.tool_calls):
        fn = call["function"]
        head = {"index": i, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
        for delta in (head, {"index": i, "function": {"arguments": fn["arguments"]}}):
            out.append({"index": 0, "delta": {"tool_calls": [delta]}, "logprobs": None, "finish_reason": None})
    return out


class _JobStream(StreamingResponse):
    """The SSE response, written by hand rather than by StreamingResponse's
    __call__, which under uvicorn's ASGI 2.3 runs each response in an anyio
    task group with a task of its own listening for the disconnect: here the
    request's watcher does that (it ends the stream with a "gone" event).
    However the response ends (done, client gone, server shutdown), the job is
    told and the watcher stopped."""

    def __init__(self, job: Job, watcher: asyncio.Future, content: AsyncIterator[str], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.job, self.watcher = job, watcher

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk.encode(self.charset), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.watcher.cancel()
            self.job.cancel()
            await self.body_iterator.aclose()


async def _read_body(request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        raise HttpError(413, f"the request body is larger than {MAX_BODY} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise HttpError(413, f"the request body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _watch_disconnect(request: Request, job: Job) -> None:
    """When the client closes the connection: the job is cancelled (the NPU stops at its next token) and its
    handler or stream told, by a "gone" event after whatever the job has sent."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()
    job.events.put_nowait(("gone", None))


def _failure(event: str, value: Any) -> HttpError:
    """What a job's "error" or "shutdown" event tells its client: a bad request (400), the device failing (500,
    with the device's one line), the server shutting down (503), or a bug (500, no detail)."""
    if event == "shutdown":
        return HttpError(503, "the server shut down before the answer was complete", kind="server_error",
                         code="server_shutdown", headers={"Retry-After": "5"})
    if isinstance(value, RequestError):
        return HttpError.of(value)
    if isinstance(value, RkcError):
        return HttpError(500, f"the device failed during this request: {value}", kind="server_error",
                         code="device_error")
    return HttpError(500, "internal error", kind="server_error")
def _loading() -> JSONResponse:
    return _error(HttpError(503, "the model is loading; retry shortly", kind="server_error", code="loading",
                            headers={"Retry-After": "5"}))


def _error(exc: HttpError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _not_found(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 404)
    return _error(HttpError(status, f"no route {request.method} {request.url.path}", code="not_found"))


async def _server_error(request: Request, exc: Exception) -> Response:
    return _error(HttpError(500, "internal error", kind="server_error"))


def create_app(model: LlmModel | Callable[[], LlmModel], queue_size: int = 8, model_id: str | None = None,
               on_load: Callable[[LlmModel | None, BaseException | None], None] | None = None,
               api_keys: Iterable[str] = (), metrics_public: bool = False) -> Starlette:
    """The ASGI app; its worker thread starts with the model and stops at shutdown. `model`: the model, or
    a function loading it (with its kernels compiled), called in a thread at startup (`model_id` names it
    meanwhile), after which on_load(model, None) or on_load(None, the exception) is called. With api_keys,
    every path but /health, the chat page and (if metrics_public) /metrics needs one of them as its bearer
    token (auth.py)."""
    api_keys = list(api_keys)
    metrics = ServerMetrics()
    api = Api(None, None, model.name if not callable(model) else model_id or "model", metrics)
    description = openapi.describe()

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(description)

    def ready(loaded: LlmModel) -> None:
        worker = Worker(loaded, queue_size, metrics=metrics)
        loaded.grammar_tokenizer.prepare()  # for tools and response_format: built while the server waits
        api.model, metrics.model, api.model_id = loaded, loaded, loaded.name
        api.worker = metrics.worker = app.state.worker = worker  # last: from here requests are served

    def load() -> None:
        try:
            loaded = model()
        except BaseException as exc:
            if on_load is None:
                logging.getLogger(__name__).exception("loading the model failed")
            else:
                on_load(None, exc)
            return
        ready(loaded)
        if on_load is not None:
            on_load(loaded, None)

    routes = [Route("/", api.page), Route("/health", api.health), Route("/metrics", api.metrics),
              Route("/v1/models", api.models),
              Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/v1/completions", api.completions, methods=["POST"]), Route("/openapi.json", openapi_json)]
    loading = threading.Event()  # the load has begun: a second startup does not load again

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        if api.worker is not None and api.worker.stopped:  # started again after a shutdown (an in-process client)
            ready(api.model)
        elif callable(model) and not loading.is_set():
            loading.set()
            threading.Thread(target=load, name="rkc-load", daemon=True).start()
        yield
        if api.worker is not None:
            api.worker.stop()

    keys_middleware = [Middleware(ApiKeyMiddleware, keys=api_keys, metrics_public=metrics_public)] if api_keys else []
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_found, 500: _server_error},
                    lifespan=lifespan, middleware=[Middleware(CountRequests, metrics=metrics), *keys_middleware])
    app.state.worker, app.state.metrics = None, metrics
    if not callable(model):
        ready(model)
    return app
