"""The number formats rkc compiles to, and the default for each model kind (one
table: `rkc compile --help` shows it, BuildOptions and LlmCompileOptions take
their defaults from it)."""

from __future__ import annotations

PRECISIONS = ("fp16", "int4", "int8")
# int4: 4-bit weights on the NPU's int4 GEMM, GGUF LLMs only (compiler/llm/int4.py)
PRECISION_KINDS = {"fp16": ("onnx", "ir", "gguf"), "int8": ("onnx", "ir", "gguf"), "int4": ("gguf",)}

# model kind (compiler/frontend.detect_kind) -> the precision it compiles to unless told:
# ONNX and IR text in fp16 (int8 needs a calibration set); GGUF LLMs in int8
# (weights calibrated on the built-in text, a measured fp16 hybrid: docs/llm.md)
DEFAULT_PRECISION = {"onnx": "fp16", "ir": "fp16", "gguf": "int8"}
KINDS = tuple(DEFAULT_PRECISION)
KIND_NAMES = {"onnx": "ONNX", "ir": "IR text", "gguf": "GGUF LLM"}
