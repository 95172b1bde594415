"""Calibration for W8A8: run the model in float on a short built-in text and
record, for every Linear, the largest magnitude of each input channel.

The float run uses the runtime's own CPU kernels over the graph (fp32 weights),
so calibration sees exactly the activations the compiled model will quantize.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ir.graph import Graph
from ir.llm import LlmConfig
from runtime.llm.kernels import KERNELS
from runtime.llm.kvcache import KVCache
from runtime.llm.tokenizer import LlmTokenizer
from runtime.llm.weights import Weight

CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")


def activation_ranges(graph: Graph, cfg: LlmConfig, weights: dict[str, np.ndarray],
                      tokenizer: LlmTokenizer, chunk: int = 64) -> dict[str, np.ndarray]:
    """Linear weight name -> per-input-channel max |x| over the calibration text."""
    ids = tokenizer.encode(CALIBRATION_TEXT.read_text())
    dense = {name: Weight(w) for name, w in weights.items()}
    windows = [cfg.swa_window if cfg.is_swa(i) else 0 for i in range(cfg.n_layer)]
    state = SimpleNamespace(cache=KVCache(cfg.n_layer, windows, len(ids) + 1), model=None)
    ops = graph.topological_ops()
    ranges: dict[str, np.ndarray] = {}
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        values = {"tokens": np.asarray(part, np.int32),
                  "positions": np.arange(start, start + len(part), dtype=np.int32)}
        for op in ops:
            ins = [dense[i] if i in dense else values[i] for i in op.inputs if i]
            if op.type == "Linear":
                amax = np.abs(values[op.inputs[0]]).max(axis=0)
                w = op.inputs[1]
                ranges[w] = amax if w not in ranges else np.maximum(ranges[w], amax)
            for name, v in zip(op.outputs, KERNELS[op.type](ins, op.attrs, state)):
                values[name] = v
    return ranges
