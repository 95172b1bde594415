"""int4 (W4A8) beside int8 decode, from the emitted decode products of each
model shape: DDR bytes per token and modelled decode time, without compiling a
whole model (a layer's products are the same in every layer of one shape, so
one layer of each shape is emitted and counted n times; the head once).

    python bench/int4_decode.py [--json out.json] [--models qwen2.5-1.5b,...]

The products and their segments are the compiler's (program_builder: q+k+v,
attn_output, gate+up, ffn_down, head; int8 segments placed over the cores as
compile places them, int4 by K groups of 256: compiler/npu/gemm_int4.py), the
time is the one performance model (ir/npu/perf.py: per task max(MAC, DMA time),
one kick per task for integer tasks (Q1), lanes sharing 25 GB/s at 1 GHz),
summed over the decode segments. DDR bytes are every NPU DMA byte (weights,
activations, partial sums, regcmd) plus the host's int4 group scales. Gemma 4
E2B's per-layer-embedding products (a few MB) are left out of both columns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from llm.synth import LARGE, REAL  # noqa: E402
from rkc.compiler.emitter_graph import EMIT_OPTIONS  # noqa: E402
from rkc.compiler.llm import int4  # noqa: E402
from rkc.compiler.npu import api  # noqa: E402
from rkc.compiler.npu.dispatch import emit  # noqa: E402
from rkc.compiler.npu.gemm import k_ranges  # noqa: E402
from rkc.compiler.npu.placement import place_segment, place_segment_int4  # noqa: E402
from rkc.ir.atomic import write_atomic  # noqa: E402
from rkc.ir.npu.perf import PerfModel  # noqa: E402

MODEL = PerfModel()
GROUP = 0  # 0: the compiler's automatic groups (--group 256: fixed groups of 256)
# Gemma 3 270M (its GGUF's shapes) beside tests/llm/synth.REAL
SHAPES = {"gemma-3-270m": dict(n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048, n_layer=18,
                               n_vocab=262144, tied=True), **REAL, **LARGE}


def layers(cfg: dict) -> list[tuple[int, list[list[tuple[str, int, int]]]]]:
    """(count, segments of (name, K, N)) per distinct layer shape."""
    e, h, kv = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"]
    kinds: dict[tuple, int] = {}
    n = cfg["n_layer"]
    for il in range(n):
        hd = cfg["head_dim"] if not cfg.get("head_dim_swa") or not cfg["swa_pattern"][il] else cfg["head_dim_swa"]
        ff = cfg.get("layer_n_ff", [cfg["n_ff"]] * n)[il]
        shared = cfg.get("shared", 0) and il >= n - cfg["shared"]  # reads another layer's KV: no k/v products
        qkv = [("q", e, h * hd)] + ([] if shared else [("k", e, kv * hd), ("v", e, kv * hd)])
        key = (tuple(qkv), (("o", h * hd, e),), (("gate", e, ff), ("up", e, ff)), (("down", ff, e),))
        kinds[key] = kinds.get(key, 0) + 1
    return [(count, [list(s) for s in key]) for key, count in kinds.items()]


def _int8(name: str, k: int, n: int) -> api.Gemm:
    b = np.broadcast_to(np.int8(0), (k, n))
    return api.Gemm(api.Feature.gemm("A", 0, 1, k, "int8"), b, api.Feature.gemm(name, 0, 1, n, "int32"), 1,
                    name=name)


_GROUPS: dict[int, int] = {}


def auto_group(k: int) -> int:
    """The group `rkc compile --precision int4` would pick for a K-wide product, found
    on Gaussian rows (rotated weights are close to Gaussian) of 4096 output channels:
    the fewest K groups whose int16 partials stay in range (compiler/llm/int4.py)."""
    if k not in _GROUPS:
        rows = np.random.default_rng(k).standard_normal((4096, k)).astype(np.float32)
        parts = 1
        while not int4.safe(int4.quantize_weight(rows, int4.group_for(k, parts))):
            parts += 1
        _GROUPS[k] = int4.group_for(k, parts)
    return _GROUPS[k]


def _int4(name: str, k: int, n: int) -> api.GemmInt4:
    b = np.broadcast_to(np.int8(0), (k, n))
    group = GROUP or auto_group(k)
    op = api.GemmInt4(api.Feature.gemm("A", 0, 2, k, "int4"), b, None, 2, group, name)
    return replace(op, c=api.Feature.gemm(name, 0, 2, op.segments * op.n_padded, "int16"))


def segment(products: list[tuple[str, int, int]], precision: str) -> dict:
    options = replace(EMIT_OPTIONS, pack_cache={})
    if precision == "int8":
        # K above one task's channels: one GEMM per K range in the segment (program_builder.py)
        products = [(f"{name}.k{k0}", kt, n) for name, k, n in products
                    for k0, kt in k_ranges(1, k, n, "int8", EMIT_OPTIONS)]
        ops = place_segment([_int8(*p) for p in products], options, per_task_kicks=True)
    else:
        ops = place_segment_int4([_int4(*p) for p in products], options)
    jobs, tasks, ddr, scales = [], 0, 0, 0
    for (name, k, n), op in zip(products, ops):
        r = emit(op, options)
        jobs += r.cost_jobs(chained=False)  # integer tasks: one kick each (Q1)
        tasks += len(r.tasks)
        ddr += sum(t.cost().dma_bytes for t in r.tasks)
        scales += 4 * (op.segments if precision == "int4" else 1) * n
    return {"seconds": MODEL.submission_seconds(jobs), "tasks": tasks, "npu_bytes": ddr, "scale_bytes": scales}


def model_figures(name: str, precision: str) -> dict:
    cfg = SHAPES[name]
    out = {"model": name, "precision": precision, "seconds": 0.0, "tasks": 0, "npu_bytes": 0, "scale_bytes": 0}
    parts = [(count, segs) for count, segs in layers(cfg)] + [(1, [[("head", cfg["n_embd"], cfg["n_vocab"])]])]
    for count, segs in parts:
        for seg in segs:
            f = segment(seg, precision)
            for key in ("seconds", "tasks", "npu_bytes", "scale_bytes"):
                out[key] += count * f[key]
    out["ddr_bytes"] = out["npu_bytes"] + out["scale_bytes"]
    out["tokens_per_s"] = 1 / out["seconds"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--group", type=int, default=0, help="int4 K group (0: the compiler's automatic choice)")
    args = ap.parse_args(argv)
    global GROUP
    GROUP = args.group
    rows = []
    print("| model | int8 DDR MB/token | int4 DDR MB/token | ratio | int8 tasks | int4 tasks | int8 modelled t/s "
          "| int4 modelled t/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        t = time.perf_counter()
        a, b = model_figures(name, "int8"), model_figures(name, "int4")
        rows += [a, b]
        groups = ", ".join(f"K={k}: {g}" for k, g in sorted(_GROUPS.items()))
        b["groups"] = dict(_GROUPS)
        print(f"| {name} | {a['ddr_bytes'] / 1e6:.0f} | {b['ddr_bytes'] / 1e6:.0f} | "
              f"{b['ddr_bytes'] / a['ddr_bytes']:.2f} | {a['tasks']} | {b['tasks']} | {a['tokens_per_s']:.1f} | "
              f"{b['tokens_per_s']:.1f} |  ({time.perf_counter() - t:.0f} s; int4 groups {groups or GROUP})", flush=True)
        _GROUPS.clear()
    if args.json:
        write_atomic(args.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
