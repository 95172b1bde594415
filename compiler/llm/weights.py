"""Compile-time weight preparation for an LLM: dequantize the GGUF blocks
(gguf.quants) to fp32, in numpy order. Encoding for the NPU (int8 per output
channel or fp16) happens in compiler/llm/build.py; packing into the native
weight layout in the GEMM emitter."""

from __future__ import annotations

import numpy as np

from rkc.compiler.frontend.gguf import GgufFile

def dequantize_all(gf: GgufFile, names: list[str]) -> dict[str, np.ndarray]:
    return {name: gf.dequantize(name) for name in names}
