"""A segment graph (graph.py / fold.py) as Graphviz DOT, and DOT rendered to
SVG or PNG by Graphviz's `dot` (a separate program: apt-get install graphviz)."""

from __future__ import annotations

import shutil
import subprocess

import networkx as nx

from rkc.ir.errors import RkcError

COLOUR = {"npu": "#8ecae6", "cpu": "#ffb703", "conversion": "#fff1c1", "io": "#e9ecef"}  # conversion: CPU steps
SHAPE = {"npu": "box", "cpu": "box", "conversion": "note", "io": "ellipse"}
CLUSTER_COLOUR = "#f4f6f8"
# Beyond this many nodes (an LLM drawn with --full) dot's network-simplex
# ranking dominates: one pass instead of its default search draws Gemma 3
# 270M's 568 steps in ~8 s instead of ~22 s (same lines, slightly longer edges)
LARGE_GRAPH_NODES = 200
LARGE_GRAPH_LAYOUT = "nslimit=1; nslimit1=1; mclimit=0.1;"
RENDER_TIMEOUT_S = 120.0  # a layout still running after this is not one a person will wait for
FORMATS = ("svg", "png")


class GraphvizMissing(RkcError):
    """Graphviz's `dot` is not on PATH."""


def _q(text: str) -> str:
    """A DOT string; "\\n" in `text` stays DOT's centred line break."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\\\\n", "\\n") + '"'


def _node(node: str, data: dict) -> str:
    kind = data["kind"]
    return (f"{_q(node)} [label={_q(data['label'])}, shape={SHAPE[kind]}, "
            f"fillcolor={_q(COLOUR[kind])}];")


def to_dot(g: nx.DiGraph, title: str = "rkbin") -> str:
    """Nodes in their order, those of a cluster inside its subgraph
    "cluster_<key>" (titled by g.graph["clusters"][key]); edges labelled with
    their bytes."""
    lines = [f"digraph {_q(title)} {{", "  rankdir=TB; ranksep=0.3; nodesep=0.3;",
             '  node [style="filled,rounded", fontname="Helvetica", fontsize=11];',
             '  edge [fontname="Helvetica", fontsize=9];']
    if g.number_of_nodes() > LARGE_GRAPH_NODES:
        lines.append(f"  {LARGE_GRAPH_LAYOUT}")
    clusters: dict = g.graph.get("clusters", {})
    members: dict[str, list[str]] = {key: [] for key in clusters}
    for node, data in g.nodes(data=True):
        if data.get("cluster") is None:
            lines.append(f"  {_node(node, data)}")
        else:
            members[data["cluster"]].append(node)
    for key, title_text in clusters.items():
        lines += [f"  subgraph {_q('cluster_' + key)} {{",
                  f"    label={_q(title_text)}; labeljust=l; fontname=\"Helvetica\"; "
                  f"style=\"rounded,filled\"; fillcolor={_q(CLUSTER_COLOUR)};"]
        lines += [f"    {_node(n, g.nodes[n])}" for n in members[key]]
        lines.append("  }")
    for a, b, data in g.edges(data=True):
        lines.append(f"  {_q(a)} -> {_q(b)} [label={_q(format(data['bytes'], ',') + ' B')}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def graphviz() -> str:
    """The path of `dot`, or a one-line error saying how to install it."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing("drawing needs Graphviz's `dot` program, not found on PATH "
                              "(Debian/Ubuntu: apt-get install graphviz)")
    return exe


def render(dot_text: str, fmt: str, timeout_s: float = RENDER_TIMEOUT_S) -> bytes:
    """`dot_text` laid out and drawn as `fmt` (svg or png)."""
    if fmt not in FORMATS:
        raise RkcError(f"cannot draw {fmt!r} (choose {' or '.join(FORMATS)})")
    try:
        result = subprocess.run([graphviz(), f"-T{fmt}"], input=dot_text.encode(), capture_output=True,
                                check=False, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RkcError(f"dot did not finish laying out the graph in {timeout_s:.0f} s") from None
    if result.returncode != 0:
        lines = result.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
        raise RkcError(f"dot failed: {lines[0]}")
    return result.stdout
