"""Where an LLM rkbin's modelled decode time goes, segment by segment: per NPU
step of the decode program its MACs, DMA bytes per lane (core), tasks and kicks,
the modelled time (ir/npu/perf.py, as `rkc inspect` applies it) beside its bytes
at the DRAM bandwidth, and what the longest lane spends on kicks. A segment
whose modelled time exceeds its bytes at DRAM speed is held by its busiest core:
its kicks, or one core's DMA share (hw.CORE_DMA_SHARE) of too many bytes.

    python bench/decode_segments.py MODEL.rkbin [--fold] [--json out.json]

--fold prints each repeated row once, with its count (layers of one shape).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from rkc.compiler.inspect import planned_jobs
from rkc.compiler.llm.report import MODEL, weight_bytes
from rkc.ir.llm import DECODE
from rkc.ir.rkbin import read_rkbin

HEAD = ("segment", "MMAC", "tasks", "kicks", "DMA MB per lane", "modelled us", "bytes/DRAM us", "ratio",
        "kicks us (busiest lane)")


def rows(module) -> list[dict]:
    out = []
    for step in module.program(DECODE).steps:
        if step.kind != "npu":
            continue
        jobs = planned_jobs(step, True)
        lanes: dict[int, int] = {}
        busy: dict[int, float] = {}
        kicks: dict[int, int] = {}
        for j in jobs:
            lanes[j.lane] = lanes.get(j.lane, 0) + sum(t.dma_bytes for t in j.tasks)
            busy[j.lane] = busy.get(j.lane, 0.0) + MODEL.job_seconds(j)
            kicks[j.lane] = kicks.get(j.lane, 0) + j.kicks
        busiest = max(busy, key=busy.get)
        names = "+".join(layer["name"].rsplit("/", 1)[-1] for layer in step.stats.get("layers", []))
        out.append({"segment": names, "macs": sum(t.macs for j in jobs for t in j.tasks),
                    "tasks": sum(len(j.tasks) for j in jobs), "kicks": sum(j.kicks for j in jobs),
                    "lane_bytes": [lanes[lane] for lane in sorted(lanes)],
                    "modelled_s": MODEL.submission_seconds(jobs),
                    "dram_s": sum(lanes.values()) / MODEL.dram_bytes_per_s,
                    "busiest_lane_kick_s": kicks[busiest] * MODEL.kick_overhead_s})
    return out


def _shape(name: str) -> str:
    """"blk.12.q+blk.12.k" -> "blk.N.q+blk.N.k": layers of one shape fold together."""
    return "+".join(".".join("N" if part.isdigit() else part for part in n.split(".")) for n in name.split("+"))


def table(rs: list[dict], fold: bool) -> str:
    lines = [" | ".join(HEAD), " | ".join("---" for _ in HEAD)]
    seen: Counter = Counter()
    keyed = []
    for r in rs:
        key = (_shape(r["segment"]), r["tasks"], tuple(r["lane_bytes"])) if fold else id(r)
        if seen[key] == 0:
            keyed.append((key, r))
        seen[key] += 1
    for key, r in keyed:
        name = _shape(r["segment"]) + (f" (x{seen[key]})" if fold and seen[key] > 1 else "")
        lines.append(" | ".join((
            name, f"{r['macs'] / 1e6:.1f}", str(r["tasks"]), str(r["kicks"]),
            " / ".join(f"{b / 1e6:.2f}" for b in r["lane_bytes"]), f"{r['modelled_s'] * 1e6:.1f}",
            f"{r['dram_s'] * 1e6:.1f}", f"{r['modelled_s'] / r['dram_s']:.2f}",
            f"{r['busiest_lane_kick_s'] * 1e6:.0f}")))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rkbin", type=Path)
    ap.add_argument("--fold", action="store_true", help="one row per repeated segment shape, with its count")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    module = read_rkbin(args.rkbin).module
    rs = rows(module)
    total = sum(r["modelled_s"] for r in rs)
    dram = sum(r["dram_s"] for r in rs)
    weights = weight_bytes(module) / MODEL.dram_bytes_per_s
    print(table(rs, args.fold))
    print(f"decode: {len(rs)} segments, modelled {total * 1e3:.3f} ms; its DMA bytes at "
          f"{MODEL.dram_bytes_per_s / 1e9:g} GB/s {dram * 1e3:.3f} ms; the weights at that rate {weights * 1e3:.3f} ms "
          f"({weights / total:.1%} of the roofline)")
    if args.json:
        from rkc.ir.atomic import write_atomic

        write_atomic(args.json, json.dumps({"segments": rs, "modelled_s": total, "dram_s": dram,
                                            "weights_s": weights}, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
