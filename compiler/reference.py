"""Run an ir.Graph directly with the runtime's numpy kernels: the calibration
pass uses it to observe activation ranges, tests use it as a second opinion."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from rkc.ir.graph import Graph
from rkc.runtime.kernels import run_kernel


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray], observe=None) -> dict[str, np.ndarray]:
    """Evaluate the graph; `observe(name, value)` sees every tensor produced.
    Returns the graph outputs."""
    env: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        env[name] = np.asarray(feeds[name], dtype=graph.tensors[name].dtype.numpy)
    for name, t in graph.tensors.items():
        if t.kind == "const":
            env[name] = graph.payloads[t.payload]
    for op in graph.ops:
        outs = run_kernel(op.type, [env[i] if i else None for i in op.inputs], op.attrs,
                          len(op.outputs))
        for name, value in zip(op.outputs, outs):
            env[name] = value
            if observe is not None:
                observe(name, value)
    return {name: env[name] for name in graph.outputs}
