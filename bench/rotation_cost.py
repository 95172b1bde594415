"""The host cost of rotating and quantizing a prefill chunk's rows per
rotation construction (runtime/kernels/hadamard.py): a many-row out edge as
the fused stretches run it (runtime/llm/prefill_fused.out_edge_tiles: signs,
butterflies, the rotated rows stored by blocks; the block-mixing factor's
product as fused_rows runs it, numpy on one BLAS thread; the codes into int8
atoms), random rows, each construction of each width alternating in one
process. Figures are this process's CPU milliseconds (the machine is shared),
the median of --repeat; the multiply-adds a value the factor costs beside them.

    python bench/rotation_cost.py [--rows 128 512] [--widths 640 1152 4864 6912 8960] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rkc.runtime import blas
from rkc.runtime.kernels.hadamard import compiled_form, describe, make_rotation
from rkc.runtime.llm import prefill_fused as kernels
from rkc.runtime.llm.prefill_kernels import LANES

KINDS = ("kron", "hartley", "block")
C2 = 32  # channels per int8 atom (any power of two <= the block)


def edge(x: np.ndarray, kind: str) -> tuple[str, int, dict]:
    """The calls of one out edge over rows x [M, K] with `kind`'s rotation, by part."""
    rows, k = x.shape
    rot = make_rotation(k, kind)
    form = compiled_form(rot, k)
    q, scale = np.zeros((-(-k // C2), rows, C2), np.int8), np.empty(rows, np.float32)
    tiles = -(-rows // LANES)
    if form.factor is None:
        none = np.zeros((0, 0), np.float32)
        parts = {"tiles": lambda: kernels.out_edge_tiles(x, kernels.OUT_QUANT, q, form.signs, form.block, form.norm,
                                                         scale, none, 0, tiles)}
        return describe(rot), 0, parts
    rotated = np.empty((k // form.block, rows * form.block), np.float32)
    mixed = np.empty_like(rotated)
    parts = {"tiles": lambda: kernels.out_edge_tiles(x, kernels.OUT_ROTATED, q, form.signs, form.block, form.norm,
                                                     scale, rotated, 0, tiles),
             "factor": lambda: np.matmul(form.factor, rotated, out=mixed),
             "codes": lambda: kernels.quantize_blocks_into_atoms(mixed, form.block, q, scale, 0, rows)}
    return describe(rot), form.factor.shape[0], parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[128])
    ap.add_argument("--widths", type=int, nargs="+", default=[640, 1152, 4864, 6912, 8960])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    out = []
    with blas.one_thread():  # as the plans run host kernels
        for rows in args.rows:
            for k in args.widths:
                x = rng.standard_normal((rows, k)).astype(np.float32)
                edges = [edge(x, kind) for kind in KINDS]
                for _, _, parts in edges:  # compile and warm
                    for call in parts.values():
                        call()
                times = [{p: [] for p in parts} for _, _, parts in edges]
                for _ in range(args.repeat):
                    for (_, _, parts), t in zip(edges, times):
                        for p, call in parts.items():
                            t0 = time.process_time()
                            call()
                            t[p].append(time.process_time() - t0)
                for kind, (form, madds, _), t in zip(KINDS, edges, times):
                    ms = {p: 1e3 * float(np.median(v)) for p, v in t.items()}
                    out.append({"rows": rows, "k": k, "kind": kind, "form": form, "factor_madds": madds, "ms": ms,
                                "total_ms": sum(ms.values())})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print("| rows | K | kind | construction | factor multiply-adds a value | tiles ms | factor ms | codes ms | total ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out:
        ms = r["ms"]
        print(f"| {r['rows']} | {r['k']} | {r['kind']} | {r['form']} | {r['factor_madds']} | {ms['tiles']:.2f} | "
              f"{ms.get('factor', 0):.2f} | {ms.get('codes', 0):.2f} | {r['total_ms']:.2f} |")


if __name__ == "__main__":
    main()
