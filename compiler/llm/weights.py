"""Compile-time weight preparation for an LLM: dequantize the GGUF blocks
(gguf.quants) and re-encode every tensor in the form its consumers need:

* matrices read by Linear/Gather: int8 + per-output-channel fp32 scale
  (--precision int8, W8A8) or fp16 (--precision fp16);
* vectors (norm weights, biases, RoPE frequency factors): fp32.

One copy per tensor, shared by every program (a tied embedding serves both the
embedding gather and the output head).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.frontend.gguf import GgufFile
from ir.errors import UnsupportedError
from runtime.llm.weights import quantize_rows

PRECISIONS = ("int8", "fp16")
ALIGN = 64


@dataclass
class PackedTensor:
    name: str
    array: np.ndarray
    quant: dict | None = None  # {"scale": name of the fp32 per-row scale tensor}


def dequantize_all(gf: GgufFile, names: list[str]) -> dict[str, np.ndarray]:
    return {name: gf.dequantize(name) for name in names}


def encode(weights: dict[str, np.ndarray], matrices: set[str], precision: str) -> list[PackedTensor]:
    if precision not in PRECISIONS:
        raise UnsupportedError(f"precision {precision!r} is not supported (choose {' or '.join(PRECISIONS)})")
    out: list[PackedTensor] = []
    for name, data in weights.items():
        if name not in matrices:
            out.append(PackedTensor(name, data.astype(np.float32)))
        elif precision == "fp16":
            out.append(PackedTensor(name, data.astype(np.float16)))
        else:
            q, scale = quantize_rows(data)
            out.append(PackedTensor(name, q, {"scale": f"{name}.scale"}))
            out.append(PackedTensor(f"{name}.scale", scale))
    return out


def pack(tensors: list[PackedTensor]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """One blob, each tensor ALIGN-aligned; returns (blob, name -> (offset, nbytes))."""
    parts, where, offset = [], {}, 0
    for t in tensors:
        raw = np.ascontiguousarray(t.array).tobytes()
        pad = -offset % ALIGN
        parts.append(b"\0" * pad)
        offset += pad
        where[t.name] = (offset, len(raw))
        parts.append(raw)
        offset += len(raw)
    return b"".join(parts), where
