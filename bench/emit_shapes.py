"""Emitter figures per representative LLM and CNN shape: tasks, kicks, CBUF use,
DDR bytes and modelled time at 1 GHz, against the physical limit.

    python bench/emit_shapes.py [--json out.json] [--quick] [--dram-gbps GBPS|rkc-probe.json]

Modelled time uses the one performance model (ir/npu/perf.py, which the
simulator and `rkc inspect` use too: per task max(MAC time, DMA time), one kick
overhead per task under stock rocket or per job when hardware-chained, three
cores sharing the DRAM bandwidth) fed with the counters the emitter computes for
each task (api.Task.cost, which the simulator's counts match). The physical limit of a
shape is max(MACs / (peak MAC/cycle x 3 cores x 1 GHz), minimal bytes / DRAM bandwidth),
the minimal bytes being every input, weight and output byte moved once.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.probe.dram import bandwidth_from
from rkc.ir.atomic import write_atomic
from rkc.ir.npu import hw
from rkc.ir.npu.perf import PerfModel

MODEL = PerfModel()  # main() replaces it for --dram-gbps


GEMMA_270M = [  # (what, K, N) of Gemma-3-270M's matmuls (hidden 640, FFN 2048, vocab 262144)
    ("q/o proj", 640, 1024), ("k/v proj", 640, 256), ("ffn gate/up", 640, 2048), ("ffn down", 2048, 640),
    ("lm head", 640, 262144),
]
TOKENS = [1, 32, 128, 512]
CNN = [  # (what, C, H, W, O, k, stride, pad, depthwise)
    ("mobilenet conv1 3x3/2", 3, 224, 224, 32, 3, 2, (0, 1, 0, 1), False),
    ("mobilenet dw 3x3 112", 32, 112, 112, 32, 3, 1, (1, 1, 1, 1), True),
    ("mobilenet pw 112 32->64", 32, 112, 112, 64, 1, 1, (0, 0, 0, 0), False),
    ("mobilenet dw 3x3/2 112", 64, 112, 112, 64, 3, 2, (0, 1, 0, 1), True),
    ("mobilenet pw 56 128->128", 128, 56, 56, 128, 1, 1, (0, 0, 0, 0), False),
    ("mobilenet pw 7 1024->1024", 1024, 7, 7, 1024, 1, 1, (0, 0, 0, 0), False),
    ("resnet50 conv1 7x7/2", 3, 224, 224, 64, 7, 2, (3, 3, 3, 3), False),
    ("resnet50 3x3 56 64", 64, 56, 56, 64, 3, 1, (1, 1, 1, 1), False),
    ("resnet50 1x1 56 64->256", 64, 56, 56, 256, 1, 1, (0, 0, 0, 0), False),
    ("resnet50 3x3 14 256", 256, 14, 14, 256, 3, 1, (1, 1, 1, 1), False),
    ("resnet50 1x1 7 2048->512", 2048, 7, 7, 512, 1, 1, (0, 0, 0, 0), False),
]


def modelled_seconds(r: api.EmitResult, chained: bool) -> float:
    return MODEL.submission_seconds(r.cost_jobs(chained))


def limit_seconds(macs: int, dtype: str, min_bytes: int) -> float:
    return max(macs / (hw.MACS_PER_CYCLE[dtype] * hw.CORES * hw.CLOCK_HZ_MAX),
               min_bytes / MODEL.dram_bytes_per_s)


def row(kind: str, what: str, shape: str, dtype: str, r: api.EmitResult, macs: int, min_bytes: int,
        emit_s: float) -> dict:
    stock, chained = modelled_seconds(r, False), modelled_seconds(r, True)
    limit = limit_seconds(macs, dtype, min_bytes)
    banks = [t.cbuf for t in r.tasks if t.cbuf is not None]
    return {
        "kind": kind, "what": what, "shape": shape, "dtype": dtype,
        "tasks": len(r.tasks), "jobs": len(r.jobs), "cores": len({j.lane for j in r.jobs}),
        "kicks_stock": r.kicks_stock, "kicks_chained": r.kicks_chained,
        "cbuf_data_banks": max((b.data_banks for b in banks), default=0),
        "cbuf_weight_banks": max((b.weight_banks for b in banks), default=0),
        "weights_resident": all(b.weights_resident for b in banks),
        "reuse_tasks": sum(b.weight_reuse or b.data_reuse for b in banks),
        "macs": macs, "ddr_bytes": sum(t.cost().dma_bytes for t in r.tasks), "min_bytes": min_bytes,
        "modelled_us_stock": stock * 1e6, "modelled_us_chained": chained * 1e6, "limit_us": limit * 1e6,
        "ratio_stock": stock / limit, "ratio_chained": chained / limit,
        "cpu_steps": len(r.cpu), "emit_s": emit_s,
    }


def gemm_rows(quick: bool):
    for what, k, n in GEMMA_270M:
        for m in TOKENS if not quick else [1, 128]:
            for dtype, out in (("int8", "int32"), ("fp16", "fp16")):
                item = api.ITEMSIZE[dtype]
                b = np.zeros((k, n), api.NUMPY[dtype])
                op = api.Gemm(api.Feature.gemm("A", 0, m, k, dtype), b, api.Feature.gemm("C", 0, m, n, out), m,
                              name="g")
                t0 = time.perf_counter()
                r = emit(op)
                dt = time.perf_counter() - t0
                min_bytes = m * k * item + k * n * item + m * n * api.ITEMSIZE[out]
                yield row("llm", f"gemma3-270m {what}", f"M={m} K={k} N={n}", dtype, r, m * k * n, min_bytes, dt)


def conv_rows(quick: bool):
    for what, c, h, w, o, k, s, pad, dw in CNN if not quick else CNN[:4]:
        oh, ow = (h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1
        o = c if dw else o
        x = api.Feature("x", 0, c, h, w, "int8", api.Quant(0.05, 0))
        y = api.Feature("y", 0, o, oh, ow, "int8", api.Quant(0.1, 0))
        wt = np.zeros((k, k, c) if dw else (o, k, k, c), np.int8)
        op = api.Conv2D(x, wt, y, (s, s), pad, dw, api.Quant(0.01), api.Epilogue(bias=np.zeros(o, np.int64)))
        t0 = time.perf_counter()
        r = emit(op)
        dt = time.perf_counter() - t0
        macs = oh * ow * o * k * k * (1 if dw else c)
        min_bytes = x.surfaces * h * w * 16 + wt.size + y.surfaces * oh * ow * 16
        yield row("cnn", what, f"{c}x{h}x{w}->{o}x{oh}x{ow} k{k}s{s}", "int8", r, macs, min_bytes, dt)


def table(rows: list[dict]) -> str:
    head = ("what", "shape", "dt", "tasks", "cores", "kicks s/c", "CBUF d+w", "res", "DDR MB", "min MB",
            "us stock", "us chain", "us limit", "x limit (chain)")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(v) for v in (
            r["what"], r["shape"], r["dtype"], r["tasks"], r["cores"], f"{r['kicks_stock']}/{r['kicks_chained']}",
            f"{r['cbuf_data_banks']}+{r['cbuf_weight_banks']}", "y" if r["weights_resident"] else "n",
            f"{r['ddr_bytes'] / 1e6:.2f}", f"{r['min_bytes'] / 1e6:.2f}", f"{r['modelled_us_stock']:.1f}",
            f"{r['modelled_us_chained']:.1f}", f"{r['limit_us']:.1f}", f"{r['ratio_chained']:.2f}")))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--dram-gbps", metavar="GBPS|PROBE.json",
                    help="model with this DRAM bandwidth: GB/s, or a report of rkc probe --dram")
    args = ap.parse_args()
    if args.dram_gbps:
        global MODEL
        MODEL = replace(MODEL, dram_bytes_per_s=bandwidth_from(args.dram_gbps)[0])
    rows = list(gemm_rows(args.quick)) + list(conv_rows(args.quick))
    out = {"model": "rkc.ir.npu.perf.PerfModel", "clock_hz": MODEL.clock_hz, "dram_bytes_per_s": MODEL.dram_bytes_per_s,
           "kick_overhead_s": MODEL.kick_overhead_s, "cores": MODEL.cores, "rows": rows}
    print(json.dumps(out, indent=1) if not args.json else f"modelled with {MODEL}")
    if args.json:
        write_atomic(args.json, json.dumps(out, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
