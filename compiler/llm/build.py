"""GGUF LLM -> rkbin: the graph from the frontend becomes one program per
prefill chunk size, one scoring program per chunk size (all logits, for
perplexity) and a decode program, all over one copy of the weights.

Module metadata (read by runtime/llm/engine.py):
  model_kind = "llm", llm = LlmConfig dict, precision, prefill_chunks,
  placement = {phase: "cpu" | "npu", ...} with the reason.
Blobs: "weights" (region "weights"), "tokenizer" (JSON, host only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from compiler.frontend.gguf import GgufFile, graph_from_gguf
from compiler.llm.weights import dequantize_all, encode, pack
from compiler.llm.calibrate import CALIBRATION_TEXT, activation_ranges
from compiler.llm.smooth import DEFAULT_ALPHA, smooth
from ir.errors import UnsupportedError
from ir.graph import Graph
from ir.program import Module, Program, Region, Step, TensorInfo
from ir.rkbin import write_rkbin
from runtime.llm.tokenizer import LlmTokenizer

DEFAULT_CHUNKS = (1, 32, 128, 512)
_DTYPE = {"float32": "fp32", "float16": "fp16", "int8": "int8"}


@dataclass
class LlmCompileOptions:
    precision: str = "int8"
    prefill_chunks: tuple[int, ...] = DEFAULT_CHUNKS
    smooth_alpha: float = DEFAULT_ALPHA  # int8 only; 0 disables SmoothQuant


@dataclass
class CompileReport:
    lines: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.lines.append(text)


def _weight_roles(graph: Graph) -> set[str]:
    """Constants read as matrices (Linear weights, Gather tables)."""
    roles = set()
    for op in graph.ops:
        if op.type in ("Linear", "Gather"):
            roles.add(op.inputs[0] if op.type == "Gather" else op.inputs[1])
    return roles


def _steps(graph: Graph, last_row_only: bool) -> list[Step]:
    steps = []
    for op in graph.topological_ops():
        inputs = list(op.inputs)
        if last_row_only and op.outputs[0] == "result_norm":
            # generation needs only the last row's logits (llama.cpp's inp_out_ids)
            steps.append(Step("cpu", "take_last", op="TakeLast", inputs=[inputs[0]], outputs=["last_row"]))
            inputs[0] = "last_row"
        steps.append(Step("cpu", op.outputs[0], op=op.type, inputs=inputs, outputs=list(op.outputs),
                          attrs=dict(op.attrs)))
    return steps


def compile_gguf(path: str | Path, out: str | Path, options: LlmCompileOptions) -> CompileReport:
    report = CompileReport()
    t0 = time.perf_counter()
    chunks = tuple(sorted(set(options.prefill_chunks) | {1}))
    if any(c <= 0 for c in chunks):
        raise UnsupportedError(f"prefill chunk sizes must be positive, got {list(options.prefill_chunks)}")
    gf = GgufFile(path)
    graph = graph_from_gguf(gf)
    cfg = gf.config()
    tokenizer = LlmTokenizer.from_gguf_fields(
        {k: f.contents() for k, f in gf.reader.fields.items() if k.startswith("tokenizer.")}, str(path))

    consts = [n for n, t in graph.tensors.items() if t.kind == "const"]
    weights = dequantize_all(gf, consts)
    if options.precision == "int8" and options.smooth_alpha > 0:
        ranges = activation_ranges(graph, cfg, weights, tokenizer)
        smoothed = smooth(graph, weights, ranges, options.smooth_alpha)
        report.say(f"int8: SmoothQuant (alpha {options.smooth_alpha}) on {len(smoothed)} of "
                   f"{len(_weight_roles(graph))} matrices, calibrated on {CALIBRATION_TEXT.name}")
    packed = encode(weights, _weight_roles(graph), options.precision)
    blob, where = pack(packed)
    tensors = []
    for t in packed:
        off, nbytes = where[t.name]
        tensors.append(TensorInfo(t.name, list(t.array.shape), _DTYPE[t.array.dtype.name], "row", "weights",
                                  off, nbytes, t.quant))
    for name, t in graph.tensors.items():
        if t.kind != "const":
            shape = [d if isinstance(d, int) else -1 for d in t.shape]
            tensors.append(TensorInfo(name, shape, t.dtype.value))
    tensors.append(TensorInfo("last_row", [1, cfg.n_embd], "fp32"))

    programs = [Program("decode", ["tokens", "positions"], ["logits"], _steps(graph, False))]
    for c in chunks:
        if c == 1:
            continue
        programs.append(Program(f"prefill_{c}", ["tokens", "positions"], ["logits"], _steps(graph, True)))
        programs.append(Program(f"score_{c}", ["tokens", "positions"], ["logits"], _steps(graph, False)))

    placement = {
        "prefill": "cpu", "decode": "cpu",
        "reason": "no NPU GEMM lowering in this build: every Linear runs as a CPU kernel computing "
                  f"the {options.precision} arithmetic the NPU would",
    }
    module = Module(
        regions=[Region("weights", max(len(blob), 1), "weights", "weights")],
        tensors=tensors, programs=programs,
        metadata={"model_kind": "llm", "llm": cfg.to_dict(), "precision": options.precision,
                  "prefill_chunks": list(chunks), "placement": placement,
                  "source": Path(path).name, "name": graph.name},
    )
    size = write_rkbin(out, module, {"weights": blob or b"\0", "tokenizer": tokenizer.to_json().encode()})
    report.say(f"{Path(path).name}: {cfg.arch}, {cfg.n_layer} layers, vocab {cfg.n_vocab}, "
               f"{options.precision} weights {len(blob) / 1e6:.1f} MB")
    report.say(f"programs: decode, " + ", ".join(f"prefill_{c}/score_{c}" for c in chunks if c > 1))
    report.say(f"placement: prefill {placement['prefill']}, decode {placement['decode']} ({placement['reason']})")
    report.say(f"wrote {out} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return report
