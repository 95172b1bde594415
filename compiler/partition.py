"""Partition a graph into steps: maximal convex NPU segments and single CPU ops.

Works on any ir.Graph (ONNX or LLM) given which ops may run on the NPU:

1. level(v) = the most CPU ops on any path from a graph input to v (CPU ops
   count after themselves). Two NPU ops on the same level can share a segment:
   a path between them has no CPU op on it, since that would raise the level.
2. Group NPU ops by level, then greedily merge groups whose union stays convex
   (no path leaves the union and comes back), which removes the splits that
   level-grouping makes between unrelated branches.
3. Order the steps (segments and CPU ops) topologically, stable with respect to
   the original op order.

A segment is convex: it never both feeds and depends on the same CPU op, so it
runs as one submission. The number of segments is at least the number of
"hard boundary" levels; the DOT export (compiler/segment_graph.py) shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import networkx as nx

from rkc.ir.graph import Graph


@dataclass
class Step:
    device: str  # "npu" (a segment) or "cpu" (one op)
    ops: list[int]  # op indices into graph.ops, in graph order
    inputs: list[str] = field(default_factory=list)  # tensors read from outside the step
    outputs: list[str] = field(default_factory=list)  # tensors read after the step (or graph outputs)


def _levels(dag: nx.DiGraph, kind: Callable[[int], object]) -> dict[int, int]:
    """Leaving a CPU op, or entering an NPU op of another kind, raises the level."""
    level: dict[int, int] = {}
    for v in nx.topological_sort(dag):
        level[v] = max((level[p] + (0 if kind(p) and (not kind(v) or kind(v) == kind(p)) else 1)
                        for p in dag.predecessors(v)), default=0)
    return level


def _quotient(dag: nx.DiGraph, groups: list[set[int]]) -> tuple[nx.DiGraph, dict[int, tuple]]:
    """The graph with every group contracted to one node ("seg", i); other ops
    stay ("op", v). Also returns each op's node."""
    owner: dict[int, tuple] = {v: ("op", v) for v in dag}
    for i, g in enumerate(groups):
        for v in g:
            owner[v] = ("seg", i)
    q = nx.DiGraph()
    q.add_nodes_from(set(owner.values()))
    q.add_edges_from((owner[a], owner[b]) for a, b in dag.edges if owner[a] != owner[b])
    return q, owner


def _convex_merge(dag: nx.DiGraph, groups: list[set[int]], kind: Callable[[int], object]) -> list[set[int]]:
    """Merge groups of one kind pairwise while the quotient graph stays acyclic."""
    merged = True
    while merged and len(groups) > 1:
        merged = False
        q, _ = _quotient(dag, groups)
        through = _paths_through_others(q)
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                a, b = ("seg", i), ("seg", j)
                if kind(next(iter(groups[i]))) != kind(next(iter(groups[j]))) \
                        or through(a, b) or through(b, a):
                    continue
                groups[i] = groups[i] | groups[j]
                del groups[j]
                merged = True
                break
            if merged:
                break
    return groups


def _paths_through_others(q: nx.DiGraph) -> Callable[[object, object], bool]:
    """through(a, b): is there a path a -> x -> ... -> b with x != b? Answered
    from every node's reachable set (a bitset), built once per quotient graph
    in reverse topological order (a search per pair: ~2.6k per LLM program)."""
    if not nx.is_directed_acyclic_graph(q):
        return lambda a, b: any(s != b and nx.has_path(q, s, b) for s in q.successors(a))
    index = {n: i for i, n in enumerate(q)}
    reach: dict = {}
    for n in reversed(list(nx.topological_sort(q))):
        bits = 1 << index[n]
        for s in q.successors(n):
            bits |= reach[s]
        reach[n] = bits
    return lambda a, b: any(s != b and reach[s] >> index[b] & 1 for s in q.successors(a))


def _as_units(dag: nx.DiGraph, unit: Callable[[int], object]) -> nx.DiGraph:
    """The dependency graph with every op of a unit (ops the NPU runs as one
    group: a convolution and the Add fused into its epilogue) depending on what
    any of them reads from outside: the group's tasks read all of it when they
    run, so a unit never straddles a CPU op that one of its members waits for."""
    members: dict[object, list[int]] = {}
    for v in dag:
        key = unit(v)
        if key is not None:
            members.setdefault(key, []).append(v)
    units = [vs for vs in members.values() if len(vs) > 1]
    if not units:
        return dag
    dag = dag.copy()
    for vs in units:
        inside = set(vs)
        outside = {p for v in vs for p in dag.predecessors(v)} - inside
        dag.add_edges_from((p, v) for p in outside for v in vs)
    return dag


def partition(graph: Graph, on_npu: Callable[[int], object],
              unit: Callable[[int], object] | None = None) -> list[Step]:
    """Steps in execution order. `on_npu(i)` says whether graph.ops[i] may run on
    the NPU: False/None for the CPU, else True or the op's NPU kind (its dtype in a
    mixed-precision program); a segment holds NPU ops of one kind. `unit(i)`, when
    given, names the group graph.ops[i] runs in (None: none): a group's ops land in
    one segment."""
    dag = graph.dependency_graph()
    if unit is not None:
        dag = _as_units(dag, unit)
    level = _levels(dag, on_npu)
    by_level: dict[tuple, set[int]] = {}
    for v in dag:
        if on_npu(v):
            by_level.setdefault((level[v], str(on_npu(v))), set()).add(v)
    groups = _convex_merge(dag, [by_level[k] for k in sorted(by_level)], on_npu)

    q, owner = _quotient(dag, groups)
    first = {node: min(v for v in dag if owner[v] == node) for node in q}
    order = list(nx.lexicographical_topological_sort(q, key=lambda n: first[n]))

    steps = []
    for node in order:
        ops = sorted(groups[node[1]]) if node[0] == "seg" else [node[1]]
        steps.append(Step("npu" if node[0] == "seg" else "cpu", ops))
    _fill_edges(graph, steps)
    return steps


def _fill_edges(graph: Graph, steps: list[Step]) -> None:
    step_of: dict[str, int] = {}
    for s, step in enumerate(steps):
        for i in step.ops:
            for o in graph.ops[i].outputs:
                step_of[o] = s
    read_by: dict[str, set[int]] = {}
    for s, step in enumerate(steps):
        for i in step.ops:
            for name in graph.ops[i].present_inputs():
                read_by.setdefault(name, set()).add(s)
    for s, step in enumerate(steps):
        ins: dict[str, None] = {}
        outs: dict[str, None] = {}
        for i in step.ops:
            op = graph.ops[i]
            for name in op.present_inputs():
                if step_of.get(name) != s:
                    ins[name] = None
            for name in op.outputs:
                if name in graph.outputs or read_by.get(name, set()) - {s}:
                    outs[name] = None
        step.inputs, step.outputs = list(ins), list(outs)
