"""What an rkbin holds, for people: a summary, the modelled figures and a
per-layer table (here), and the segment graph (graph.py: steps and tensors;
fold.py: repeated layers folded into one; dot.py: DOT text and Graphviz
rendering). Reads only the Module (ir.program), so it works for every rkbin,
whatever graph it came from.

Modelled NPU figures apply the one performance model (ir/npu/perf.py, the
simulator's) to the per-task counters the compiler stored with each NPU step
(`stats["task_costs"]`): the same figures `rkrun` reports after a simulated run."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.npu.perf import JobCost, PerfModel, TaskCost, describe
from rkc.ir.program import Module, Step
from rkc.ir.types import DType


def tensor_bytes(module: Module, name: str) -> int:
    t = module.tensor(name)
    return t.nbytes or int(np.prod(t.shape, dtype=np.int64)) * DType(t.dtype).itemsize


@dataclass
class Layer:
    program: str
    step: str
    name: str
    op: str
    device: str
    macs: int
    ddr_bytes: int
    cycles: int | None


def layers(module: Module) -> list[Layer]:
    rows = []
    for p in module.programs:
        for s in p.steps:
            if s.kind == "npu":
                for layer in s.stats.get("layers", []):
                    rows.append(Layer(p.name, s.name, layer["name"], layer["op"], "npu", layer.get("macs", 0),
                                      layer.get("ddr_bytes", 0), layer.get("cycles")))
            else:
                rows.append(Layer(p.name, s.name, s.name, s.op, "cpu", s.stats.get("macs", 0),
                                  s.stats.get("ddr_bytes", 0), None))
    return rows


def _tasks(step: Step) -> int:
    return sum(len(j.tasks) for j in step.jobs)


def planned_jobs(step: Step, chaining: bool) -> list[JobCost]:
    """An NPU step's jobs as the performance model sees them. `chaining`: one
    kick per job where the step is chainable (as the runtime submits it to a
    device that chains), else one kick per task (stock rocket)."""
    costs = step.stats.get("task_costs")
    if costs is None or len(costs) != len(step.jobs):
        raise FormatError(f"step {step.name!r} has no per-task counters (an rkbin from an older rkc: recompile it)")
    return [JobCost(job.lane, 1 if chaining and step.chained else len(job.tasks), [TaskCost(*c) for c in tasks])
            for job, tasks in zip(step.jobs, costs)]


@dataclass
class NpuFigures:
    """The modelled NPU figures of some steps, with hardware chaining and with stock rocket."""

    segments: int = 0
    tasks: int = 0
    kicks_chained: int = 0
    kicks_stock: int = 0
    macs: int = 0
    ddr_bytes: int = 0
    seconds_chained: float = 0.0  # kick overhead included
    seconds_stock: float = 0.0
    busy_seconds: float = 0.0  # the same without any kick overhead

    def add(self, step: Step, model: PerfModel) -> None:
        chained, stock = planned_jobs(step, True), planned_jobs(step, False)
        self.segments += 1
        self.tasks += _tasks(step)
        self.kicks_chained += sum(j.kicks for j in chained)
        self.kicks_stock += sum(j.kicks for j in stock)
        self.macs += sum(t.macs for j in chained for t in j.tasks)
        self.ddr_bytes += sum(t.dma_bytes for j in chained for t in j.tasks)
        self.seconds_chained += model.submission_seconds(chained)
        self.seconds_stock += model.submission_seconds(stock)
        self.busy_seconds += replace(model, kick_overhead_s=0.0).submission_seconds(chained)

    @property
    def kick_seconds_chained(self) -> float:
        return self.seconds_chained - self.busy_seconds


def npu_figures(steps: list[Step], model: PerfModel | None = None) -> NpuFigures:
    f, model = NpuFigures(), model or PerfModel()
    for s in steps:
        if s.kind == "npu":
            f.add(s, model)
    return f


def figures(module: Module, model: PerfModel | None = None) -> dict:
    """The JSON of `rkc inspect --json` for a (non-LLM) rkbin: per program, its
    modelled NPU figures with hardware chaining ("kicks", "modelled_npu_s", kick
    overhead included) and with stock rocket (the *_stock keys)."""
    model = model or PerfModel()
    out: dict = {"source": module.metadata.get("source"), "precision": module.metadata.get("precision"),
                 "clock_hz": model.clock_hz, "dram_bytes_per_s": model.dram_bytes_per_s,
                 "kick_overhead_s_each": model.kick_overhead_s, "programs": {}}
    for p in module.programs:
        f = npu_figures(p.steps, model)
        out["programs"][p.name] = {
            "segments": f.segments, "tasks": f.tasks, "kicks": f.kicks_chained, "kicks_stock": f.kicks_stock,
            "macs": f.macs, "ddr_bytes": f.ddr_bytes, "modelled_npu_s": f.seconds_chained,
            "kick_overhead_s": f.kick_seconds_chained, "modelled_npu_s_stock": f.seconds_stock}
    return out


def summary(module: Module, model: PerfModel | None = None) -> list[str]:
    region = {r.kind: 0 for r in module.regions}
    for r in module.regions:
        region[r.kind] = region.get(r.kind, 0) + r.size
    lines = [f"rkbin: {module.metadata.get('source', '?')} ({module.metadata.get('precision', '?')}), "
             f"{len(module.programs)} program(s)",
             f"  weights: {region.get('weights', 0):,} B NPU, {region.get('host', 0):,} B host; "
             f"activations: {region.get('scratch', 0):,} B NPU scratch; regcmd: {region.get('regcmd', 0):,} B"]
    for p in module.programs:
        npu = [s for s in p.steps if s.kind == "npu"]
        cpu = [s for s in p.steps if s.kind == "cpu"]
        npu_ops = sum(len(layer["op"].split("+")) for s in npu for layer in s.stats.get("layers", []))
        cpu_ops = sum(1 for s in cpu if not s.stats.get("conversion"))
        conversions = len(cpu) - cpu_ops
        f = npu_figures(npu, model)
        host_bytes = sum(tensor_bytes(module, n) for s in cpu for n in s.outputs if n)
        lines += [
            f"program {p.name!r}: inputs {', '.join(p.inputs)} -> outputs {', '.join(p.outputs)}",
            f"  segments: {len(npu)} NPU, {cpu_ops} CPU op step(s), {conversions} layout conversion(s)",
            f"  ops: {npu_ops} on the NPU, {cpu_ops} on the CPU",
            f"  tasks: {f.tasks}; kicks: {f.kicks_chained} with hardware chaining (one per job of a chainable "
            f"segment), {f.kicks_stock} with stock rocket (one per task)",
            f"  host activations written: {host_bytes:,} B",
            f"  {describe(f.seconds_chained, f.tasks, f.kicks_chained, f.ddr_bytes, True)}",
        ]
        if f.kicks_stock != f.kicks_chained:
            lines.append(f"  {describe(f.seconds_stock, f.tasks, f.kicks_stock, f.ddr_bytes, False)}")
    return lines


def layers_csv(module: Module) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["program", "step", "layer", "op", "device", "macs", "ddr_bytes", "modelled_cycles"])
    for layer in layers(module):
        w.writerow([layer.program, layer.step, layer.name, layer.op, layer.device, layer.macs, layer.ddr_bytes,
                    "" if layer.cycles is None else layer.cycles])
    return out.getvalue()
