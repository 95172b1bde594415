"""A program's steps as a graph: NPU segments, CPU steps and layout conversions
as nodes, tensors as edges (bytes) from the step that writes them to every
step that reads them, the program's inputs and outputs at the ends.

Nodes carry `kind` (npu, cpu, conversion, io), `label` and `cluster` (the
key of g.graph["clusters"], {key: title} in drawing order, or None); fold.py
groups and folds them, dot.py draws them."""

from __future__ import annotations

from collections import Counter

import networkx as nx

from rkc.compiler.inspect import _tasks, tensor_bytes
from rkc.ir.program import Module, Program, Step

CONVERSION_PREFIXES = ("to_npu:", "from_npu:")  # how program_steps.py and llm/program_builder.py name them
NAMED_PRODUCTS_MAX = 4  # an NPU segment with up to this many ops lists them; more: counts per op type


def local_name(program: Program, name: str) -> str:
    """"decode/blk.0.q" -> "blk.0.q": an LLM program's values carry the program's name."""
    return name.removeprefix(f"{program.name}/")


def is_conversion(step: Step) -> bool:
    return step.kind == "cpu" and (bool(step.stats.get("conversion")) or step.name.startswith(CONVERSION_PREFIXES))


def step_kind(step: Step) -> str:
    return "npu" if step.kind == "npu" else "conversion" if is_conversion(step) else "cpu"


def segment_precision(step: Step) -> str:
    """The dtype(s) an NPU segment computes in, from its layers' stats ("fp16", "int8", "int8+fp16")."""
    kinds = sorted({layer.get("dtype", "?") for layer in step.stats.get("layers", [])})
    return "+".join(kinds) or "?"


def segment_products(program: Program, step: Step, drop: str = "") -> list[str]:
    """Its ops' names, "Linear:decode/blk.0.q" -> "q" (program and `drop`, e.g. "blk.0.", removed)."""
    out = []
    for layer in step.stats.get("layers", []):
        name = local_name(program, layer["name"].split(":", 1)[-1])
        out.append(name.removeprefix(drop) if drop else name)
    return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _npu_label(module: Module, program: Program, step: Step, number: int, drop: str) -> str:
    layers = step.stats.get("layers", [])
    ops = [op for layer in layers for op in layer["op"].split("+")]
    if not layers:
        what = "no ops"
    elif len(layers) <= NAMED_PRODUCTS_MAX:
        names = segment_products(program, step, drop)
        types = {layer["op"] for layer in layers}
        what = (f"{types.pop()} {', '.join(names)}" if len(types) == 1
                else ", ".join(f"{layer['op']} {n}" for layer, n in zip(layers, names)))
    else:
        counts = Counter(ops)
        what = ", ".join(f"{n} {op}" for op, n in counts.most_common(3)) + (", ..." if len(counts) > 3 else "")
    io_bytes = sum(tensor_bytes(module, n) for n in [*step.inputs, *step.outputs] if n)
    ddr = sum(layer.get("ddr_bytes", 0) for layer in layers)
    return (f"NPU segment {number} ({segment_precision(step)})\\n{what}\\n{_count(len(ops), 'op')}, {_count(_tasks(step), 'task')}\\n"
            f"{io_bytes:,} B in/out, {ddr:,} B DDR")


def step_label(module: Module, program: Program, step: Step, number: int, drop: str = "") -> str:
    """What a node says. `number`: the segment's number (NPU steps); `drop`: a
    name prefix the surrounding cluster already states (e.g. "blk.0.")."""
    if step.kind == "npu":
        return _npu_label(module, program, step, number, drop)
    if is_conversion(step):
        direction, _, tensor = step.name.partition(":")
        to = step.attrs.get("to")
        return f"{direction}: {step.op}{' ' + to if to else ''}\\n{local_name(program, tensor)}"
    name = local_name(program, step.name)
    return f"{step.op}\\n{name}" if name != step.op else step.op


def step_graph(module: Module, program: Program, sink: str | None = None) -> nx.DiGraph:
    """Every step of `program` a node "step<i>"; inputs "in:<name>", outputs
    "out:<name>"; `sink`: a last node the outputs go to (an LLM's sampling)."""
    g = nx.DiGraph(clusters={})
    writer: dict[str, str] = {}
    for name in program.inputs:
        g.add_node(f"in:{name}", kind="io", label=local_name(program, name), cluster=None)
        writer[name] = f"in:{name}"
    segment = 0
    for i, s in enumerate(program.steps):
        node = f"step{i}"
        segment += s.kind == "npu"
        g.add_node(node, kind=step_kind(s), label=step_label(module, program, s, segment), cluster=None, step=i,
                   segment=segment if s.kind == "npu" else None)
        for name in s.inputs:
            if name and name in writer:
                g.add_edge(writer[name], node, bytes=tensor_bytes(module, name))
        for name in s.outputs:
            writer[name] = node
    for name in program.outputs:
        g.add_node(f"out:{name}", kind="io", label=local_name(program, name), cluster=None)
        if name in writer:
            g.add_edge(writer[name], f"out:{name}", bytes=tensor_bytes(module, name))
        if sink:
            g.add_node("sink", kind="io", label=sink, cluster=None)
            g.add_edge(f"out:{name}", "sink", bytes=tensor_bytes(module, name))
    return g
