"""GGUF LLM -> rkbin. The stages:

  load (frontend graph) -> dequantize -> [int8: calibrate + SmoothQuant]
  -> encode (int8 per-channel / fp16) -> one program per phase (decode,
  prefill_C, score_C), lowered with compiler/llm/lower.py through the shared
  ModuleBuilder -> write (atomically), tokenizer JSON as a blob.

Programs: "decode" (1 token), "prefill_C" (C tokens, logits of the last one)
and "score_C" (C tokens, every row's logits: perplexity). Module metadata
(read by runtime/llm/engine.py): model_kind = "llm", llm = LlmConfig dict,
precision, prefill_chunks, placement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compiler.frontend.gguf import GgufFile, graph_from_gguf
from compiler.llm.calibrate import CALIBRATION_TEXT, activation_ranges
from compiler.llm.lower import EncodedWeight, LlmLowering, program_graph
from compiler.llm.smooth import DEFAULT_ALPHA, smooth
from compiler.llm.weights import PRECISIONS, dequantize_all
from compiler.module_builder import ModuleBuilder
from ir.errors import UnsupportedError
from ir.graph import Graph
from ir.rkbin import write_rkbin
from runtime.llm.tokenizer import LlmTokenizer
from runtime.llm.weights import quantize_rows

DEFAULT_CHUNKS = (1, 32, 128, 512)
# int8 is W8A8 throughout by default; `keep_fp16` makes a hybrid (e.g. ("ffn_down",):
# the FFN's gated activations are the hardest for per-token int8; docs/llm.md)
DEFAULT_KEEP_FP16: tuple[str, ...] = ()


@dataclass
class LlmCompileOptions:
    precision: str = "int8"
    prefill_chunks: tuple[int, ...] = DEFAULT_CHUNKS
    smooth_alpha: float = DEFAULT_ALPHA  # int8 only; 0 disables SmoothQuant
    # int8 only: products whose weight name contains one of these stay fp16 (hybrid)
    keep_fp16: tuple[str, ...] = DEFAULT_KEEP_FP16


@dataclass
class CompileReport:
    lines: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def say(self, text: str) -> None:
        self.lines.append(text)


def _matrix_names(graph: Graph) -> set[str]:
    """Constants read as matrices (Linear weights, Gather tables)."""
    names = set()
    for op in graph.ops:
        if op.type == "Linear":
            names.add(op.inputs[1])
        elif op.type == "Gather":
            names.add(op.inputs[0])
    return names


def _encode(w: np.ndarray, precision: str) -> EncodedWeight:
    if precision == "fp16":
        return EncodedWeight(w.astype(np.float16))
    q, scale = quantize_rows(w)
    return EncodedWeight(q, scale)


def program_plan(chunks: tuple[int, ...]) -> list[tuple[str, int, bool]]:
    """(program name, rows, last row only) for every program of the file."""
    plan = [("decode", 1, False)]
    for c in chunks:
        if c > 1:
            plan += [(f"prefill_{c}", c, True), (f"score_{c}", c, False)]
    return plan


def compile_gguf(path: str | Path, out: str | Path, options: LlmCompileOptions) -> CompileReport:
    report = CompileReport()
    t0 = time.perf_counter()
    if options.precision not in PRECISIONS:
        raise UnsupportedError(f"precision {options.precision!r} is not supported (choose {' or '.join(PRECISIONS)})")
    chunks = tuple(sorted(set(options.prefill_chunks) | {1}))
    if any(c <= 0 for c in chunks):
        raise UnsupportedError(f"prefill chunk sizes must be positive, got {list(options.prefill_chunks)}")

    def lap(stage: str) -> None:
        report.seconds[stage] = time.perf_counter() - t0 - sum(report.seconds.values())

    gf = GgufFile(path)
    graph = graph_from_gguf(gf)
    cfg = gf.config()
    tokenizer = LlmTokenizer.from_gguf_fields(
        {k: f.contents() for k, f in gf.reader.fields.items() if k.startswith("tokenizer.")}, str(path))
    lap("load")
    consts = [n for n, t in graph.tensors.items() if t.kind == "const"]
    weights = dequantize_all(gf, consts)
    lap("dequantize")
    if options.precision == "int8" and options.smooth_alpha > 0:
        ranges = activation_ranges(graph, cfg, weights, tokenizer)
        smoothed = smooth(graph, weights, ranges, options.smooth_alpha)
        report.say(f"int8: SmoothQuant (alpha {options.smooth_alpha}) on {len(smoothed)} matrices, "
                   f"calibrated on {CALIBRATION_TEXT.name}")
        lap("calibrate")
    def precision_of(name: str) -> str:
        if options.precision == "int8" and any(k in name for k in options.keep_fp16):
            return "fp16"
        return options.precision

    matrices = {n: _encode(weights[n], precision_of(n)) for n in _matrix_names(graph)}
    kept = sorted(n for n in matrices if precision_of(n) != options.precision)
    if kept:
        report.say(f"int8: {len(kept)} products kept fp16 ({', '.join(options.keep_fp16)}): "
                   f"{sum(matrices[n].data.nbytes for n in kept) / 1e6:.1f} MB")
    vectors = {n: w.astype(np.float32) for n, w in weights.items() if n not in matrices}
    del weights
    lap("encode")
    head = [op for op in graph.ops if op.outputs == ["logits"] or op.outputs[0] == "logits"][0].inputs[1]
    gather = [op for op in graph.ops if op.type == "Gather"][0].inputs[0]
    placement = {"prefill": "npu", "decode": "npu",
                 "reason": "every matrix product on the NPU; norms, RoPE, attention over the KV cache, "
                           "softmax and the conversions at segment edges on the CPU"}
    builder = ModuleBuilder(metadata={
        "model_kind": "llm", "llm": cfg.to_dict(), "precision": options.precision,
        "prefill_chunks": list(chunks), "placement": placement, "source": Path(path).name,
        "name": graph.name, "producer": "rkc", "programs": {}})
    lowering = LlmLowering(builder, options.precision, matrices, vectors, gather, head)
    plan = program_plan(chunks)
    for name, rows, last_only in plan:
        lowering.lower(program_graph(graph, name, rows, last_only), name)
        builder.metadata["programs"][name] = {"rows": rows, "last_row_only": last_only}
    lap("lower")
    module, blobs, _plans = builder.finish()
    blobs = {**blobs, "tokenizer": np.frombuffer(tokenizer.to_json().encode(), np.uint8)}
    size = write_rkbin(out, module, blobs)
    lap("write")
    weight_bytes = int(blobs["weights"].size) if "weights" in blobs else 0
    d = lowering.stats["decode"]
    report.say(f"{Path(path).name}: {cfg.arch}, {cfg.n_layer} layers, vocab {cfg.n_vocab}; "
               f"{options.precision} NPU weights {weight_bytes / 1e6:.1f} MB (one copy for {len(plan)} programs)")
    report.say(f"decode: {d.segments} NPU segments, {d.npu_tasks} tasks, {d.cpu_steps} CPU steps per token")
    for c in chunks:
        if c > 1:
            p = lowering.stats[f"prefill_{c}"]
            report.say(f"prefill_{c}: {p.segments} NPU segments, {p.npu_tasks} tasks, {p.cpu_steps} CPU steps")
    report.say(f"placement: {placement['reason']}")
    report.say(f"wrote {out} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return report
