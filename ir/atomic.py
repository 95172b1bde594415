"""The one way rkc writes an output file: all of it or nothing.

Every writer (rkbin, rkrun --outputs, inspect's DOT/SVG/PNG/JSON/CSV, probe
reports) writes into a temporary file beside the target and renames it over the
target only when the write finished. An existing output survives a failed or
interrupted write, and no temporary file is left behind: SIGTERM and SIGHUP,
whose default action would kill the process before any cleanup runs, are turned
into SystemExit while a write is under way so the cleanup below runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

# signals whose default action ends the process without unwinding the stack
_FATAL_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_active = 0  # writes under way in the main thread
_saved: dict[int, object] = {}


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """While active, SIGTERM/SIGHUP raise SystemExit (only the main thread can
    install handlers; elsewhere the caller's own handling applies)."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _active == 0:
        for sig in _FATAL_SIGNALS:
            current = signal.getsignal(sig)
            if current in (signal.SIG_DFL, None):
                _saved[sig] = signal.signal(sig, _exit_on_signal)
    _active += 1
    try:
        yield
    finally:
        _active -= 1
        if _active == 0:
            for sig, previous in _saved.items():
                signal.signal(sig, previous)
            _saved.clear()


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``
    with the umask's permissions (mkstemp would leave 0600), on any failure it is
    removed and ``path`` is untouched. ``suffix`` matters to writers that append
    one themselves (numpy's savez adds .npz to a name without it)."""
    target = Path(path)
    with _signals_unwind():
        tmp = None
        try:  # mkstemp inside the try: a signal right after it still removes the file
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent or ".")
            os.close(fd)
            yield tmp
            os.chmod(tmp, 0o666 & ~current_umask())
            os.replace(tmp, target)
        except BaseException:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            raise


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_output`."""
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
