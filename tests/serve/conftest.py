"""A tiny chat model (the synthetic qwen3 GGUF with the ChatML template, compiled)
and real servers on 127.0.0.1 with an ephemeral port, run in a thread."""

from __future__ import annotations

import json
import threading

import pytest

from llm.conftest import synth_dir, synth_gguf, synth_rkbin  # noqa: F401 (fixtures shared with tests/llm)
from llm.synth import CHATML, write_model


@pytest.fixture(scope="session")
def tiny_chat_rkbin(tmp_path_factory):
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    d = tmp_path_factory.mktemp("serve")
    gguf = write_model(d / "tiny-chat.gguf", "qwen3", chat_template=CHATML)
    out = d / "tiny-chat.rkbin"
    compile_gguf(gguf, out, LlmCompileOptions("fp16", (1, 4, 16)))
    return out


class RunningServer:
    """`rkrun serve`'s app and uvicorn server, in a thread; .url is its address."""

    def __init__(self, model, queue_size: int = 8, wrap=None, **options) -> None:
        from rkc.runtime.serve.app import create_app
        from rkc.runtime.serve.cli import listen, run_server, uvicorn_server

        self.model = model
        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.app = create_app(model, queue_size, **options)  # options: create_app's keywords (api_keys, ...)
        self.server = uvicorn_server(self.app if wrap is None else wrap(self.app))  # wrap: an ASGI middleware
        self.thread = threading.Thread(target=lambda: run_server(self.server, self.sock),
                                       daemon=True)
        self.thread.start()
        for _ in range(3000):  # bounded: 30 s (a loaded machine)
            if self.server.started:
                break
            self.thread.join(0.01)
        assert self.server.started, "the server did not start"

    @property
    def worker(self):
        return self.app.state.worker

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        assert not self.thread.is_alive()


@pytest.fixture
def serve():
    """serve(model, queue_size=8, wrap=None, **create_app's keywords) -> a RunningServer, stopped after the test."""
    running = []

    def start(model, queue_size: int = 8, wrap=None, **options) -> RunningServer:
        running.append(RunningServer(model, queue_size, wrap, **options))
        return running[-1]

    yield start
    for s in running:
        s.stop()


@pytest.fixture(scope="module")
def tiny_model(tiny_chat_rkbin):
    import rkc

    with rkc.load(tiny_chat_rkbin, device="sim") as model:
        yield model


@pytest.fixture(scope="module")
def reference_model(tiny_chat_rkbin):
    """A second copy, for answers computed without the server (and without its cache)."""
    import rkc

    with rkc.load(tiny_chat_rkbin, device="sim", cache_slots=1) as model:
        yield model


class Http:
    """Plain HTTP/1.1 to the server (stdlib http.client), for what the openai client hides."""

    def __init__(self, url: str, timeout: float = 60) -> None:
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)

    def request(self, method: str, path: str, body=None, headers: dict | None = None):
        """The response (read it, or iterate .readline() for a stream)."""
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        self.conn.request(method, path, body=body, headers=headers)
        return self.conn.getresponse()

    def json(self, method: str, path: str, body=None, headers: dict | None = None):
        r = self.request(method, path, body, headers)
        return r.status, dict(r.getheaders()), json.loads(r.read() or b"null")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Http":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def get_json(url: str, path: str):
    with Http(url) as h:
        return h.json("GET", path)[2]


def post_json(url: str, path: str, body):
    """(status, headers, parsed body) of one POST."""
    with Http(url) as h:
        return h.json("POST", path, body)
