"""Figures of an LLM rkbin for `rkc inspect` and bench/llm.py: per-layer
segments, tasks and kicks per decode token and per prefill chunk, DDR bytes
per token next to the weight bytes, and modelled tokens/s.

The model (docs: compiler/cost.py, ir/npu/hw.py): an NPU segment takes
max(MACs / (3 cores x MACs per cycle at 1 GHz), DDR bytes / 25 GB/s), from the
emitter's own counters; each kick adds the stock-rocket kick overhead (30 us).
Kicks "with hardware chaining" are one per job of a chainable segment and one
per task otherwise (int8 segments are kicked task by task, hardware question Q1).
CPU steps are host work and are not part of the modelled NPU time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ir.npu import hw
from ir.program import Module, Program

BANDWIDTH = hw.DRAM_BYTES_PER_S_SUSTAINED  # 25 GB/s
CLOCK = hw.CLOCK_HZ_MAX  # 1 GHz
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass
class PhaseFigures:
    rows: int
    segments: int = 0
    tasks: int = 0
    kicks_chained: int = 0
    kicks_stock: int = 0
    cpu_steps: int = 0
    macs: int = 0
    ddr_bytes: int = 0
    npu_s: float = 0.0
    per_layer: dict[str, dict] = field(default_factory=dict)

    @property
    def kick_overhead_s(self) -> float:
        return self.kicks_chained * hw.KICK_OVERHEAD_S

    @property
    def seconds(self) -> float:
        return self.npu_s + self.kick_overhead_s

    @property
    def tokens_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def _segment_seconds(layers: list[dict], precision: str) -> tuple[int, int, float]:
    macs = sum(int(layer.get("macs", 0)) for layer in layers)
    ddr = sum(int(layer.get("ddr_bytes", 0)) for layer in layers)
    rate = hw.MACS_PER_CYCLE.get(precision, hw.MACS_PER_CYCLE["fp16"]) * hw.CORES * CLOCK
    return macs, ddr, max(macs / rate, ddr / BANDWIDTH)


def phase(module: Module, program: Program) -> PhaseFigures:
    precision = "int8" if module.metadata.get("precision") == "int8" else "fp16"
    rows = module.metadata.get("programs", {}).get(program.name, {}).get("rows", 1)
    f = PhaseFigures(rows)
    for s in program.steps:
        if s.kind == "cpu":
            f.cpu_steps += 1
            continue
        layers = s.stats.get("layers", [])
        macs, ddr, seconds = _segment_seconds(layers, precision)
        tasks = sum(len(j.tasks) for j in s.jobs)
        kicks = len(s.jobs) if s.chained else tasks
        f.segments += 1
        f.tasks += tasks
        f.kicks_chained += kicks
        f.kicks_stock += tasks
        f.macs += macs
        f.ddr_bytes += ddr
        f.npu_s += seconds
        m = _LAYER.match(_tensor(layers[0]["name"])) if layers else None
        key = f"layer {int(m.group(1))}" if m else "head"
        row = f.per_layer.setdefault(key, {"segments": [], "tasks": 0, "kicks": 0, "ddr_bytes": 0, "npu_us": 0.0})
        row["segments"].append("+".join(_short(layer["name"]) for layer in layers))
        row["tasks"] += tasks
        row["kicks"] += kicks
        row["ddr_bytes"] += ddr
        row["npu_us"] += seconds * 1e6
    return f


def _tensor(layer_name: str) -> str:
    """"Linear:decode/blk.0.q" -> "blk.0.q" (the output tensor, program prefix dropped)."""
    return layer_name.split(":", 1)[-1].rsplit("/", 1)[-1]


def _short(name: str) -> str:
    return _LAYER.sub("", _tensor(name))


def weight_bytes(module: Module) -> int:
    return sum(r.size for r in module.regions if r.kind == "weights")


def figures(module: Module) -> dict:
    """The JSON of `rkc inspect --json` for an LLM rkbin."""
    out: dict = {"model": module.metadata.get("name"), "precision": module.metadata.get("precision"),
                 "weight_bytes": weight_bytes(module), "clock_hz": CLOCK, "dram_bytes_per_s": BANDWIDTH,
                 "placement": module.metadata.get("placement", {}),
                 "quantization": module.metadata.get("quantization", {})}
    d = phase(module, module.program("decode"))
    out["decode"] = {"segments_per_token": d.segments, "tasks_per_token": d.tasks,
                     "kicks_per_token": d.kicks_chained, "kicks_per_token_stock": d.kicks_stock,
                     "cpu_steps_per_token": d.cpu_steps, "ddr_bytes_per_token": d.ddr_bytes,
                     "macs_per_token": d.macs, "modelled_npu_s": d.npu_s, "kick_overhead_s": d.kick_overhead_s,
                     "modelled_tokens_per_s": d.tokens_per_s, "per_layer": d.per_layer}
    out["prefill"] = {}
    for p in module.programs:
        if p.name.startswith("prefill_"):
            f = phase(module, p)
            out["prefill"][str(f.rows)] = {"segments": f.segments, "tasks": f.tasks, "kicks": f.kicks_chained,
                                           "ddr_bytes": f.ddr_bytes, "macs": f.macs, "modelled_npu_s": f.npu_s,
                                           "kick_overhead_s": f.kick_overhead_s,
                                           "modelled_tokens_per_s": f.tokens_per_s}
    return out


def quantization_lines(q: dict) -> list[str]:
    """How an int8 file's weights were made (compiler/llm/build.py)."""
    if not q:
        return []
    alpha = q["smooth_alpha"]
    alpha = (f"alpha per product group ({min(alpha.values())}..{max(alpha.values())})" if isinstance(alpha, dict)
             else f"alpha {alpha}")
    lines = [f"int8: SmoothQuant {alpha}, {q['scales']} row scales, {q['rounding']} rounding, "
             f"calibrated on {q['calibration']}"]
    hybrid = q.get("hybrid")
    if hybrid:
        lines.append(f"  hybrid: {len(hybrid['products'])} products kept fp16 (noisiest int8 groups on the "
                     f"calibration text, +{hybrid['extra_weight_bytes'] / 1e6:.1f} MB): "
                     f"{', '.join(n.removesuffix('.weight') for n in hybrid['products'])}")
    return lines


def summary_lines(module: Module) -> list[str]:
    fig = figures(module)
    d = fig["decode"]
    lines = [f"LLM {fig['model']} ({fig['precision']}): weights {fig['weight_bytes'] / 1e6:.1f} MB on the NPU, "
             f"one copy for {len(module.programs)} programs",
             *quantization_lines(fig["quantization"]),
             f"decode, per token: {d['segments_per_token']} NPU segments, {d['tasks_per_token']} tasks, "
             f"{d['kicks_per_token']} kicks with hardware chaining ({d['kicks_per_token_stock']} stock), "
             f"{d['cpu_steps_per_token']} CPU steps",
             f"  DDR {d['ddr_bytes_per_token'] / 1e6:.1f} MB per token vs {fig['weight_bytes'] / 1e6:.1f} MB of "
             f"weights; modelled {d['modelled_npu_s'] * 1e3:.2f} ms NPU + {d['kick_overhead_s'] * 1e3:.2f} ms "
             f"kicks = {d['modelled_tokens_per_s']:.1f} tokens/s at 1 GHz, 25 GB/s"]
    for rows, p in sorted(fig["prefill"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"prefill {rows}: {p['segments']} segments, {p['tasks']} tasks, {p['kicks']} kicks, "
                     f"DDR {p['ddr_bytes'] / 1e6:.1f} MB, modelled {p['modelled_tokens_per_s']:.0f} tokens/s")
    lines.append("decode segments per layer (tasks / kicks / DDR / modelled):")
    for key, row in d["per_layer"].items():
        lines.append(f"  {key:9s} {' | '.join(row['segments']):40s} {row['tasks']:4d} / {row['kicks']:4d} / "
                     f"{row['ddr_bytes'] / 1e6:7.2f} MB / {row['npu_us']:8.1f} us")
    return lines
