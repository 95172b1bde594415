"""Teacher-forced quality of compiled LLM rkbins against llama.cpp on the same
GGUF, beside llama.cpp's own requantizations of that GGUF as anchors, on the
first windows of tests/llm/data/english.txt: the quick form of
tools/llm_quant_eval.py (no float model, no greedy prompts), for a busy machine.

    PYTHONPATH=$PWD python tools/llm_window_quality.py --gguf G.gguf \\
        --rkbin int4=a.rkbin --rkbin int8=b.rkbin [--anchors q4_0,q8_0] [--windows 1] [--json]

Per scheme: KL(llama.cpp || scheme) per predicted token, top-1 agreement with
llama.cpp, perplexity (llama.cpp's beside it), all on the same windows (cut as
rkrun --perplexity cuts them, PPL_CTX tokens). rkbins run on the simulator.
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
for p in (ROOT, ROOT / "tests", ROOT / "tools"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from llm import llamacpp  # noqa: E402
from llm.test_gemma3_270m import PPL_CTX  # noqa: E402
from llm_quant_eval import requantize  # noqa: E402
from rkc.runtime.llm.engine import LlmEngine  # noqa: E402
from rkc.runtime.llm.generate import Generator  # noqa: E402


def agreement(ref: list[np.ndarray], windows) -> dict:
    a = llamacpp.Agreement()
    for (window, logits), ref_logits in zip(windows, ref):
        a.add(ref_logits, logits, window)
    return a.figures()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--rkbin", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--anchors", default="q4_0,q8_0")
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path("out/llm_window_quality"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rkbins = [tuple(r.split("=", 1)) for r in args.rkbin]
    tokenizer = LlmEngine(rkbins[0][1], device="null").tokenizer if rkbins else None
    text = (ROOT / "tests/llm/data/english.txt").read_text()
    model = llamacpp.load(str(args.gguf), n_ctx=1024, logits_all=True)
    tokens = tokenizer.encode(text) if tokenizer else llamacpp.tokenize(model, text)
    ref = [logits for _, logits in itertools.islice(llamacpp.teacher_forced_logits(model, tokens, PPL_CTX),
                                                    args.windows)]
    model.close()
    rows = []

    def report(name: str, figures: dict, seconds: float) -> None:
        rows.append({"scheme": name, **figures, "seconds": seconds})
        print(f"{name:32s} KL {figures['kl']:.4f}  top1 {figures['top1']:.3f}  ppl {figures['ppl']:.2f} "
              f"(llama.cpp {figures['ppl_llamacpp']:.2f})  tokens {figures['tokens']}  [{seconds:.0f} s]", flush=True)

    for kind in filter(None, args.anchors.split(",")):
        t = time.perf_counter()
        anchor = llamacpp.load(str(requantize(args.gguf, kind, args.cache)), n_ctx=1024, logits_all=True)
        report(f"llama.cpp {kind} (requantized)", agreement(ref, itertools.islice(
            llamacpp.teacher_forced_logits(anchor, tokens, PPL_CTX), args.windows)), time.perf_counter() - t)
        anchor.close()
    for name, path in rkbins:
        t = time.perf_counter()
        gen = Generator(LlmEngine(path), PPL_CTX + 1)
        report(name, agreement(ref, itertools.islice(gen.scored_windows(tokens, PPL_CTX), args.windows)),
               time.perf_counter() - t)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
