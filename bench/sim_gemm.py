"""Simulated GEMM throughput: how many MACs per second the NPU simulator
executes for LLM-like layer shapes (int8 -> int32, fp16 -> fp32).

Each GEMM runs as 1x1-convolution tasks (tests/sim/programs.py), M split into
row tiles that fit the CBUF data banks, M=1 padded to 4 rows (open question
Q2). The first run converts the weights from the native layout (cold); later
runs reuse them while their bytes are unchanged, as every token of a model
does (warm: best of --repeat, the figure GMAC/s is computed from). The machine
may be shared: compare runs made under similar load. Prints a table and, with
--json, one JSON object.

    PYTHONPATH=$PWD python bench/sim_gemm.py [--json] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sim"))

from rkc.ir.npu import layout  # noqa: E402
from programs import BANK, Ref, conv_task, gemm_spec, place, upload  # noqa: E402
from rkc.runtime.sim import SimDevice  # noqa: E402

SHAPES = [(m, k, n) for m in (1, 32, 128) for k in (640, 2048) for n in (256, 1024, 2048)]


def _row_tile(k: int, itemsize: int, slack: int) -> int:
    """Rows of A per task: the feature tile and one kernel group of weights
    (32 int8 / 16 fp16 kernels of K elements) share the 12 CBUF banks."""
    group_banks = -(-(32 // itemsize) * k * itemsize // BANK)
    rows = (12 - group_banks - slack) * BANK // (k * itemsize)
    return max(4, min(rows // 4 * 4, 512))


def build(dev: SimDevice, m: int, k: int, n: int, prec: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    m_run = max(m, 4)
    if prec == "int8":
        a = rng.integers(-128, 128, (m_run, k)).astype(np.int8)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    else:
        a = rng.standard_normal((m_run, k)).astype(np.float16)
        b = rng.standard_normal((k, n)).astype(np.float16)
    w = Ref(upload(dev, layout.pack_gemm_b(b)))
    tile = _row_tile(k, a.itemsize, 1 if prec == "int8" else 0)
    builders, outs = [], []
    for m0 in range(0, m_run, tile):
        rows = min(tile, m_run - m0)
        spec = gemm_spec(rows, k, n, prec)
        x = Ref(upload(dev, layout.pack_gemm_a(a[m0:m0 + rows])))
        y = Ref(dev.create_bo(spec.out_bytes()))
        builders.append(conv_task(spec, x, w, y))
        outs.append(y.bo)
    prog = place(dev, builders, in_bos=[w.bo], out_bos=outs)
    return prog, m * k * n


def measure(m: int, k: int, n: int, prec: str, repeat: int) -> dict:
    dev = SimDevice()
    prog, useful_macs = build(dev, m, k, n, prec)
    t0 = time.perf_counter()
    dev.run([prog.job()])  # cold: decodes the regcmd, converts the weights
    cold = time.perf_counter() - t0
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        dev.reset_counters()
        t0, c0 = time.perf_counter(), time.process_time()
        dev.run([prog.job()])
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    c = dev.counters
    return {"dtype": prec, "M": m, "K": k, "N": n, "tasks": c.tasks, "simulated_macs": c.macs,
            "cold_wall_s": cold, "wall_s": best, "cpu_s": best_cpu, "gmac_per_s": c.macs / best / 1e9,
            "gmac_per_cpu_s": c.macs / max(best_cpu, 1e-9) / 1e9,
            "modelled_npu_us": c.modelled_seconds * 1e6, "ddr_bytes": c.ddr_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = [measure(m, k, n, prec, args.repeat) for prec in ("int8", "fp16") for m, k, n in SHAPES]
    summary = {p: float(np.exp(np.mean([np.log(r["gmac_per_s"]) for r in rows if r["dtype"] == p])))
               for p in ("int8", "fp16")}
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    if args.json:
        print(json.dumps({"rows": rows, "geomean_gmac_per_s": summary, "loadavg_1min": load}, indent=1))
        return
    print(f"{'dtype':5} {'M':>4} {'K':>5} {'N':>5} {'tasks':>5} {'GMAC':>7} {'cold ms':>8} {'wall ms':>8} "
          f"{'GMAC/s':>7} {'cpu ms':>7} {'model us':>9}")
    for r in rows:
        print(f"{r['dtype']:5} {r['M']:4d} {r['K']:5d} {r['N']:5d} {r['tasks']:5d} {r['simulated_macs'] / 1e9:7.3f} "
              f"{r['cold_wall_s'] * 1e3:8.2f} {r['wall_s'] * 1e3:8.2f} {r['gmac_per_s']:7.2f} {r['cpu_s'] * 1e3:7.1f} {r['modelled_npu_us']:9.1f}")
    print("geomean GMAC/s (wall): " + ", ".join(f"{p} {v:.2f}" for p, v in summary.items())
          + f"   [1-min load average {load} on {os.cpu_count()} CPUs]")


if __name__ == "__main__":
    main()
