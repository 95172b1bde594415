"""Model files -> ir.Graph. The file's kind is recognised from its content, and
each kind has one loader in FRONTENDS."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rkc.compiler.frontend import gguf, ir_text, onnx
from rkc.ir.errors import FormatError
from rkc.ir.graph import Graph

# kind -> loader taking (path, **options) and returning a verified Graph. The
# frontend modules are cheap to import: each imports its heavy parser library
# (onnx, gguf) inside the functions that read a file.
FRONTENDS: dict[str, Callable[..., Graph]] = {
    "ir": ir_text.load,
    "onnx": onnx.load,
    "gguf": gguf.load,
}


def detect_kind(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:4] == b"GGUF":
        return "gguf"
    if head.lstrip()[:5] == b"graph":
        return "ir"
    if path.suffix.lower() == ".onnx" or head[:1] == b"\x08":  # protobuf field 1 (ir_version)
        return "onnx"
    raise FormatError(f"{path}: not an ONNX model, a GGUF file or IR text")


def load_graph(path: str | Path, **options) -> Graph:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    return FRONTENDS[detect_kind(path)](path, **options)
