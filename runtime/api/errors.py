"""The error a bad request argument raises (its own module: llm.py, tools.py
and constrain.py all raise it; llm.py re-exports it)."""

from __future__ import annotations

from rkc.ir.errors import RkcError


class RequestError(RkcError):
    """A bad argument to generate/chat; `param` names it (the server's 400 says which)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code
