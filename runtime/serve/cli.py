"""`rkrun serve model.rkbin`: load the model, then serve it with uvicorn until
interrupted."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from pathlib import Path

import click

from rkc.ir.cli_support import ErrorReportingCommand, debug_option
from rkc.ir.errors import RkcError
from rkc.runtime.devices import device_options
from rkc.runtime.serve.auth import ENV_VAR, exposure_warning, load_keys


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: any free one); RkcError if the address is unusable."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        raise RkcError(f"--host {host!r} is not an IP address") from None
    # IPPROTO_TCP named, not 0: the accepted sockets inherit it, and asyncio sets TCP_NODELAY only on a socket whose
    # proto says TCP. With 0 Nagle's algorithm stayed on, so an SSE event could wait for the client's (delayed, up
    # to 40 ms) ACK of the one before; loopback ACKs at once, so the bench never saw it: a network client would.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise RkcError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def uvicorn_server(app, grace_s: float = 5.0, on_shutdown=None):
    """A uvicorn server for `app`; run_server(server, listen(...)) runs it until stopped.
    HTTP parsed by httptools (C) rather than h11 (Python): with uvloop (run_server) the event loop's CPU time
    for a streamed 8-token chat fell by 37 % (bench, null device); the loop shares the GIL with the NPU thread.
    Shutdown (SIGTERM, Ctrl-C): the socket closes, then on_shutdown(grace_s) (the worker's drain: requests in
    flight may finish within grace_s, then are ended with a last event); uvicorn cancels what is left a second
    later."""
    import uvicorn  # deferred: the HTTP server, once `rkrun serve` runs (not for its --help)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            if on_shutdown is not None:
                on_shutdown(grace_s)
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=grace_s + 1,
                                 lifespan="on", http="httptools"))


class Stopped(Exception):
    """SIGTERM: uvicorn shut the server down, then raised the signal again for whoever handles it (here)."""


def _stopped(signum, frame) -> None:
    raise Stopped


def run_server(server, sock: socket.socket) -> None:
    """Serve on `sock` until the server is told to stop, on a uvloop event loop (libuv's, in C)."""
    import uvloop  # deferred as uvicorn

    uvloop.run(server.serve(sockets=[sock]))


@click.command(cls=ErrorReportingCommand, context_settings={"help_option_names": ["-h", "--help"]})
@debug_option
@click.argument("model", type=click.Path(dir_okay=False, exists=True))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback: only this machine; 0.0.0.0 exposes the model to the network).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0: any free port.")
@click.option("--ctx", type=click.IntRange(min=2), default=None, help="Context size (default: the model's).")
@click.option("--queue", "queue_size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests that may wait for the NPU; beyond that: 503 with Retry-After.")
@click.option("--cache-slots", type=click.IntRange(min=1), default=2, show_default=True,
              help="Conversations whose KV the prefix cache keeps.")
@click.option("--grace", "grace_s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="At SIGTERM or Ctrl-C: seconds the requests in flight may take to finish before they are ended.")
@click.option("--chat-template", "template_file", type=click.Path(dir_okay=False, exists=True),
              help="A Jinja chat template file, for a GGUF that has none (or to replace its own).")
@click.option("--api-key", "api_keys", multiple=True, metavar="KEY",
              help=f"A key clients must send (Authorization: Bearer KEY); repeatable. Default: ${ENV_VAR} "
                   "(several: separated by spaces). A file or the variable keeps it out of the process list.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="A file of keys, one a line (with --api-key: any of them is accepted).")
@click.option("--metrics-public", is_flag=True, help="/metrics answers without a key (the default: it needs one).")
@device_options
def serve(model: str, host: str, port: int, ctx: int | None, queue_size: int, cache_slots: int, grace_s: float,
          template_file: str | None, api_keys: tuple[str, ...], api_key_file: str | None, metrics_public: bool,
          device: str, cores: int) -> None:
    """Serve MODEL (an LLM .rkbin) over an OpenAI-compatible HTTP API and a chat page at /."""
    from rkc.ir.rkbin import read_rkbin
    from rkc.runtime.api import load
    from rkc.runtime.serve.app import create_app

    keys = load_keys(api_keys, api_key_file, os.environ)
    rk = read_rkbin(model)
    if rk.module.metadata.get("model_kind") != "llm":
        raise RkcError(f"{model}: not an LLM rkbin (rkrun serve serves LLMs)")
    sock = listen(host, port)
    template = Path(template_file).read_text(encoding="utf-8") if template_file else None
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    failed: list[BaseException] = []
    server = None

    def loaded(llm, error) -> None:  # in the loading thread
        if error is not None:
            failed.append(error)
            server.should_exit = True
            return
        click.echo(f"rkrun serve: {llm.name} ready (context {llm.n_ctx}, queue {queue_size}, "
                   f"{cache_slots} cache slots, chat template {llm.chat_template_source})", err=True)

    def drain(grace: float) -> None:  # at shutdown; no worker yet if the model was still loading
        if app.state.worker is not None:
            app.state.worker.drain(grace)

    # the socket answers at once: /health says 503 "loading" until the model is loaded and its kernels compiled
    app = create_app(lambda: load(rk, device=device, cores=cores, ctx=ctx, cache_slots=cache_slots,
                                  chat_template=template),
                     queue_size, model_id=Path(rk.path).stem, on_load=loaded, api_keys=keys,
                     metrics_public=metrics_public)
    server = uvicorn_server(app, grace_s, drain)
    click.echo(f"rkrun serve: {Path(rk.path).stem} on {url} (loading: /health says 503 until ready)", err=True)
    warning = exposure_warning(host, keys)
    if warning:
        click.echo(warning, err=True)
    signal.signal(signal.SIGTERM, _stopped)  # (uvicorn handles it while serving, then raises it again: exit 0)
    try:
        run_server(server, sock)
        if server.should_exit and not failed:  # a signal uvicorn shut down on, raised again into asyncio's SIGINT
            click.echo("rkrun serve: stopped", err=True)  # handler, which ended the loop without an exception
    except (KeyboardInterrupt, Stopped):  # uvicorn re-raises the Ctrl-C or SIGTERM it shut down on: a normal stop
        click.echo("rkrun serve: stopped", err=True)
    finally:
        sock.close()
        worker = app.state.worker
        if worker is not None:
            worker.model.close()
    if failed:
        error = failed[0]
        if isinstance(error, RkcError):
            raise error
        raise RkcError(f"loading {model} failed: {type(error).__name__}: {error}")
