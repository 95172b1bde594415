"""IR text files: parse and verify."""

from __future__ import annotations

from pathlib import Path

from rkc.ir.errors import FormatError, UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.text import parse_graph


def load(path: Path, input_shapes=None, bind=None) -> Graph:
    if input_shapes or bind:
        raise UnsupportedError(f"{path}: --input-shape and bound inputs apply to ONNX models; IR text declares its shapes")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise FormatError(f"{path}: IR text must be UTF-8") from None
    graph = parse_graph(text, source=str(path))
    graph.verify()
    return graph
