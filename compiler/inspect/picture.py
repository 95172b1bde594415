"""`rkc inspect --dot/--svg/--png`: which program is drawn, how, and the
files written (atomically, umask honoured: rkc.ir.atomic). An LLM's decode
program by default, its layers folded (fold.py); `full` draws every step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rkc.compiler.inspect.dot import GraphvizMissing, render, to_dot
from rkc.compiler.inspect.fold import find_layers, folded_graph, layer_kinds
from rkc.ir.atomic import write_atomic
from rkc.ir.program import Module, Program


def default_program(module: Module) -> Program:
    """An LLM's decode program (what runs per token), else the first."""
    if module.metadata.get("model_kind") == "llm" and any(p.name == "decode" for p in module.programs):
        return module.program("decode")
    return module.programs[0]


def _sink(module: Module, program: Program) -> str | None:
    """Where an LLM program's logits go on the host (runtime/llm): the next token, or scores per row."""
    if module.metadata.get("model_kind") != "llm":
        return None
    plan = module.metadata.get("programs", {}).get(program.name, {})
    if plan.get("rows", 1) == 1 or plan.get("last_row_only"):
        return "sampling\\n(next token, host CPU)"
    return "scoring\\n(log-probability per row, host CPU)"


@dataclass
class Picture:
    program: Program
    dot: str
    nodes: int
    layers: int  # layers found (0: none, nothing folded)
    kinds: int  # distinct layer structures
    full: bool  # every layer drawn

    def describe(self) -> str:
        folded = ("" if not self.layers else f", {self.layers} layers drawn one by one" if self.full
                  else f", {self.layers} layers drawn as {self.kinds} kind(s)")
        return f"segment graph of {self.program.name!r}: {self.nodes} nodes{folded}"


def picture(module: Module, title: str, program: str | None = None, full: bool = False) -> Picture:
    prog = module.program(program) if program else default_program(module)
    g = folded_graph(module, prog, _sink(module, prog), full)
    layers = find_layers(prog)
    return Picture(prog, to_dot(g, f"{title} {prog.name}"), g.number_of_nodes(), len(layers),
                   len(layer_kinds(prog, layers)), full)


def write_pictures(pic: Picture, dot_path: str | None = None, drawings: dict[str, str] | None = None) -> None:
    """The DOT to `dot_path`, and each {format: path} of `drawings` rendered by
    Graphviz. Without Graphviz the DOT is still written (to `dot_path`, else
    beside the first drawing) and the error says where."""
    if dot_path:
        write_atomic(dot_path, pic.dot)
    for fmt, path in (drawings or {}).items():
        try:
            data = render(pic.dot, fmt)
        except GraphvizMissing as exc:
            kept = dot_path or str(Path(path).with_suffix(".dot"))
            if not dot_path:
                write_atomic(kept, pic.dot)
            raise GraphvizMissing(f"{exc}; the graph is written as DOT to {kept}") from None
        write_atomic(path, data)
