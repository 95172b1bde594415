"""Prefill's many-row stretches, int4 against int8, at a model's widths: the
CPU time of one chunk's residual and gated-FFN stretch kernels
(runtime/llm/int4_prefill.py against prefill_fused.py, the same rotation,
the factor's product and the blocks' quantization included), interleaved
in one process (best of several runs each), on random partials and
accumulators. What a full-depth compile costs to measure end to end
(bench/llm.py --prefill-only) in seconds here, at any width.

int4's in edge reads one int16 partial per K group and nibble row (two per
value and group) where int8's reads one int32 per value, so its cost grows
with the groups compiler/llm/int4.py chooses for the product feeding the
stretch (the fewest whose int16 partials stay in range).

    python bench/int4_prefill.py                       # Gemma 3 270M and Qwen2.5-1.5B's widths, 128 rows
    python bench/int4_prefill.py --rows 512 --json
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread throughout: BLAS's idle spinning is CPU time too
import numpy as np  # noqa: E402

from rkc.runtime.kernels.hadamard import compiled_form, make_rotation  # noqa: E402
from rkc.runtime.llm import int4_prefill as k4  # noqa: E402
from rkc.runtime.llm import prefill_fused as pf  # noqa: E402
from rkc.runtime.llm.int4_rows import ACT_LIMIT  # noqa: E402
from rkc.runtime.llm.prefill_kernels import ACT_SILU, LANES  # noqa: E402

F32 = np.float32
NONE = np.zeros((0, 0), F32)
NO_PARTIAL = np.zeros((0, 0, 0), np.int32)

# (model, stretch, its width K, the K groups of the int4 product feeding it): groups from
# compiler/llm/int4.py's automatic choice (docs/notes/2026-12-06-int4.md's table)
SHAPES = [
    ("Gemma 3 270M", "residual (after attn_output)", 640, 1),
    ("Gemma 3 270M", "residual (after ffn_down)", 640, 2),
    ("Gemma 3 270M", "ffn", 2048, 1),
    ("Qwen2.5-1.5B", "residual (after attn_output)", 1536, 2),
    ("Qwen2.5-1.5B", "residual (after ffn_down)", 1536, 6),
    ("Qwen2.5-1.5B", "ffn", 8960, 2),
]


def _best(run, repeats: int = 5) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        run()
        best = min(best, time.process_time() - t)
    return best


def _partials(rng, rows: int, k: int, groups: int):
    n_pad = -(-k // 64) * 64
    p = rng.integers(-2 ** 15, 2 ** 15, (n_pad * groups // 8, 2 * rows, 8)).astype(np.int16)
    return p, n_pad, rng.uniform(1e-4, 1e-3, (groups, k)).astype(F32), rng.uniform(1e-3, 1e-2, rows).astype(F32)


def stretch_pair(kind: str, rows: int, k: int, groups: int, seed: int = 0):
    """(int4 run, int8 run) of one stretch over `rows` rows of width k."""
    rng = np.random.default_rng(seed)
    form = compiled_form(make_rotation(k, "kron"), k)
    blocks = form.factor is not None
    rotated = np.empty((k // form.block, rows * form.block), F32) if blocks else NONE
    mixed = np.empty_like(rotated)
    q4, q8 = np.zeros((k // 32, 2 * rows, 16), np.uint8), np.zeros((k // 16, rows, 16), np.int8)
    scale = np.empty(rows, F32)
    acc = rng.integers(-2 ** 16, 2 ** 16, (k // 4, rows, 4)).astype(np.int32)
    ch, rs8 = rng.random(k).astype(F32), rng.random(rows).astype(F32)
    out8 = pf.OUT_ROTATED if blocks else pf.OUT_QUANT
    tiles, out4 = -(-rows // LANES), (form.signs, form.block, form.norm, q4, scale, ACT_LIMIT, rotated, blocks)
    out8_args = (out8, q8, form.signs, form.block, form.norm, scale, rotated)
    gate, up = _partials(rng, rows, k, groups), _partials(rng, rows, k, groups)
    no_bias = np.zeros(0, F32)
    if kind == "ffn":
        a4 = (*gate, no_bias, False, *up, no_bias, False, ACT_SILU, rows, k, *out4, 0, tiles)
        a8 = (pf.IN_DEQUANT, acc, NO_PARTIAL, rs8, ch, ch, False, acc, NO_PARTIAL, rs8, ch, ch, False, ACT_SILU,
              rows, k, *out8_args, 0, tiles)
        t4, t8 = (lambda: k4.ffn_tiles(*a4)), (lambda: pf.ffn_tiles(*a8))
    else:
        w, res = np.ones(k, F32), rng.standard_normal((rows, k)).astype(F32)
        body = (False, w, F32(1e-6), res, w, F32(1e-6), False, False, False, False, NONE, NONE, NONE, NONE)
        body8 = (*body[:4], F32(1.0), False, True, *body[4:])  # no layer output scale, the second norm
        a4 = (*gate, no_bias, False, *body8, *out4, 0, tiles)
        a8 = (pf.IN_DEQUANT, acc, NO_PARTIAL, rs8, ch, ch, False, *body8, *out8_args, 0, tiles)
        t4, t8 = (lambda: k4.residual_tiles(*a4)), (lambda: pf.residual_tiles(*a8))

    def run4():
        t4()
        if blocks:  # fused_rows' finish: the factor's product, then the codes
            np.matmul(form.factor, rotated, out=mixed)
            k4.quantize_nibble_blocks_into_atoms(mixed, form.block, q4, scale, ACT_LIMIT, 0, rows)

    def run8():
        t8()
        if blocks:
            np.matmul(form.factor, rotated, out=mixed)
            pf.quantize_blocks_into_atoms(mixed, form.block, q8, scale, 0, rows)
    return run4, run8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for model, stretch, k, groups in SHAPES:
        run4, run8 = stretch_pair("ffn" if stretch == "ffn" else "residual", args.rows, k, groups)
        t8a, t4, t8b = _best(run8), _best(run4), _best(run8)  # int8 before and after: the load's drift shows
        t8 = min(t8a, t8b)
        rows.append({"model": model, "stretch": stretch, "k": k, "int4_groups": groups, "rows": args.rows,
                     "int4_ms": t4 * 1e3, "int8_ms": t8 * 1e3, "int4_over_int8": t4 / t8})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"one {args.rows}-row chunk's stretch, CPU ms (best of 5; int8 best of 10, around int4's)\n"
          "| model | stretch | K | int4 groups | int4 ms | int8 ms | int4 / int8 |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['stretch']} | {r['k']} | {r['int4_groups']} | {r['int4_ms']:.2f} | "
              f"{r['int8_ms']:.2f} | {r['int4_over_int8']:.2f} |")


if __name__ == "__main__":
    main()
