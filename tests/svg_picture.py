"""What a picture Graphviz drew shows, read back from its SVG: clusters with
their title lines and the nodes drawn inside their box, nodes with their text
lines, edges with their labels. Tests check the drawing, not the DOT we fed it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

_NS = {"svg": "http://www.w3.org/2000/svg"}


@dataclass
class Cluster:
    lines: list[str]
    box: tuple[float, float, float, float]  # x0, y0, x1, y1
    nodes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Picture:
    clusters: dict[str, Cluster]  # "cluster_x" -> cluster
    nodes: dict[str, list[str]]  # node name -> its text lines
    edges: dict[tuple[str, str], str]  # (from, to) -> label

    def nodes_with(self, text: str) -> list[str]:
        return [n for n, lines in self.nodes.items() if any(text in line for line in lines)]

    def cluster_of(self, node: str) -> str | None:
        """The innermost cluster whose box holds the node's text."""
        inside = [k for k, c in self.clusters.items() if node in c.nodes]
        return min(inside, key=lambda k: _area(self.clusters[k].box), default=None)


def _area(box) -> float:
    return (box[2] - box[0]) * (box[3] - box[1])


def _texts(g) -> list[tuple[str, float, float]]:
    return [(t.text or "", float(t.get("x")), float(t.get("y"))) for t in g.findall("svg:text", _NS)]


def _outline(g) -> tuple[list[float], list[float]]:
    """The x and y coordinates of a cluster's box (a polygon, or a path when rounded)."""
    shape = g.find("svg:polygon", _NS)
    text = shape.get("points") if shape is not None else g.find("svg:path", _NS).get("d")
    numbers = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", text)]
    return numbers[0::2], numbers[1::2]


def read_svg(path: str | Path) -> Picture:
    root = ET.parse(path).getroot()
    clusters, nodes, edges, where = {}, {}, {}, {}
    for g in root.iter(f"{{{_NS['svg']}}}g"):
        kind, title = g.get("class"), g.findtext("svg:title", "", _NS)
        texts = _texts(g)
        if kind == "cluster":
            xs, ys = _outline(g)
            clusters[title] = Cluster([t for t, _, _ in texts], (min(xs), min(ys), max(xs), max(ys)))
        elif kind == "node":
            nodes[title] = [t for t, _, _ in texts]
            where[title] = texts[0][1:] if texts else None
        elif kind == "edge":
            a, _, b = title.partition("->")
            edges[(a, b)] = " ".join(t for t, _, _ in texts)
    for name, xy in where.items():
        for c in clusters.values():
            if xy and c.box[0] <= xy[0] <= c.box[2] and c.box[1] <= xy[1] <= c.box[3]:
                c.nodes.append(name)
    return Picture(clusters, nodes, edges)
