"""Synthetic GGUFs with the exact shapes and metadata of real 1-2B models
(tests/llm/synth.py REAL: Qwen2.5-1.5B, Qwen3-1.7B, Llama-3.2-1B, Gemma-3-1B, Gemma-4-E2B),
random weights in Q8_0 or a Q4_K_M-like Q4_K/Q6_K mix, made on the fly (never
committed), optionally cut to their first N layers.

    python bench/synth_gguf.py qwen2.5-1.5b out.gguf [--mix q4_k_m] [--layers 2]
    python bench/synth_gguf.py --list
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the llm test package (a namespace package) instead of bench/, whose llm.py would shadow it
sys.path[:] = [str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from llm.synth import LARGE, MIXES, REAL, write_real  # noqa: E402
from rkc.ir.atomic import atomic_output  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", choices=sorted({**REAL, **LARGE}))
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--mix", choices=MIXES, default="q8_0", help="tensor types (default q8_0)")
    ap.add_argument("--layers", type=int, help="keep only the first N layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="print the models' hyperparameters")
    args = ap.parse_args(argv)
    if args.list or args.model is None:
        for name, spec in REAL.items():
            print(name, " ".join(f"{k}={v}" for k, v in spec.items()))
        return 0
    if args.out is None:
        ap.error("give an output path")
    t0 = time.perf_counter()
    with atomic_output(args.out) as tmp:
        write_real(tmp, args.model, args.mix, args.layers, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
