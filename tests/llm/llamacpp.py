"""llama.cpp (PyPI llama-cpp-python) as the reference: tokens, greedy
continuations and perplexity computed the way rkrun computes them."""

from __future__ import annotations

import math

import numpy as np
import pytest


def load(path: str, n_ctx: int = 1024, logits_all: bool = False):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llama.cpp reference) is not installed")
    return new_llama(path, n_ctx=n_ctx, n_batch=512, logits_all=logits_all, verbose=False, seed=0, n_threads=2)


def new_llama(path, **kwargs):
    """llama_cpp.Llama(path, **kwargs) without llama.cpp's extra CPU buffer
    types (use_extra_bufts off): its AMX repacking runs AMX tile instructions
    wherever the CPU lists AMX, and a machine whose kernel or hypervisor does
    not grant the tile state (this build machine's) dies of SIGILL on the
    first eval; the plain CPU kernels compute the same model."""
    import llama_cpp
    import llama_cpp.llama as module

    default = module.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    module.llama_cpp.llama_model_default_params = params
    try:
        return llama_cpp.Llama(str(path), **kwargs)
    finally:
        module.llama_cpp.llama_model_default_params = default


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


def greedy_with_gaps(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens (EOS included) and, per step, the top-2 logit gap: a gap
    near 0 is a near-tie any rounding may flip."""
    model.reset()
    model.eval(prompt)
    out, gaps = [], []
    for _ in range(n):
        logits = np.asarray(model.scores[model.n_tokens - 1])
        top = np.argsort(-logits)[:2]
        gaps.append(float(logits[top[0]] - logits[top[1]]))
        out.append(int(top[0]))
        model.eval([int(top[0])])
    return out, gaps


def teacher_forced_logits(model, tokens: list[int], ctx: int):
    """llama.cpp's logits per window rkrun --perplexity / --logits cut: yields
    (window, logits [len - 1, vocab]), row i predicting window[i + 1]."""
    from rkc.runtime.llm.generate import Generator

    for window in Generator.windows(tokens, ctx):
        model.reset()
        model.eval(window[:-1])
        # a copy: the next window's eval overwrites model.scores (a caller keeping windows kept the last one)
        yield window, np.array(model.scores[: len(window) - 1], dtype=np.float32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


class Agreement:
    """Teacher-forced agreement with llama.cpp, window by window (a 262k
    vocabulary makes whole-text arrays gigabytes): mean KL(llama.cpp || rkc)
    per predicted token, top-1 agreement, both perplexities."""

    def __init__(self) -> None:
        self.kl = self.nll = self.nll_ref = 0.0
        self.top1 = self.n = 0

    def add(self, ref_logits: np.ndarray, logits: np.ndarray, window: list[int]) -> None:
        ref, got = log_softmax(ref_logits), log_softmax(logits)
        t, rows = np.asarray(window[1:]), np.arange(len(window) - 1)
        self.kl += float(np.sum(np.exp(ref) * (ref - got)))
        self.top1 += int(np.sum(np.argmax(got, 1) == np.argmax(ref, 1)))
        self.nll -= float(got[rows, t].sum())
        self.nll_ref -= float(ref[rows, t].sum())
        self.n += len(t)

    def figures(self) -> dict[str, float]:
        return {"kl": self.kl / self.n, "top1": self.top1 / self.n, "ppl": math.exp(self.nll / self.n),
                "ppl_llamacpp": math.exp(self.nll_ref / self.n), "tokens": self.n}


def agreement_over(model, generator, tokens: list[int], ctx: int) -> Agreement:
    """Teacher-forced agreement of rkc's `generator` with llama.cpp's `model`
    over `tokens`, in the windows of ctx tokens rkrun --perplexity cuts."""
    out = Agreement()
    for (window, ref), (same, got) in zip(teacher_forced_logits(model, tokens, ctx),
                                          generator.scored_windows(tokens, ctx)):
        assert window == same
        out.add(ref, got, window)
    return out
