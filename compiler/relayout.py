"""Data movement between NPU buffers composed into one gather per result.

Ops that only move elements (Reshape, Split, Transpose, Concat, ...) left on the
CPU between NPU groups cost a conversion out of each fp16 source, a numpy pass per
op and a conversion into each result's layout (YOLO11n's attention: the qkv
convolution's map cut into per-head Q^T, K and V operands, the heads' products
put back into one map). Where every reader of such a chain is an fp16 NPU group,
the chain is one index map, found at compile time by running the ops' own
kernels on element numbers: result element j is source element index[j] (of the
sources' logical elements, one after the other), times a scalar where the chain
ends in a Mul by a constant. The runtime gathers with it ("Relayout": the
interpreter on logical arrays, runtime/feature_edges.py between the native
layouts directly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.ir.graph import Graph, Op
from rkc.runtime.kernels import run_kernel

MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split", "Concat", "Identity"})


@dataclass
class Result:
    tensor: str
    sources: list[str]  # fp16 NPU tensors, in the order `index` numbers their elements
    index: np.ndarray  # int32 of the result's shape
    scale: float


def _scalar(graph: Graph, op: Op) -> tuple[str, float] | None:
    """(the run-time input, the factor) of a Mul by one constant value."""
    if op.type != "Mul" or len(op.inputs) != 2:
        return None
    consts = [graph.const_value(t) for t in op.inputs]
    if sum(c is not None for c in consts) != 1:
        return None
    value = next(c for c in consts if c is not None)
    if np.size(value) != 1 or not np.isfinite(value).all():
        return None
    return op.inputs[1 if consts[0] is not None else 0], float(np.reshape(value, -1)[0])


def _channel_piece(graph: Graph, op: Op) -> bool:
    """A Concat or Split along the channels of 4-D maps, each piece whole 16-byte atoms of fp16
    channels: what program_steps lowers as views (no step at all), which a gather would only cost."""
    if op.type not in ("Concat", "Split"):
        return False
    rank = len(graph.tensors[op.inputs[0]].type.shape)
    pieces = op.inputs if op.type == "Concat" else op.outputs
    return rank == 4 and int(op.attrs.get("axis", 0)) % rank == 1 \
        and all(graph.tensors[t].type.shape[1] % 8 == 0 for t in pieces if t)


def plan(graph: Graph, cpu_ops: list[int], roots: set[str], npu_reads) -> tuple[set[int], dict[int, list[Result]]]:
    """(the CPU ops the gathers replace, op index -> the results to gather there).

    `roots`: tensors NPU groups write in fp16; `npu_reads(op index, tensor)`: whether
    that op is in an fp16 NPU group reading `tensor`. An op is replaced when it only
    moves elements of roots (or a Mul by a scalar whose every reader is an NPU group)
    and each of its outputs is read only by replaced ops and NPU groups."""
    index_of = {id(op): i for i, op in enumerate(graph.ops)}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for t in op.inputs:
            if t:
                readers.setdefault(t, []).append(i)
    moved = set(roots)
    chosen: set[int] = set()
    for i in sorted(cpu_ops):
        op = graph.ops[i]
        data = [t for t in op.inputs if t and graph.const_value(t) is None]
        if not data or not all(t in moved for t in data):
            continue
        if (op.type in MOVES and not _channel_piece(graph, op)) or (_scalar(graph, op) is not None
                                and all(npu_reads(r, op.outputs[0]) for r in readers.get(op.outputs[0], []))):
            chosen.add(i)
            moved.update(op.outputs)
    while True:  # drop ops with an output something else must read on the host, or an input no gather makes
        made = set(roots).union(*(graph.ops[i].outputs for i in chosen))
        dropped = {i for i in chosen for t in graph.ops[i].outputs
                   if t in graph.outputs or not readers.get(t)
                   or any(r not in chosen and not npu_reads(r, t) for r in readers[t])}
        dropped |= {i for i in chosen for t in graph.ops[i].inputs
                    if t and graph.const_value(t) is None and t not in made}
        if not dropped:
            break
        chosen -= dropped
    ids: dict[str, np.ndarray] = {}
    spans: list[tuple[int, str]] = []  # (first global element number, root)
    results: dict[int, list[Result]] = {}
    for i in sorted(chosen):
        op = graph.ops[i]
        for t in op.inputs:
            if t in roots and t not in ids:  # every root's elements numbered after the last one's
                first = spans[-1][0] + ids[spans[-1][1]].size if spans else 0
                shape = graph.tensors[t].type.shape
                ids[t] = first + np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
                spans.append((first, t))
        scaled = _scalar(graph, op) if op.type == "Mul" else None
        if scaled is not None:
            outs = [ids[scaled[0]]]
        else:
            inputs = [None if not t else ids[t] if t in ids else graph.const_value(t) for t in op.inputs]
            outs = run_kernel(op.type, inputs, op.attrs, len(op.outputs))
        for t, v in zip(op.outputs, outs):
            ids[t] = np.asarray(v)
            if any(npu_reads(r, t) for r in readers.get(t, [])):
                results.setdefault(i, []).append(_result(t, ids[t], spans, ids, 1.0 if scaled is None else scaled[1]))
    return chosen, results


def one_op(graph: Graph, op: Op) -> list[Result]:
    """The gathers of one moving op's outputs from its run-time inputs (each an fp16 NPU
    tensor: the caller checks), e.g. a channel Concat whose pieces could not be views."""
    ids: dict[str, np.ndarray] = {}
    spans: list[tuple[int, str]] = []
    for t in op.inputs:
        if t and graph.const_value(t) is None and t not in ids:
            first = spans[-1][0] + ids[spans[-1][1]].size if spans else 0
            shape = graph.tensors[t].type.shape
            ids[t] = first + np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
            spans.append((first, t))
    inputs = [None if not t else ids[t] if t in ids else graph.const_value(t) for t in op.inputs]
    outs = run_kernel(op.type, inputs, op.attrs, len(op.outputs))
    return [_result(t, np.asarray(v), spans, ids, 1.0) for t, v in zip(op.outputs, outs)]


def _result(tensor: str, numbers: np.ndarray, spans, ids, scale: float) -> Result:
    """The gather of `tensor` from the roots its element numbers fall in, renumbered
    over those roots alone."""
    starts = np.array([first for first, _ in spans], np.int64)
    which = np.searchsorted(starts, numbers, side="right") - 1
    used = sorted(set(np.unique(which).tolist()))
    index = np.empty(numbers.shape, np.int64)
    base = 0
    for u in used:
        first, root = spans[u]
        mask = which == u
        index[mask] = numbers[mask] - first + base
        base += ids[root].size
    return Result(tensor, [spans[u][1] for u in used], index.astype(np.int32), scale)
