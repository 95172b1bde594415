"""What stands between the first token and the client, pinned without timing:
the accepted connections run without Nagle's algorithm, and a streamed job's
first piece has been handed to uvicorn (which writes it to the socket at
once) before the model computes the next token (the event loop shares the
GIL with the NPU thread: left to compete, it wrote the piece a few GIL
switches later)."""

from __future__ import annotations

import json
import socket
import threading
from types import SimpleNamespace

from rkc.runtime.api.llm import CacheStats, Completion, CompletionStream
from rkc.runtime.llm.generate import Timings

from serve.conftest import Http

FIRST, SECOND = "Hello", " there"


class LookingModel:
    """The part of LlmModel the server uses. Its stream, asked for the second
    piece, notes what the server has sent so far (`sent`, kept by the test's
    middleware)."""

    name, n_ctx, cache_slots, kv_bytes = "look", 64, 1, 0

    def __init__(self, sent: list[bytes]) -> None:
        self.stats = CacheStats()
        self.engine = SimpleNamespace(times=SimpleNamespace(npu_s=0.0, cpu_s=0.0))
        self.grammar_tokenizer = SimpleNamespace(prepare=lambda: None)  # (built for constrained requests)
        self.timings = Timings()  # of the latest request (/metrics reads them)
        self.sent = sent
        self.sent_before_second: bytes | None = None

    def chat(self, messages, *, stream: bool, cancel: threading.Event, **options) -> CompletionStream:
        box: list[Completion] = []

        def pieces():
            yield FIRST
            self.sent_before_second = b"".join(self.sent)
            yield SECOND
            box.append(Completion(FIRST + SECOND, "length", 3, 2, 0))

        return CompletionStream(pieces(), box)


def recording(sent: list[bytes]):
    """An ASGI middleware keeping each response body chunk once uvicorn has taken it."""
    def wrap(app):
        async def recorded(scope, receive, send):
            async def send_and_note(message):
                await send(message)
                if message["type"] == "http.response.body":
                    sent.append(message["body"])
            await app(scope, receive, send_and_note)
        return recorded
    return wrap


def test_the_first_piece_is_sent_before_the_next_token_is_computed(serve):
    sent: list[bytes] = []
    model = LookingModel(sent)
    server = serve(model, wrap=recording(sent))
    with Http(server.url) as h:
        r = h.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True})
        events = [line for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[1:3]] == [FIRST, SECOND]
    before = model.sent_before_second.decode()
    assert json.dumps(FIRST) in before and json.dumps(SECOND) not in before


def test_the_role_chunk_goes_out_in_one_write_with_the_first_piece(serve):
    """One body message for both (one wake-up of the client, not two), then
    the next piece, the finish, the usage and [DONE]; and a kept-alive
    connection serves the next request after the stream's end."""
    sent: list[bytes] = []
    server = serve(LookingModel(sent), wrap=recording(sent))
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": {"include_usage": True}}
    with Http(server.url) as h:
        for _ in range(2):
            sent.clear()
            r = h.request("POST", "/v1/chat/completions", body)
            assert r.status == 200 and r.read().decode().endswith("data: [DONE]\n\n")
            chunks = [c.decode() for c in sent if c]
            head = [json.loads(e[6:]) for e in chunks[0].split("\n\n") if e]
            assert [c["choices"][0]["delta"] for c in head] == [{"role": "assistant", "content": ""},
                                                                {"content": FIRST}]
            assert json.dumps(SECOND) in chunks[1] and chunks[-1].endswith("data: [DONE]\n\n")


def test_accepted_connections_send_without_nagle(serve, tiny_model):
    server = serve(tiny_model)
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(12) == b"HTTP/1.1 200"
        (connection,) = server.server.server_state.connections  # uvicorn's protocol for this client
        accepted = connection.transport.get_extra_info("socket")
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
