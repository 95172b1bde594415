"""Figures of an LLM rkbin for `rkc inspect` and bench/llm.py: per-layer
segments, tasks and kicks per decode token and per prefill chunk, DDR bytes
per token next to the weight bytes, and modelled tokens/s.

The figures apply the one performance model (ir/npu/perf.py, the simulator's)
to the per-task counters stored with each NPU step (compiler/inspect.py
npu_figures): per task max(MAC time, DMA time), kicks x kick overhead, lanes on
3 cores sharing DRAM, at 1 GHz and 25 GB/s. "With hardware chaining" is one kick
per job of a chainable segment and one per task otherwise (int8 segments are
kicked task by task, hardware question Q1): what `rkrun` submits to the
simulator. CPU steps are host work and are not part of the modelled NPU time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from rkc.compiler.inspect import NpuFigures, npu_figures
from rkc.compiler.llm.cpu_work import UNKNOWN, WHY_ON_CPU, HostCosts, cpu_lines, cpu_steps, prefill_lines
from rkc.compiler.llm.prefill_fp16 import prefill_fp16_line
from rkc.compiler.llm.quantize import ROUNDINGS
from rkc.ir.llm import DECODE, programs_in
from rkc.ir.npu.perf import PerfModel, describe
from rkc.ir.program import Module, Program, Step

MODEL = PerfModel()  # the defaults of ir/npu/hw.py (1 GHz, 25 GB/s, 3 cores, stock-rocket kicks); --dram-gbps overrides
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass
class PhaseFigures:
    rows: int
    npu: NpuFigures
    cpu_steps: int = 0
    per_layer: dict[str, dict] = field(default_factory=dict)

    def tokens_per_s(self, seconds: float) -> float:
        return self.rows / seconds if seconds else 0.0


def phase(module: Module, program: Program, model: PerfModel = MODEL) -> PhaseFigures:
    rows = programs_in(module.metadata)[program.name].rows
    f = PhaseFigures(rows, npu_figures(program.steps, model))
    f.cpu_steps = cpu_steps(program)
    for s in program.steps:
        if s.kind != "npu":
            continue
        layers = s.stats.get("layers", [])
        one = npu_figures([s], model)
        row = f.per_layer.setdefault(layer_key(s), {"segments": [], "tasks": 0, "kicks": 0, "ddr_bytes": 0, "npu_us": 0.0})
        row["segments"].append("+".join(_short(layer["name"]) for layer in layers))
        row["tasks"] += one.tasks
        row["kicks"] += one.kicks_chained
        row["ddr_bytes"] += one.ddr_bytes
        row["npu_us"] += one.seconds_chained * 1e6
    return f


def layer_key(step: Step) -> str:
    """Which per-layer row of PhaseFigures an NPU step counts in: the first
    layer it has a product of ("layer N"; gemma4's per-layer embeddings'
    projection shares layer 0's q/k/v segment), else "head"."""
    layers = step.stats.get("layers", [])
    m = next((m for m in (_LAYER.match(_tensor(x["name"])) for x in layers) if m), None)
    return f"layer {int(m.group(1))}" if m else "head"


GATHERS = ("GatherRows", "GatherPacked")


def cpu_gathers(module: Module, program: Program) -> list[dict]:
    """Per embedding gather of `program` (on the CPU): the table, its bytes, and
    the bytes one run reads of it (its rows, never the whole table)."""
    out = []
    for s in program.steps:
        if s.kind != "cpu" or s.op not in GATHERS:
            continue
        if s.op == "GatherRows":
            table, ids = module.tensor(s.inputs[0]), module.tensor(s.inputs[1])
            row = table.nbytes // table.shape[0] if table.nbytes else int(np.prod(table.shape[1:])) * \
                np.dtype(table.dtype).itemsize
            total = table.nbytes or row * table.shape[0]
            name = table.name
        else:
            ids = module.tensor(s.inputs[0])
            name, total = s.attrs["packed"], module.tensor(s.attrs["packed"]).nbytes
            row = int(s.attrs["cols"]) * np.dtype(s.attrs["dtype"]).itemsize
        out.append({"table": name, "table_bytes": int(total), "bytes_per_run": int(row * ids.shape[0]),
                    "rows_per_run": int(ids.shape[0])})
    return out


def boundary_lines(program: Program, layer: str = "layer 0") -> list[str]:
    """Why `layer`'s segments are apart: the CPU steps before each of its
    segments (since the previous segment), each with its kind of boundary
    (compiler/llm/cpu_work.WHY_ON_CPU)."""
    lines, stretch = [], []
    for s in program.steps:
        if s.kind == "cpu":
            stretch.append(s.op)
            continue
        if layer_key(s) == layer:
            label = "+".join(_short(x["name"]) for x in s.stats.get("layers", []))
            ops = ", ".join(f"{op} ({WHY_ON_CPU.get(op, UNKNOWN)[0]})" for op in dict.fromkeys(stretch))
            lines.append(f"  before {label}: {ops or 'nothing'}")
        stretch = []
    if not lines:
        return []
    return [f"{layer}'s boundaries (the CPU steps before each segment, and their kind; why: below)", *lines]


def _tensor(layer_name: str) -> str:
    """"Linear:decode/blk.0.q" -> "blk.0.q" (the output tensor, program prefix dropped)."""
    return layer_name.split(":", 1)[-1].rsplit("/", 1)[-1]


def _short(name: str) -> str:
    return _LAYER.sub("", _tensor(name))


def weight_bytes(module: Module) -> int:
    return sum(r.size for r in module.regions if r.kind == "weights")


def _phase_json(f: PhaseFigures) -> dict:
    n = f.npu
    return {"segments": n.segments, "tasks": n.tasks, "kicks": n.kicks_chained, "kicks_stock": n.kicks_stock,
            "cpu_steps": f.cpu_steps, "ddr_bytes": n.ddr_bytes, "macs": n.macs,
            "modelled_npu_s": n.seconds_chained, "kick_overhead_s": n.kick_seconds_chained,
            "modelled_npu_s_stock": n.seconds_stock,
            "modelled_tokens_per_s": f.tokens_per_s(n.seconds_chained),
            "modelled_tokens_per_s_stock": f.tokens_per_s(n.seconds_stock)}


def figures(module: Module, model: PerfModel = MODEL) -> dict:
    """The JSON of `rkc inspect --json` for an LLM rkbin. Per phase: "kicks" and
    "modelled_npu_s" (kick overhead included, "kick_overhead_s" of it) with
    hardware chaining, as `rkrun` runs on the simulator; the *_stock keys with
    stock rocket."""
    out: dict = {"model": module.metadata.get("name"), "precision": module.metadata.get("precision"),
                 "weight_bytes": weight_bytes(module), "clock_hz": model.clock_hz,
                 "dram_bytes_per_s": model.dram_bytes_per_s, "kick_overhead_s_each": model.kick_overhead_s,
                 "placement": module.metadata.get("placement", {}),
                 "quantization": module.metadata.get("quantization", {})}
    decode = phase(module, module.program(DECODE), model)
    d = _phase_json(decode)
    out["decode"] = {"segments_per_token": d.pop("segments"), "tasks_per_token": d.pop("tasks"),
                     "kicks_per_token": d.pop("kicks"), "kicks_per_token_stock": d.pop("kicks_stock"),
                     "cpu_steps_per_token": d.pop("cpu_steps"), "ddr_bytes_per_token": d.pop("ddr_bytes"),
                     "macs_per_token": d.pop("macs"), **d}
    out["decode"]["per_layer"] = decode.per_layer
    out["decode"]["cpu_gathers"] = cpu_gathers(module, module.program(DECODE))
    out["prefill"] = {}
    table = programs_in(module.metadata)
    for p in module.programs:
        if table[p.name].last_row_only:
            f = phase(module, p, model)
            out["prefill"][str(f.rows)] = _phase_json(f)
    return out


def quantization_lines(q: dict) -> list[str]:
    """How an int8 file's weights were made (compiler/llm/build.py)."""
    if not q:
        return []
    alpha = q["smooth_alpha"]
    alpha = (f"alpha per product group ({min(alpha.values())}..{max(alpha.values())})" if isinstance(alpha, dict)
             else f"alpha {alpha}")
    forms = q.get("rotation_forms") or {}
    rotation = (f"inputs rotated ({q['rotation']}: {', '.join(f'K={k}: {f}' for k, f in forms.items())})" if forms
                else "inputs not rotated")
    cal = f"calibrated on {q['calibration']}" if q.get("calibration") else "no calibration"
    residual = {"head": ", the head's input as two int8 rows (value + residual)",
                "all": ", every input as two int8 rows (value + residual)"}.get(q.get("residual"), "")
    scheme = ROUNDINGS.get(q["rounding"])
    rounding = f"{q['rounding']} rounding" + (f" ({scheme.summary})" if scheme else "")
    lines = [f"int8: SmoothQuant {alpha}, {q['scales']} row scales, {rounding}, {rotation}, {cal}"
             f"{residual}",
             "  every product int8" if not q.get("hybrid") and not q.get("keep_fp16") else
             "  products kept fp16: see below" if q.get("hybrid") else
             f"  products kept fp16: {', '.join(q['keep_fp16'])}"]
    four = q.get("int4")
    if four:  # an int4 build: its products' precision replaces the int8 line
        groups = ", ".join(f"K={k}: {g}" for k, g in four.get("groups", {}).items())
        lines[0] = lines[0].replace("int8: ", "int4 (W4A8; the int8 preparation): ", 1)
        lines[1] = (f"  {four['products']} products int4 (weight groups along K {groups}; "
                    f"{four['weight_bytes'] / 1e6:.1f} MB), activations int8 as two nibble rows"
                    + (f"; kept int8: {', '.join(n.removesuffix('.weight') for n in four['keep_int8'])}"
                       if four.get("keep_int8") else ""))
    if q.get("prefill_fp16"):
        lines.append("  " + prefill_fp16_line(q["prefill_fp16"]))
    hybrid = q.get("hybrid")
    if hybrid:
        lines.append(f"  hybrid: {len(hybrid['products'])} products kept fp16 (noisiest int8 groups on the "
                     f"calibration text, +{hybrid['extra_weight_bytes'] / 1e6:.1f} MB): "
                     f"{', '.join(n.removesuffix('.weight') for n in hybrid['products'])}")
    return lines


def summary_lines(module: Module, model: PerfModel = MODEL, host_costs: HostCosts | None = None) -> list[str]:
    """`rkc inspect`'s text; with measured host costs (bench/llm.py --host-costs),
    the projected decode against llama.cpp's CPU decode."""
    fig = figures(module, model)
    d = fig["decode"]
    tasks, ddr = d["tasks_per_token"], d["ddr_bytes_per_token"]
    chained = describe(d["modelled_npu_s"], tasks, d["kicks_per_token"], ddr, True)
    lines = [f"LLM {fig['model']} ({fig['precision']}): weights {fig['weight_bytes'] / 1e6:.1f} MB on the NPU, "
             f"one copy for {len(module.programs)} programs",
             *quantization_lines(fig["quantization"]),
             f"decode, per token: {d['segments_per_token']} NPU segments, {tasks} tasks, "
             f"{d['kicks_per_token']} kicks with hardware chaining ({d['kicks_per_token_stock']} with stock "
             f"rocket), {d['cpu_steps_per_token']} CPU steps",
             f"  DDR {ddr / 1e6:.1f} MB per token vs {fig['weight_bytes'] / 1e6:.1f} MB of weights",
             *(f"  CPU gather of {g['table']}: {g['bytes_per_run']:,} bytes per token of its "
               f"{g['table_bytes'] / 1e6:.1f} MB (its rows only)" for g in d["cpu_gathers"]),
             f"  {chained} = {d['modelled_tokens_per_s']:.1f} tokens/s at {model.dram_bytes_per_s / 1e9:g} GB/s "
             f"({d['kick_overhead_s'] * 1e3:.2f} ms of it kicks)"]
    if d["kicks_per_token_stock"] != d["kicks_per_token"]:
        stock = describe(d["modelled_npu_s_stock"], tasks, d["kicks_per_token_stock"], ddr, False)
        lines.append(f"  {stock} = {d['modelled_tokens_per_s_stock']:.1f} tokens/s")
    for rows, p in sorted(fig["prefill"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"prefill {rows}: {p['segments']} segments, "
                     f"{describe(p['modelled_npu_s'], p['tasks'], p['kicks'], p['ddr_bytes'], True)}"
                     f" = {p['modelled_tokens_per_s']:.0f} tokens/s")
    lines.append("decode segments per layer (tasks / kicks with hardware chaining / DDR / modelled NPU time):")
    for key, row in d["per_layer"].items():
        lines.append(f"  {key:9s} {' | '.join(row['segments']):40s} {row['tasks']:4d} / {row['kicks']:4d} / "
                     f"{row['ddr_bytes'] / 1e6:7.2f} MB / {row['npu_us']:8.1f} us")
    lines += boundary_lines(module.program(DECODE))
    lines += cpu_lines(module.program(DECODE), d["modelled_npu_s"], host_costs)
    lines += prefill_lines(fig["prefill"], host_costs)
    return lines
