"""Model files -> ir.Graph. The file's kind is recognised from its content, and
each kind has one loader in FRONTENDS."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from rkc.ir.errors import FormatError, UnsupportedError
from rkc.ir.graph import Graph

# kind -> "module:function" taking (path, **options) and returning a verified Graph
FRONTENDS: dict[str, str] = {
    "ir": "rkc.compiler.frontend.ir_text:load",
    "onnx": "rkc.compiler.frontend.onnx:load",
    "gguf": "rkc.compiler.frontend.gguf:load",
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
    kind = detect_kind(path)
    if kind not in FRONTENDS:
        raise UnsupportedError(f"{path}: {kind} models are not supported by this build of rkc")
    module, attr = FRONTENDS[kind].split(":")
    loader: Callable[..., Graph] = getattr(importlib.import_module(module), attr)
    return loader(path, **options)
