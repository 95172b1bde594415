"""Where regcmd streams come from: raw dumps, captured golden cases, rkbin files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.npu.regcmd import as_entries
from rkc.ir.rkbin import read_rkbin

GGUF_MAGIC = b"GGUF"


def load_regcmd_streams(path: str | Path) -> list[tuple[str, np.ndarray]]:
    """Return (title, entries) for every regcmd stream held by the file at `path`."""
    path = Path(path)
    data = path.read_bytes()
    if data[:4] == GGUF_MAGIC:
        return read_rkbin(path).regcmd_streams()
    if data[:1] in (b"{", b"["):
        return _golden_streams(path, data)
    try:
        return [(path.name, as_entries(data))]
    except Exception as exc:  # not a multiple of 8 bytes
        raise FormatError(f"{path}: {exc}") from None


def _golden_streams(path: Path, data: bytes) -> list[tuple[str, np.ndarray]]:
    try:
        case = json.loads(data)
        streams = []
        for s, submit in enumerate(case["submits"]):
            for j, job in enumerate(submit["jobs"]):
                for t, task in enumerate(job["tasks"]):
                    entries = np.array([int(h, 16) for h in task["regcmd"]], dtype=np.uint64)
                    streams.append((f"submit {s} job {j} task {t}", entries))
    except (ValueError, KeyError, TypeError) as exc:
        raise FormatError(f"{path}: not a captured regcmd case ({type(exc).__name__}: {exc})") from None
    return streams
