"""Prefill, decode, sampling, streaming and perplexity over an LlmEngine."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from rkc.ir.atomic import atomic_output
from rkc.ir.errors import RkcError
from rkc.ir.llm import DECODE
from rkc.ir.npu.perf import describe
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.kvcache import KVCache
from rkc.runtime.llm.top_k import largest_indices


MAX_TOP_LOGPROBS = 20  # alternatives a token's logprobs may list (OpenAI's limit)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (the softmax of its
    logits: not the temperature's, top-k's or a grammar's), and the `top`
    most likely tokens at that step, (token, logprob), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: np.ndarray, token: int, top: int = 0) -> TokenLogprob:
    """`token`'s TokenLogprob from one step's logits (float64 log-softmax)."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    logp = z - (z.max() + math.log(np.exp(z - z.max()).sum()))
    best = top_order(logp, top) if top > 0 else ()
    return TokenLogprob(int(token), float(logp[token]), tuple((int(t), float(logp[t])) for t in best))


@dataclass
class Sampler:
    """temperature <= 0 is greedy; otherwise top-k, then top-p (nucleus),
    then a draw at the temperature from a seeded generator. A `constraint`
    (runtime/api/constrain.py) masks the logits first (tokens its grammar
    forbids at -inf) and is told the token chosen."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None
    constraint: Any = None  # .logits(raw) -> float64 masked logits; .accept(token)
    logprobs: int | None = None  # None: no record; n: each token's TokenLogprob with n alternatives, in .picked
    picked: list[TokenLogprob] = field(default_factory=list, init=False, repr=False)
    _rng: np.random.Generator | None = field(default=None, init=False, repr=False)

    @property
    def rng(self) -> np.random.Generator:
        """Made at the first draw (the same stream for a seed): seeding one
        from the OS's entropy costs ~40 us, which a greedy request paid for
        nothing before its prefill (a cached chat turn's whole host time is ~2 ms)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def __call__(self, logits: np.ndarray) -> int:
        if self.constraint is None:
            token = self._choose(_values(logits))
        else:
            token = self._choose(self.constraint.logits(logits))  # (the order and argmax: the same in float32)
            self.constraint.accept(token)
        if self.logprobs is not None:
            self.picked.append(token_logprob(logits, token, self.logprobs))
        return token

    def _choose(self, logits: np.ndarray) -> int:
        if self.temperature <= 0:
            return int(np.argmax(logits))
        order = top_order(logits, self.top_k)
        z = logits[order].astype(np.float64)  # (a constraint's logits: the model's dtype)
        # the largest subtracted before dividing: at a tiny temperature (5e-324 is valid JSON for the API)
        # z / t overflows to inf and inf - inf is NaN; (z - max) / t is <= 0, at worst -inf (p = 0)
        with np.errstate(over="ignore"):
            p = np.exp((z - z.max()) / self.temperature)
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        return int(order[self.rng.choice(len(order), p=p)])


def top_order(logits: np.ndarray, k: int) -> np.ndarray:
    """np.argsort(-logits, kind="stable")[:k] (all of it for k <= 0): the k
    largest, ties in index order, from one compiled pass (runtime/llm/top_k.py; a
    stable sort of a 262144-wide vocabulary is ~100 ms, most of a sampled
    token's host time)."""
    if 0 < k < logits.size:
        chosen = largest_indices(_values(logits), k)
        if chosen is not None:
            return chosen
    order = np.argsort(-logits, kind="stable")  # (NaNs: the sort's own order)
    return order if k <= 0 else order[:k]


def _values(logits: np.ndarray) -> np.ndarray:
    """The logits as a flat float32 or float64 row, not copied when they are
    one: their order and argmax are the same in either (float32 widens
    exactly), and a float64 copy of a 262144-wide row cost a greedy token
    ~0.3-0.8 ms."""
    x = np.asarray(logits).reshape(-1)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


@dataclass(frozen=True)
class Modelled:
    """The device's performance-model counters (the simulator's; zero on a board)."""

    seconds: float = 0.0
    tasks: int = 0
    kicks: int = 0
    ddr_bytes: int = 0
    chaining: bool = False

    @classmethod
    def of(cls, device) -> "Modelled":
        if device is None:
            return cls()
        c = device.counters
        return cls(c.modelled_seconds, c.tasks, c.kicks, c.ddr_bytes, device.supports_chaining)

    def since(self, start: "Modelled") -> "Modelled":
        return Modelled(self.seconds - start.seconds, self.tasks - start.tasks, self.kicks - start.kicks,
                        self.ddr_bytes - start.ddr_bytes, self.chaining)

    def line(self, phase: str, tokens: int) -> str:
        rate = tokens / self.seconds if self.seconds else 0.0
        return (f"{phase}: {describe(self.seconds, self.tasks, self.kicks, self.ddr_bytes, self.chaining)} "
                f"for {tokens} tokens = {rate:.1f} modelled tokens/s")


@dataclass
class Timings:
    prompt_tokens: int = 0  # prefilled (the prompt minus its reused prefix)
    cached_tokens: int = 0  # prompt tokens whose KV was reused from the cache
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0
    decode_runs: int = 0  # decode programs run (the first generated token comes from the prefill)
    prefill_npu: Modelled = Modelled()
    decode_npu: Modelled = Modelled()

    def lines(self) -> list[str]:
        pf = self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0
        dc = self.generated / self.decode_s if self.decode_s else 0.0
        lines = [f"prefill: {self.prompt_tokens} tokens in {self.prefill_s:.3f} s ({pf:.1f} t/s)",
                 f"decode: {self.generated} tokens in {self.decode_s:.3f} s ({dc:.1f} t/s)"]
        if self.prefill_npu.seconds:
            lines.append(self.prefill_npu.line("prefill", self.prompt_tokens))
        if self.decode_npu.seconds:
            lines.append(self.decode_npu.line("decode", self.decode_runs))
        return lines


def chunk_plan(n: int, chunks: list[int], npu_s: Mapping[int, float] | None = None) -> list[tuple[int, int]]:
    """(program size, tokens) pairs covering n tokens, in order.

    With `npu_s` (each size's modelled NPU seconds a run, as the compiler
    recorded them; every size of `chunks` and 1): the plan whose runs cost the
    NPU least, ties to fewer runs, then fewer rows. A run's host work is
    its real tokens' (runtime/llm/fused_rows.live_tiles: pad rows cost the
    host nothing), the same in every plan of n tokens but for a fixed cost
    per run, while the NPU reads every weight once a run whatever its rows
    hold: Gemma 3 270M's 200 tokens run as 128 + 72 padded in a 128 (int8
    NPU 32 ms) rather than 128 + 32 + 32 + 8 padded in a 32 (57 ms). Whole
    runs come first, the padded one last; past twice the largest size the
    largest whole runs are taken first (the cheapest NPU time a token).

    Without figures (an rkbin from before they were recorded): whole chunks,
    largest first; a remainder of two or more tokens runs padded in the
    smallest chunk that holds it; then, from the end, two runs become one
    wherever a program holds their tokens in no more rows than the two
    compute (32 + 3 padded to 32 -> 35 in a 64)."""
    sizes = sorted(set(chunks) | {1}, reverse=True)
    if npu_s is not None and all(s in npu_s for s in sizes):
        return _cheapest_plan(n, sizes, npu_s)
    plan = []
    while n > 0:
        fit = [s for s in sizes if s <= n]
        c = fit[0]
        if c == 1 and n > 1 and sizes[0] >= n:
            c = min(s for s in sizes if s >= n)
            plan.append((c, n))
            break
        plan.append((c, c))
        n -= c
    while len(plan) > 1:
        (a, na), (b, nb) = plan[-2:]
        holds = [s for s in sizes if na + nb <= s <= a + b]
        if not holds:
            break
        plan[-2:] = [(min(holds), na + nb)]
    return plan


def _cheapest_plan(n: int, sizes: list[int], npu_s: Mapping[int, float]) -> list[tuple[int, int]]:
    """chunk_plan by the NPU's figures: (NPU seconds, runs, rows) least over
    plans whose runs are whole but the last (dynamic programming over the
    tokens left, after the largest whole runs past twice the largest size)."""
    largest, plan = sizes[0], []
    while n > 2 * largest:
        plan.append((largest, largest))
        n -= largest
    best: list[tuple[float, int, int]] = [(0.0, 0, 0)] + [(math.inf, 0, 0)] * n
    choice = [0] * (n + 1)
    for t in range(1, n + 1):
        for s in sizes:
            prev = best[t - min(s, t)]
            cost = (prev[0] + npu_s[s], prev[1] + 1, prev[2] + s)
            if cost < best[t]:
                best[t], choice[t] = cost, s
    runs, t = [], n
    while t > 0:
        s = choice[t]
        runs.append((s, min(s, t)))
        t -= min(s, t)
    return plan + sorted(runs, key=lambda r: (r[1] < r[0], -r[0]))  # whole runs first, largest first


class Generator:
    def __init__(self, engine: LlmEngine, n_ctx: int | None = None) -> None:
        self.engine = engine
        self.n_ctx = n_ctx or engine.cfg.context_length
        if self.n_ctx > engine.cfg.context_length:
            raise RkcError(f"--ctx {self.n_ctx} exceeds the model's context length {engine.cfg.context_length}")
        self.cache: KVCache = engine.new_cache(self.n_ctx)
        self.timings = Timings()

    def _forward(self, tokens: list[int], start: int, all_logits: bool) -> np.ndarray:
        outs, pos = [], start
        for c, n in chunk_plan(len(tokens), self.engine.chunks, self.engine.npu_seconds(all_logits)):
            name = self.engine.program_for(c, all_logits).name
            ids = np.asarray(tokens[pos - start: pos - start + n], np.int32)
            outs.append(self.engine.run(name, ids, np.arange(pos, pos + n, dtype=np.int32), self.cache))
            pos += n
        return np.concatenate(outs) if all_logits else outs[-1][-1]

    def generate(self, prompt: list[int], n: int, sampler: Sampler,
                 stop_at_eos: bool = True, reuse: int = 0) -> Iterator[int]:
        """Yield up to n new tokens after the prompt. `reuse`: the cache already
        holds the KV of prompt[:reuse] (the caller checked); only the rest is prefilled."""
        if not prompt:
            raise RkcError("empty prompt (the model has no BOS token to start from)")
        if len(prompt) + n > self.n_ctx:
            n = max(0, self.n_ctx - len(prompt))
        reuse = min(reuse, len(prompt) - 1)  # the last prompt token's logits are needed
        if reuse <= 0 or not self.cache.truncate(reuse):
            reuse = 0
            self.cache.reset()
        self.cache.expect(len(prompt))  # the prefill's chunks store into buffers sized once
        self.timings = Timings(cached_tokens=reuse)
        device = self.engine.device
        t0, m0 = time.perf_counter(), Modelled.of(device)
        logits = self._forward(prompt[reuse:], reuse, all_logits=False)
        self.timings.prompt_tokens, self.timings.prefill_s = len(prompt) - reuse, time.perf_counter() - t0
        self.timings.prefill_npu = Modelled.of(device).since(m0)
        pos = len(prompt)
        t1, m1 = time.perf_counter(), Modelled.of(device)
        for i in range(n):
            token = sampler(logits)
            if stop_at_eos and token in self.engine.tokenizer.eos_ids:
                break
            self.timings.generated = i + 1
            yield token
            if i + 1 < n:
                logits = self.engine.run(DECODE, np.asarray([token], np.int32), np.asarray([pos], np.int32),
                                         self.cache)[-1]
                pos += 1
                self.timings.decode_runs += 1
                self.timings.decode_npu = Modelled.of(device).since(m1)
            self.timings.decode_s = time.perf_counter() - t1

    @staticmethod
    def windows(tokens: list[int], ctx: int) -> list[list[int]]:
        """The windows perplexity scores: tokens start with BOS; windows of ctx
        tokens, every window after the first prefixed with BOS; each token but
        the first predicted once."""
        cut = [tokens[s:s + ctx] if s == 0 else [tokens[0], *tokens[s:s + ctx]] for s in range(0, len(tokens), ctx)]
        return [w for w in cut if len(w) >= 2]

    def scored_windows(self, tokens: list[int], ctx: int) -> Iterator[tuple[list[int], np.ndarray]]:
        """Each window with its logits [len - 1, vocab]: row i predicts window[i + 1]."""
        for window in self.windows(tokens, ctx):
            self.cache.reset()
            self.cache.expect(len(window) - 1)
            yield window, self._forward(window[:-1], 0, all_logits=True)

    def perplexity(self, tokens: list[int], ctx: int,
                   progress: Callable[[int, int], None] | None = None) -> tuple[float, int]:
        nll, count = 0.0, 0
        for w, (window, logits) in enumerate(self.scored_windows(tokens, ctx)):
            logits = logits.astype(np.float64)
            logp = logits - logits.max(axis=1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
            targets = np.asarray(window[1:])
            nll -= float(logp[np.arange(len(targets)), targets].sum())
            count += len(targets)
            if progress:
                progress(w + 1, len(self.windows(tokens, ctx)))
        if count == 0:
            raise RkcError("perplexity needs at least two tokens of text")
        return math.exp(nll / count), count

    def write_logits(self, tokens: list[int], ctx: int, path: str,
                     progress: Callable[[int, int], None] | None = None) -> int:
        """The teacher-forced logits of every scored token, float32 [N, vocab]
        (row i predicts token i + 1 of the windows perplexity cuts; N is the
        count perplexity reports), written to `path` (.npy) atomically and row
        block by row block (a 262k vocabulary makes 1 MB per row)."""
        n = sum(len(w) - 1 for w in self.windows(tokens, ctx))
        if n == 0:
            raise RkcError("teacher-forced logits need at least two tokens of text")
        with atomic_output(path, suffix=".npy") as tmp:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, self.engine.cfg.n_vocab))
            row = 0
            for w, (window, logits) in enumerate(self.scored_windows(tokens, ctx)):
                out[row:row + len(logits)] = logits
                row += len(logits)
                if progress:
                    progress(w + 1, len(self.windows(tokens, ctx)))
            out.flush()
            del out
        return n
