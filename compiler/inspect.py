"""What an rkbin holds, for people: a summary, the segment graph (DOT/SVG)
and a per-layer table. Reads only the Module (ir.program), so it works for
every rkbin, whatever graph it came from."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from dataclasses import dataclass

import networkx as nx
import numpy as np

from ir.errors import RkcError
from ir.npu import hw
from ir.program import Module, Program, Step
from ir.types import DType

NPU_COLOUR = "#8ecae6"
CPU_COLOUR = "#ffb703"
CONVERSION_COLOUR = "#fff1c1"  # host <-> NPU layout conversions (CPU steps)
IO_COLOUR = "#e9ecef"


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


def summary(module: Module) -> list[str]:
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
        tasks = sum(_tasks(s) for s in npu)
        jobs = sum(len(s.jobs) for s in npu)
        cycles = sum(layer.cycles or 0 for layer in layers(module) if layer.program == p.name)
        host_bytes = sum(tensor_bytes(module, n) for s in cpu for n in s.outputs if n)
        lines += [
            f"program {p.name!r}: inputs {', '.join(p.inputs)} -> outputs {', '.join(p.outputs)}",
            f"  segments: {len(npu)} NPU, {cpu_ops} CPU op step(s), {conversions} layout conversion(s)",
            f"  ops: {npu_ops} on the NPU, {cpu_ops} on the CPU",
            f"  tasks: {tasks}; kicks: {tasks} per run with stock rocket (one per task), "
            f"{jobs} with hardware chaining (one per job)",
            f"  host activations written: {host_bytes:,} B",
            f"  modelled NPU time: {cycles / hw.CLOCK_HZ_MAX * 1e3:.3f} ms at 1 GHz "
            f"(+ {tasks * hw.KICK_OVERHEAD_S * 1e3:.2f} ms kick overhead with stock rocket)",
        ]
    return lines


def segment_graph(module: Module, program: Program | None = None) -> nx.DiGraph:
    """Steps as nodes (NPU segments and CPU steps), tensors as edges from the
    step that writes them to every step that reads them."""
    p = program or module.programs[0]
    g = nx.DiGraph()
    writer: dict[str, str] = {}
    for name in p.inputs:
        g.add_node(f"in:{name}", kind="io", label=name)
        writer[name] = f"in:{name}"
    segment = 0
    for i, s in enumerate(p.steps):
        node = f"step{i}"
        if s.kind == "npu":
            segment += 1
            nbytes = sum(tensor_bytes(module, n) for n in [*s.inputs, *s.outputs] if n)
            ops = sum(len(layer["op"].split("+")) for layer in s.stats.get("layers", []))
            g.add_node(node, kind="npu", label=f"NPU segment {segment}\\n{ops} ops, {_tasks(s)} tasks\\n"
                                               f"{nbytes:,} B in/out")
        elif s.stats.get("conversion"):
            g.add_node(node, kind="conversion", label=s.name.replace(":", "\\n", 1))
        else:
            g.add_node(node, kind="cpu", label=f"{s.op}\\n{s.name}" if s.name != s.op else s.op)
        for name in s.inputs:
            if name and name in writer:
                g.add_edge(writer[name], node, bytes=tensor_bytes(module, name))
        for name in s.outputs:
            writer[name] = node
    for name in p.outputs:
        g.add_node(f"out:{name}", kind="io", label=name)
        if name in writer:
            g.add_edge(writer[name], f"out:{name}", bytes=tensor_bytes(module, name))
    return g


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\\\\n", "\\n") + '"'


def to_dot(g: nx.DiGraph, title: str = "rkbin") -> str:
    colour = {"npu": NPU_COLOUR, "cpu": CPU_COLOUR, "conversion": CONVERSION_COLOUR, "io": IO_COLOUR}
    shape = {"npu": "box", "cpu": "box", "conversion": "note", "io": "ellipse"}
    lines = [f"digraph {_q(title)} {{", "  rankdir=TB;", '  node [style="filled,rounded", fontname="Helvetica"];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for node, data in g.nodes(data=True):
        lines.append(f"  {_q(node)} [label={_q(data['label'])}, shape={shape[data['kind']]}, "
                     f"fillcolor={_q(colour[data['kind']])}];")
    for a, b, data in g.edges(data=True):
        label = _q(f"{data['bytes']:,} B")
        lines.append(f"  {_q(a)} -> {_q(b)} [label={label}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_text: str) -> bytes:
    exe = shutil.which("dot")
    if exe is None:
        raise RkcError("--svg needs Graphviz's `dot` program (Debian/Ubuntu: apt-get install graphviz); "
                       "--dot FILE writes the graph without it")
    result = subprocess.run([exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, check=False)
    if result.returncode != 0:
        raise RkcError(f"dot failed: {result.stderr.decode(errors='replace').strip().splitlines()[0]}")
    return result.stdout


def layers_csv(module: Module) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["program", "step", "layer", "op", "device", "macs", "ddr_bytes", "modelled_cycles"])
    for layer in layers(module):
        w.writerow([layer.program, layer.step, layer.name, layer.op, layer.device, layer.macs, layer.ddr_bytes,
                    "" if layer.cycles is None else layer.cycles])
    return out.getvalue()
