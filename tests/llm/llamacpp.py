"""llama.cpp (PyPI llama-cpp-python) as the reference: tokens, greedy
continuations and perplexity computed the way rkrun computes them."""

from __future__ import annotations

import math

import numpy as np
import pytest


def load(path: str, n_ctx: int = 1024, logits_all: bool = False):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llama.cpp reference) is not installed")
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=512, logits_all=logits_all, verbose=False,
                           seed=0, n_threads=2)


def tokenize(model, text: str) -> list[int]:
    return model.tokenize(text.encode("utf-8"), add_bos=True, special=False)


def greedy(model, prompt: list[int], n: int) -> list[int]:
    model.reset()
    model.eval(prompt)
    out = []
    eos = model.token_eos()
    for _ in range(n):
        t = int(np.argmax(model.scores[model.n_tokens - 1]))
        if t == eos:
            break
        out.append(t)
        model.eval([t])
    return out


def greedy_with_margin(model, prompt: list[int], n: int) -> tuple[list[int], float]:
    """n greedy tokens (EOS included) and the smallest top-2 logit gap along the
    way: a gap near 0 is a near-tie any rounding may flip."""
    model.reset()
    model.eval(prompt)
    out, margin = [], np.inf
    for _ in range(n):
        logits = np.asarray(model.scores[model.n_tokens - 1])
        top = np.argsort(-logits)[:2]
        margin = min(margin, float(logits[top[0]] - logits[top[1]]))
        out.append(int(top[0]))
        model.eval([int(top[0])])
    return out, margin


def perplexity(model, tokens: list[int], ctx: int) -> tuple[float, int]:
    """Same windows as runtime/llm/generate.py: BOS-prefixed windows of ctx tokens."""
    bos = tokens[0]
    nll, count = 0.0, 0
    for s in range(0, len(tokens), ctx):
        window = tokens[s:s + ctx] if s == 0 else [bos, *tokens[s:s + ctx]]
        if len(window) < 2:
            continue
        model.reset()
        model.eval(window[:-1])
        logits = np.asarray(model.scores[: len(window) - 1], dtype=np.float64)
        logp = logits - logits.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        targets = np.asarray(window[1:])
        nll -= float(logp[np.arange(len(targets)), targets].sum())
        count += len(targets)
    return math.exp(nll / count), count
