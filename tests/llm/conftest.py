"""Fixtures: tiny synthetic GGUFs per architecture, compiled once per session."""

from __future__ import annotations

import numpy as np
import pytest

from llm.synth import SHAPES, write_model

ARCHS = sorted(SHAPES)


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="session")
def synth_gguf(synth_dir):
    paths = {}

    def get(arch: str):
        if arch not in paths:
            paths[arch] = write_model(synth_dir / f"{arch}.gguf", arch)
        return paths[arch]

    return get


@pytest.fixture(scope="session")
def synth_rkbin(synth_dir, synth_gguf):
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    built = {}

    def get(arch: str, precision: str = "fp16", chunks: tuple[int, ...] = (1, 4, 16), alpha: float | None = None,
            keep: tuple[str, ...] = (), **int8):
        """int8: alpha (SmoothQuant), rounding=..., scales=..., fp16_share=..., rotation=...
        (LlmCompileOptions; its defaults otherwise)."""
        if alpha is not None:
            int8["smooth_alpha"] = alpha
        key = (arch, precision, chunks, alpha, keep, tuple(sorted(int8.items())))
        if key not in built:
            tag = "-".join(f"{k}={v}" for k, v in sorted(int8.items()))
            out = synth_dir / f"{arch}-{precision}-{'_'.join(map(str, chunks))}-{alpha}-{'_'.join(keep)}-{tag}.rkbin"
            compile_gguf(synth_gguf(arch), out, LlmCompileOptions(precision, chunks, keep_fp16=keep, **int8))
            built[key] = out
        return built[key]

    return get


def cosine(a, b) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def teacher_forced(engine, tokens: list[int], prompt_len: int) -> np.ndarray:
    """Logits for every position: prefill the prompt in chunks, then decode
    the rest one token at a time (feeding the given tokens)."""
    from rkc.runtime.llm.generate import Generator

    gen = Generator(engine, 64)
    gen.cache.reset()
    rows = [gen._forward(tokens[:prompt_len], 0, all_logits=True)]
    for pos in range(prompt_len, len(tokens)):
        rows.append(engine.run("decode", np.asarray([tokens[pos]], np.int32), np.asarray([pos], np.int32), gen.cache))
    return np.concatenate(rows)


def emulation(gguf, tokenizer, **options):
    """The CPU emulation of an int8 compile (tools/llm_quant_eval.py's): the
    compiler's own weight preparation, run on the runtime's CPU kernels with
    the compiled arithmetic; returns (GraphRunner, encoded matrices, report)."""
    from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
    from rkc.compiler.llm.build import CompileReport, LlmCompileOptions, prepare_weights
    from rkc.compiler.llm.calibrate import GraphRunner
    from rkc.compiler.llm.prefill_fp16 import emulated
    from rkc.compiler.llm.weights import dequantize_all
    from rkc.runtime.llm.weights import Weight

    gf = GgufFile(gguf)
    graph, cfg = graph_from_gguf(gf), gf.config()
    weights = dequantize_all(gf, [n for n, t in graph.tensors.items() if t.kind == "const"])
    report = CompileReport()
    matrices, vectors = prepare_weights(graph, cfg, tokenizer, weights, LlmCompileOptions("int8", **options), report)
    cpu = {n: Weight(v) for n, v in vectors.items()} | emulated(matrices)
    return GraphRunner(graph, cfg, cpu, 256), matrices, report


def emulated_logits(runner, tokens: list[int], prompt_len: int, chunks, npu_s=None) -> np.ndarray:
    """teacher_forced's rows from the emulation: the prompt in the engine's
    chunks, in the generator's plan (`npu_s`: engine.npu_seconds(True), as
    teacher_forced's prefill plans it; a padded chunk's real rows), then
    token by token. On one BLAS
    thread, as the runtime's host kernels run (runtime/blas.py): a product's
    bits depend on the thread count, which earlier code may have changed."""
    from rkc.runtime import blas
    from rkc.runtime.llm.generate import chunk_plan

    runner.reset()
    rows, pos = [], 0
    with blas.one_thread():
        for _c, n in chunk_plan(prompt_len, chunks, npu_s):
            rows.append(runner.logits(tokens[pos:pos + n], pos))
            pos += n
        rows += [runner.logits([t], p) for p, t in enumerate(tokens[prompt_len:], prompt_len)]
    return np.concatenate(rows)
