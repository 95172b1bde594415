"""Who may use the server: API keys, checked as a bearer token (OpenAI's
`Authorization: Bearer KEY`, what the openai client and llama-server send)
by an ASGI middleware in front of every route.

Every path needs a key except an explicit open set (/health for load
balancers, the chat page at /, /metrics when made public): a route added
later is closed by default. A request without a valid key gets its 401 from
the middleware, before the app sees it: its body is never read and nothing
reaches the NPU queue.

The presented token and each configured key are compared as SHA-256 digests
with hmac.compare_digest, over every key, without an early exit: the time
does not depend on how much of a key a guess matches, nor on which key it
is (only on the header's length, which says nothing about a key). The
check holds only the keys' digests; nothing here writes a key anywhere."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from pathlib import Path
from typing import Iterable, Mapping

from rkc.ir.errors import RkcError

ENV_VAR = "RKC_API_KEY"
MAX_KEY = 512  # characters; longer headers are refused without hashing them
OPEN_PATHS = frozenset({"/", "/health"})  # besides /metrics when it is public
KEY_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F))  # visible ASCII: what an HTTP header carries as is


def _check_key(key: str, where: str) -> str:
    # the message names where the key came from, never the key itself
    if not key:
        raise RkcError(f"{where}: an API key cannot be empty")
    if len(key) > MAX_KEY:
        raise RkcError(f"{where}: an API key is at most {MAX_KEY} characters")
    if not set(key) <= KEY_CHARS:
        raise RkcError(f"{where}: an API key is visible ASCII characters, without spaces")
    return key


def load_keys(keys: Iterable[str] = (), key_file: str | Path | None = None,
              environ: Mapping[str, str] | None = None) -> list[str]:
    """The API keys of `rkrun serve`: `keys` (--api-key), one a line of `key_file` (--api-key-file; blank lines
    skipped) and, when `environ` is given and `keys` is empty, its RKC_API_KEY (several: separated by spaces).
    RkcError, naming the source but not the key, for a key that cannot be sent in a header or an empty file."""
    found = [_check_key(k, "--api-key") for k in keys]
    if not found and environ is not None:
        found = [_check_key(k, ENV_VAR) for k in environ.get(ENV_VAR, "").split()]
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise RkcError(f"--api-key-file {key_file}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise RkcError(f"--api-key-file {key_file}: not UTF-8 text") from None
        in_file = [_check_key(line.strip(), f"--api-key-file {key_file}, line {n}")
                   for n, line in enumerate(lines, 1) if line.strip()]
        if not in_file:
            raise RkcError(f"--api-key-file {key_file}: no key in it (one key a line)")
        found += in_file
    return list(dict.fromkeys(found))


def exposure_warning(host: str, keys: Iterable[str]) -> str | None:
    """The warning line for a server reachable from other machines that anyone may use, else None."""
    if list(keys) or ipaddress.ip_address(host).is_loopback:
        return None
    shown = f"[{host}]" if ":" in host else host
    return (f"rkrun serve: warning: listening on {shown}, beyond this machine, with no API key: anyone who can "
            f"reach it can use the model (--api-key, --api-key-file or {ENV_VAR})")


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class KeyCheck:
    """Whether a token is one of the keys; the same work whichever key (or none) it matches."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(_check_key(k, "api_keys").encode("ascii")) for k in keys]
        if not self._digests:
            raise ValueError("KeyCheck needs at least one key")

    def __call__(self, token: bytes) -> bool:
        presented = _digest(token)
        match = False
        for digest in self._digests:  # every key, no early exit: which key matched does not show in the time
            match |= hmac.compare_digest(presented, digest)
        return match


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the request's one `Authorization: Bearer TOKEN` header (the scheme in any case, as RFC 7235
    says), or None: no such header, several, another scheme, no token, or longer than any key."""
    values = [v for k, v in headers if k == b"authorization"]
    if len(values) != 1 or len(values[0]) > len(b"Bearer ") + MAX_KEY:
        return None
    scheme, space, token = values[0].partition(b" ")
    if scheme.lower() != b"bearer" or not space or not token:
        return None
    return token


class ApiKeyMiddleware:
    """Pure ASGI: an HTTP (or websocket) request to a path outside the open set goes on only with a valid key;
    otherwise a 401 (websocket: closed, which the server answers with a 403) without a read of its body."""

    def __init__(self, app, keys: Iterable[str], metrics_public: bool = False) -> None:
        from starlette.responses import JSONResponse  # deferred, as the app: `rkrun serve --help` stays light

        from rkc.runtime.serve.schema import HttpError

        self.app, self.check = app, KeyCheck(keys)
        self.open_paths = OPEN_PATHS | ({"/metrics"} if metrics_public else set())
        # the two answers (no key, a wrong one), made once; neither repeats what the client sent
        self.refusals = {}
        for has_header, message in ((False, "this server needs an API key: send it as 'Authorization: Bearer KEY'"),
                                    (True, "the API key is not valid")):
            err = HttpError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            self.refusals[has_header] = JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        token = bearer_token(scope.get("headers", []))
        if token is not None and self.check(token):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        has_header = any(k == b"authorization" for k, _ in scope.get("headers", []))
        await self.refusals[has_header](scope, receive, send)

