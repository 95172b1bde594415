"""API keys for `rkrun serve` (runtime/serve/auth.py): the real openai
client with a key chats and streams, with a wrong one gets its
AuthenticationError; every path but the open ones (/health, the chat page,
/metrics when public) needs the key, including routes added after the app
was made and paths that do not exist; malformed Authorization headers get a
401, never a 5xx; a refusal comes before the body is read or anything is
queued; the key check's time does not follow how much of a key a guess
matches; where keys come from, and the warning for an open server."""

from __future__ import annotations

import hmac
import json
import random
import os
import signal
import socket
import statistics
import string
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from rkc.ir.errors import RkcError
from rkc.runtime.serve import auth
from rkc.runtime.serve.auth import KeyCheck, bearer_token, exposure_warning, load_keys
from serve.conftest import Http

_rng = random.Random(36)
ALPHABET = string.ascii_letters + string.digits + "-_."


def random_key(n: int = 40) -> str:
    return "".join(_rng.choice(ALPHABET) for _ in range(n))


KEYS = [random_key(), random_key(24)]
RKRUN = Path(sys.executable).parent / "rkrun"
CHAT = [{"role": "user", "content": "hello the world"}]


@pytest.fixture
def server(serve, tiny_model):
    tiny_model.forget()
    return serve(tiny_model, api_keys=KEYS)


def client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def raw(url: str, request: bytes, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """One request written as given (any header bytes), its response's status, headers and body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while not request.startswith(b"HEAD ") and len(body) < int(headers.get("content-length", 0)):
            chunk = s.recv(65536)
            assert chunk
            body += chunk
    return int(lines[0].split()[1]), headers, body


def get(path: str, auth_lines: bytes = b"", method: bytes = b"GET") -> bytes:
    return method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth_lines + b"Connection: close\r\n\r\n"


def assert_refused(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 401 and headers["www-authenticate"] == "Bearer", (status, body)
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"


# -- the openai client ------------------------------------------------------------------------------------------

def test_openai_client_with_a_key_chats_and_streams(server, reference_model):
    reference_model.forget()
    want = reference_model.chat(CHAT, max_tokens=8, temperature=0).text
    for key in KEYS:  # every configured key
        c = client(server, key)
        assert c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=8,
                                         temperature=0).choices[0].message.content == want
        chunks = c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=8, temperature=0, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
        assert [m.id for m in c.models.list().data] == ["tiny-chat"]


def test_openai_client_with_a_wrong_or_no_key_raises_authentication_error(server):
    requests_before = server.model.stats.requests
    wrong = [KEYS[0][:-1], KEYS[0] + "x", KEYS[0].upper(), KEYS[1][:-1] + "!", random_key()]
    # None: no Authorization header at all (the client always has a key; Omit() drops the header it makes)
    for key in [*wrong, None]:
        c = client(server, key or "unused")
        extra = {"extra_headers": {"Authorization": openai.Omit()}} if key is None else {}
        calls = [lambda: c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=4, **extra),
                 lambda: c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=4, stream=True,
                                                   **extra),
                 lambda: c.completions.create(model="tiny-chat", prompt="the cat", max_tokens=4, **extra),
                 lambda: c.models.list(**extra)]
        for call in calls:
            with pytest.raises(openai.AuthenticationError) as exc:
                call()
            assert exc.value.status_code == 401 and exc.value.code == "invalid_api_key"
            assert exc.value.response.headers["www-authenticate"] == "Bearer"
            assert ("not valid" if key else "needs an API key") in exc.value.message
            assert key is None or key not in exc.value.response.text  # the refusal does not echo what was sent
    assert server.model.stats.requests == requests_before and server.worker.status()["jobs"] == []


# -- what each path requires --------------------------------------------------------------------------------------

def answered_without_key(server) -> set[str]:
    """Every route of the app (whatever was added to it) and a few that do not exist, each with its methods: the
    ones that answer something other than a 401 without a key."""
    probes = {(m, r.path) for r in server.app.routes for m in (r.methods or {"GET"})}
    probes |= {("GET", p) for p in ("/nope", "/health/", "//health", "/HEALTH", "/v1", "/v1/", "/v1/models/",
                                    "/metrics/", "/index.html", "/static/chat.html")}
    probes |= {("POST", "/"), ("POST", "/health"), ("DELETE", "/v1/models"), ("OPTIONS", "/v1/chat/completions")}
    answered = set()
    for method, path in sorted(probes):
        status, headers, body = raw(server.url, get(path, method=method.encode()))
        assert status < 500, (method, path, status)
        if status != 401:
            answered.add(path)
        elif method == "HEAD":  # no body
            assert headers["www-authenticate"] == "Bearer" and body == b""
        else:
            assert_refused(status, headers, body)
    return answered


def test_only_health_and_the_page_answer_without_the_key(server):
    assert answered_without_key(server) == {"/", "/health"}
    with Http(server.url) as h:
        assert h.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEYS[1]}"}).read().startswith(b"# HELP rkc_")
        status, _, health = h.json("GET", "/health")
    assert status == 200 and health["status"] == "ok"
    assert not any(k in json.dumps(health) for k in KEYS)


def test_metrics_public(serve, tiny_model):
    s = serve(tiny_model, api_keys=KEYS, metrics_public=True)
    assert answered_without_key(s) == {"/", "/health", "/metrics"}
    status, _, body = raw(s.url, get("/metrics"))
    assert status == 200 and body.startswith(b"# HELP rkc_") and not any(k.encode() in body for k in KEYS)


def test_no_keys_no_check(serve, tiny_model):
    s = serve(tiny_model)
    assert raw(s.url, get("/v1/models"))[0] == 200


# -- malformed headers, and refusing early ------------------------------------------------------------------------

def test_malformed_authorization_headers_get_401(server):
    key = KEYS[0].encode()
    bad = [b"", b"Bearer", b"Bearer ", b"Bearer  " + key, b"Bearer" + key, b"Basic " + key, b"Token " + key,
           b"Bearer " + key + b" extra", b"Bearer " + key[:-1], b"Bearer \xff\xfe\x80" + key,
           b"bearer", b"Bearer " + key + b"," + KEYS[1].encode(), b"Bearer " + b"A" * 600,
           b"Bearer " + b"B" * 60_000, b"Bearer " + b"C" * 1_000_000, b"Bearer " + key + b"A" * 60_000]
    for value in bad:
        assert_refused(*raw(server.url, get("/v1/models", b"Authorization: " + value + b"\r\n")))
    # a byte no HTTP parser takes in a header (NUL): uvicorn's 400 before the app, still no 5xx
    assert raw(server.url, get("/v1/models", b"Authorization: Bearer \x00" + key + b"\r\n"))[0] == 400
    # two Authorization headers, even one of them right: refused (which would count is unclear)
    twice = b"Authorization: Bearer " + key + b"\r\nAuthorization: Bearer wrong\r\n"
    assert_refused(*raw(server.url, get("/v1/models", twice)))
    assert_refused(*raw(server.url, get("/v1/models", twice.replace(b"wrong", key))))
    # the scheme's case does not matter (RFC 7235); the key's does
    assert raw(server.url, get("/v1/models", b"authorization: bEaReR " + key + b"\r\n"))[0] == 200
    assert_refused(*raw(server.url, get("/v1/models", b"Authorization: Bearer " + key.swapcase() + b"\r\n")))


def test_refused_before_the_body_is_read_or_queued(server):
    jobs_before, requests_before = len(server.worker.status()["jobs"]), server.model.stats.requests
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer nope\r\nContent-Length: 900000\r\n\r\n")
    t = time.monotonic()
    status, headers, body = raw(server.url, head, timeout=10)  # no body sent: a server that read it would wait
    assert_refused(status, headers, body)
    assert time.monotonic() - t < 10
    # a refused request with its body sent leaves the kept-alive connection usable for the next one
    with Http(server.url) as h:
        r = h.request("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
        assert r.status == 401 and json.loads(r.read())["error"]["code"] == "invalid_api_key"
        assert h.json("GET", "/v1/models", headers={"Authorization": f"Bearer {KEYS[0]}"})[0] == 200
    assert len(server.worker.status()["jobs"]) == jobs_before and server.model.stats.requests == requests_before


# -- the comparison -----------------------------------------------------------------------------------------------

def test_every_key_is_compared_whichever_matches(monkeypatch):
    keys = [random_key() for _ in range(5)]
    calls, compare = [], hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    check = KeyCheck(keys)
    for token, want in [*((k, True) for k in keys), (random_key(), False), (keys[2][:-1], False), ("", False)]:
        calls.clear()
        assert check(token.encode()) is want
        assert len(calls) == len(keys) and all(len(a) == len(b) == 32 for a, b in calls)  # digests: equal lengths


def _median_ns(check, tokens: list[bytes], rounds: int = 400, batch: int = 20) -> list[float]:
    """Each token's median time per check (ns), the tokens interleaved round by round (the machine's load is
    spread over them alike)."""
    times = [[] for _ in tokens]
    for _ in range(rounds):
        for i, token in enumerate(tokens):
            t = time.perf_counter_ns()
            for _ in range(batch):
                check(token)
            times[i].append((time.perf_counter_ns() - t) / batch)
    return [statistics.median(t) for t in times]


def test_check_time_does_not_follow_the_matching_prefix():
    key = random_key(auth.MAX_KEY)
    other = next(c for c in ALPHABET if c != key[0])
    nothing = (other + key[1:]).encode()  # differs at the first character
    almost = (key[:-1] + next(c for c in ALPHABET if c != key[-1])).encode()  # at the last

    def leaky(token: bytes) -> bool:  # the kind of check this test must catch: it stops at the first difference
        for a, b in zip(token, key.encode()):
            if a != b:
                return False
        return len(token) == len(key)

    fast, slow = _median_ns(leaky, [nothing, almost], rounds=100)
    assert slow > 3 * fast  # the test sees a leak where there is one
    t_nothing, t_almost = _median_ns(KeyCheck([key, random_key()]), [nothing, almost])
    assert 0.67 < t_almost / t_nothing < 1.5, (t_nothing, t_almost)  # wide: a loaded machine; a leak is > 3x


def test_middleware_at_the_asgi_level():
    """What no HTTP test reaches: a websocket without a key is closed before the app sees it; lifespan events
    pass; the app gets the request's receive untouched (nothing read from it)."""
    import asyncio

    from rkc.runtime.serve.auth import ApiKeyMiddleware

    seen, sent = [], []

    async def app(scope, receive, send):
        seen.append((scope["type"], scope.get("path"), receive))

    async def send(message):
        sent.append(message)

    async def receive():  # reading the body of a request that is refused would be a failure
        raise AssertionError("the middleware read the request")

    mw = ApiKeyMiddleware(app, KEYS)
    ws = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    asyncio.run(mw(ws, receive, send))
    assert seen == [] and sent == [{"type": "websocket.close", "code": 1008}]
    asyncio.run(mw({**ws, "headers": [(b"authorization", f"Bearer {KEYS[1]}".encode())]}, receive, send))
    asyncio.run(mw({"type": "lifespan"}, receive, send))
    assert seen == [("websocket", "/v1/realtime", receive), ("lifespan", None, receive)]
    sent.clear()
    asyncio.run(mw({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"] and sent[0]["status"] == 401
    assert len(seen) == 2


def test_bearer_token():
    assert bearer_token([(b"authorization", b"Bearer abc")]) == b"abc"
    assert bearer_token([(b"authorization", b"BEARER abc")]) == b"abc"
    assert bearer_token([(b"x", b"Bearer abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer abc"), (b"authorization", b"Bearer abc")]) is None


# -- where the keys come from -------------------------------------------------------------------------------------

def test_load_keys(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"{KEYS[0]}\n\n  {KEYS[1]}  \n{KEYS[0]}\n")
    assert load_keys(key_file=f) == KEYS  # blank lines and ends of lines skipped, repeats once
    assert load_keys(["a1"], f) == ["a1", *KEYS]
    env = {"RKC_API_KEY": "e1 e2"}
    assert load_keys(environ=env) == ["e1", "e2"]
    assert load_keys(["a1"], environ=env) == ["a1"]  # the variable is the default of --api-key
    assert load_keys(key_file=f, environ=env) == ["e1", "e2", *KEYS]
    assert load_keys(environ={}) == [] and load_keys() == []


def test_bad_keys_are_one_error_without_the_key(tmp_path):
    secret = random_key()
    cases = {"empty.txt": "\n \n", "spaced.txt": f"{KEYS[0]}\n{secret} {secret}\n", "accent.txt": f"{secret}é\n",
             "long.txt": secret * 20 + "\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(RkcError) as exc:
            load_keys(key_file=tmp_path / name)
        assert secret not in str(exc.value) and name in str(exc.value)
    (tmp_path / "latin1.txt").write_bytes(b"\xe9\xe9\n")
    for path in (tmp_path / "latin1.txt", tmp_path / "missing.txt"):
        with pytest.raises(RkcError, match="--api-key-file"):
            load_keys(key_file=path)
    with pytest.raises(RkcError, match="line 2"):
        load_keys(key_file=tmp_path / "spaced.txt")
    for keys in ([""], [f"{secret}\n"], ["k\u00e9y"]):
        with pytest.raises(RkcError) as exc:
            load_keys(keys)
        assert secret not in str(exc.value)
    with pytest.raises(RkcError, match="RKC_API_KEY"):
        load_keys(environ={"RKC_API_KEY": "caf\u00e9"})


def test_exposure_warning():
    for host in ("0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "fe80::1"):
        line = exposure_warning(host, [])
        assert line is not None and "\n" not in line and "no API key" in line
        assert (f"[{host}]" if ":" in host else host) in line
        assert exposure_warning(host, KEYS) is None
    for host in ("127.0.0.1", "127.0.0.2", "::1"):
        assert exposure_warning(host, []) is None


# -- `rkrun serve` as a user runs it -------------------------------------------------------------------------------

def run_serve(rkbin, args: list[str], env_key: str | None) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "RKC_API_KEY"}
    if env_key is not None:
        env["RKC_API_KEY"] = env_key
    p = subprocess.Popen([str(RKRUN), "serve", str(rkbin), "--port", "0", "--device", "sim", *args],
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stderr.readline()
    assert line.startswith("rkrun serve: tiny-chat on http://127.0.0.1:"), line
    while " ready (" not in (ready := p.stderr.readline()):  # the socket answers at once; the model loads
        assert ready, "rkrun serve ended before the model was ready"
    return p, line.split(" on ")[1].split("/ ")[0]


def stop(p: subprocess.Popen) -> str:
    """SIGINT; what the process wrote on stderr after its first line."""
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    return err


def status_with(url: str, key: str | None, path: str = "/v1/models") -> int:
    return raw(url, get(path, b"" if key is None else f"Authorization: Bearer {key}\r\n".encode()))[0]


def test_rkrun_serve_keys_from_options_file_and_environment(tiny_chat_rkbin, tmp_path):
    given, in_file, in_env, wrong = [random_key() for _ in range(2)], [random_key(), random_key()], \
        [random_key(), random_key()], random_key()
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(in_file) + "\n")
    # --api-key and --api-key-file: both accepted; RKC_API_KEY is only the default of --api-key, so not here
    p, url = run_serve(tiny_chat_rkbin, ["--api-key", given[0], "--api-key", given[1], "--api-key-file", str(keys)],
                       " ".join(in_env))
    try:
        assert [status_with(url, k) for k in given + in_file] == [200] * 4
        assert [status_with(url, k) for k in [*in_env, wrong, None]] == [401] * 4
        assert status_with(url, None, "/health") == 200 and status_with(url, None, "/") == 200
        c = openai.OpenAI(base_url=url + "/v1", api_key=in_file[1], max_retries=0, timeout=60)
        assert c.chat.completions.create(model="tiny-chat", messages=CHAT, max_tokens=3).usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key=wrong, max_retries=0).models.list()
    finally:
        err = stop(p)
    # loopback: no warning; no key in anything it wrote (nor the wrong one a client sent)
    assert err == "rkrun serve: stopped\n" and not any(k in err for k in given + in_file + in_env + [wrong])


def test_rkrun_serve_bad_keys_are_one_line(tiny_chat_rkbin, tmp_path):
    secret = random_key()
    (tmp_path / "spaced.txt").write_text(f"{secret} {secret}\n")
    cases = [(["--api-key-file", str(tmp_path / "spaced.txt")], None, "line 1"),
             ([], f"{secret}\u00e9", "RKC_API_KEY")]  # the rest of load_keys' errors: test_bad_keys_are_one_error...
    for args, env_key, message in cases:
        env = {k: v for k, v in os.environ.items() if k != "RKC_API_KEY"}
        if env_key is not None:
            env["RKC_API_KEY"] = env_key
        r = subprocess.run([str(RKRUN), "serve", str(tiny_chat_rkbin), *args, "--port", "0"], capture_output=True,
                           text=True, timeout=60, env=env)
        assert r.returncode == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert secret not in r.stderr


def serve_in_process(rkbin, monkeypatch, args: list[str], env_key: str | None = None):
    """`rkrun serve` in this process (click's runner), its socket bound to 127.0.0.1 whatever --host says (tests
    listen on loopback only) and its server stopped before it serves: (its stderr lines, the app it made)."""
    from click.testing import CliRunner

    from rkc.runtime.serve import cli

    made = []

    def run_server(server, sock):  # no serving (so no lifespan: the model is never loaded): the app kept
        made.append(server.config.app)

    real_listen = cli.listen
    monkeypatch.setattr(cli, "listen", lambda host, port: real_listen("127.0.0.1", port))
    monkeypatch.setattr(cli, "run_server", run_server)
    if env_key is None:
        monkeypatch.delenv("RKC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("RKC_API_KEY", env_key)
    r = CliRunner().invoke(cli.serve, [str(rkbin), "--port", "0", "--device", "null", *args])
    assert r.exit_code == 0, r.output
    return r.stderr.splitlines(), made[0]


def auth_middleware(app):
    return next(m for m in app.user_middleware if "keys" in m.kwargs)


def app_keys(app) -> list[str]:
    """The keys create_app was given (its middleware's arguments)."""
    return [k for m in app.user_middleware for k in m.kwargs.get("keys", [])]


@pytest.mark.parametrize("host, keys, warned", [("0.0.0.0", [], True), ("::", [], True),
                                                ("0.0.0.0", ["--api-key", "k1"], False), ("127.0.0.1", [], False)])
def test_rkrun_serve_warns_when_open_beyond_loopback(tiny_chat_rkbin, monkeypatch, host, keys, warned):
    lines, _ = serve_in_process(tiny_chat_rkbin, monkeypatch, ["--host", host, *keys])
    assert lines[0].startswith("rkrun serve: tiny-chat on http://")
    shown = f"[{host}]" if ":" in host else host
    assert lines[1:] == ([exposure_warning(host, [])] if warned else [])
    assert not warned or f"listening on {shown}, beyond this machine, with no API key" in lines[1]
    print("\n" + "\n".join(lines))


def test_rkrun_serve_takes_the_variable_without_api_key(tiny_chat_rkbin, monkeypatch, tmp_path):
    in_env, in_file = [random_key(), random_key()], random_key()
    (tmp_path / "keys").write_text(in_file + "\n")
    _, app = serve_in_process(tiny_chat_rkbin, monkeypatch, ["--api-key-file", str(tmp_path / "keys")],
                              " ".join(in_env))
    assert app_keys(app) == [*in_env, in_file]
    _, app = serve_in_process(tiny_chat_rkbin, monkeypatch, ["--api-key", "k1", "--metrics-public"],
                              " ".join(in_env))
    assert app_keys(app) == ["k1"] and auth_middleware(app).kwargs["metrics_public"] is True
