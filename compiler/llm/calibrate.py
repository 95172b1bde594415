"""Calibration for W8A8: run the model in float on a built-in text and record,
for every Linear, what its input looked like:

* the largest magnitude of each input channel (SmoothQuant's ranges), and
* the input's second moment X^T X (the Hessian of the product's squared
  output error with respect to its weights; GPTQ rounding uses it).

The float run uses the runtime's own CPU kernels over the graph (fp32 weights),
so calibration sees exactly the activations the compiled model will quantize.
The output head's product itself is skipped (only its input is recorded): it
is the largest matrix and nothing downstream of it needs calibrating.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np

from rkc.compiler.llm.weights import runtime_weight
from rkc.ir.graph import Graph
from rkc.ir.llm import LlmConfig
from rkc.runtime.llm.kernels import KERNELS
from rkc.runtime.llm.kvcache import KVCache
from rkc.runtime.llm.tokenizer import LlmTokenizer

CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
# the text runs as independent sequences of WINDOW tokens (each after the first
# starts with BOS), at most MAX_TOKENS in all: prompt-like lengths, and a cost
# linear in the text
WINDOW = 256
MAX_TOKENS = 2048

# observe(op, inputs, chunk) runs before each op (chunk: a number distinct per forward
# pass of a calibration run); returning False skips the op
Observer = Callable[[object, list, int], "bool | None"]


@dataclass
class Calibration:
    """Per Linear weight name: max |x| per input channel, and the input's X^T X
    (float64; one array shared by the products that read the same input)."""

    ranges: dict[str, np.ndarray] = field(default_factory=dict)
    hessians: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: int = 0


class GraphRunner:
    """The frontend graph on the runtime's CPU kernels, one sequence at a time
    (the KV cache carries across calls): what calibration runs in float, and
    what tools/llm_quant_eval.py runs with the compiled weights' arithmetic.
    `weights` maps constant names to runtime weights (Weight, Int8Weight, ...)."""

    def __init__(self, graph: Graph, cfg: LlmConfig, weights: dict, n_ctx: int) -> None:
        self.graph, self.cfg, self.weights = graph, cfg, weights
        self.ops = graph.topological_ops()
        self.state = SimpleNamespace(cache=KVCache(cfg.n_layer, cfg.cache_windows(), n_ctx), model=None)

    def reset(self) -> None:
        self.state.cache.reset()

    def forward(self, ids: list[int], start: int, observe: Observer | None = None) -> dict[str, np.ndarray]:
        """Every value of one step over `ids` at positions start.."""
        weights = self.weights
        values = {"tokens": np.asarray(ids, np.int32),
                  "positions": np.arange(start, start + len(ids), dtype=np.int32)}
        for op in self.ops:
            if any(i and i not in weights and i not in values for i in op.inputs):
                continue  # downstream of an op the observer skipped
            ins = [weights[i] if i in weights else values[i] for i in op.inputs if i]
            if observe is not None and observe(op, ins, start) is False:
                continue
            for name, v in zip(op.outputs, KERNELS[op.type](ins, op.attrs, self.state)):
                values[name] = v
        return values

    def logits(self, ids: list[int], start: int) -> np.ndarray:
        return self.forward(ids, start)[self.graph.outputs[0]]


def calibrate(graph: Graph, cfg: LlmConfig, weights: dict[str, np.ndarray], tokenizer: LlmTokenizer,
              hessians: bool = True, chunk: int = 64, text: str | None = None) -> Calibration:
    """Ranges (and X^T X) of every Linear's input over the calibration text."""
    windows = calibration_windows(tokenizer, text if text is not None else CALIBRATION_TEXT.read_text())
    dense = {name: runtime_weight(w) for name, w in weights.items()}
    cal = Calibration(tokens=sum(len(w) for w in windows))
    summed: dict[str, int] = {}  # input tensor -> last chunk added (q/k/v read one input)
    by_input: dict[str, np.ndarray] = {}

    def observe(op, ins, chunk_no) -> bool:
        if op.type != "Linear":
            return True
        x, w = np.asarray(ins[0], np.float32), op.inputs[1]
        amax = np.abs(x).max(axis=0)
        cal.ranges[w] = amax if w not in cal.ranges else np.maximum(cal.ranges[w], amax)
        if hessians:
            key = op.inputs[0]
            if summed.get(key) != chunk_no:
                x64 = x.astype(np.float64)
                if key not in by_input:
                    by_input[key] = np.zeros((x.shape[1], x.shape[1]))
                by_input[key] += x64.T @ x64
                summed[key] = chunk_no
            cal.hessians[w] = by_input[key]
        return op.outputs[0] != "logits"

    _run_windows(GraphRunner(graph, cfg, dense, WINDOW + 1), windows, chunk, observe)
    return cal


def calibration_windows(tokenizer: LlmTokenizer, text: str) -> list[list[int]]:
    ids = tokenizer.encode(text)[:MAX_TOKENS]
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return [ids[:WINDOW]] + [bos + ids[s:s + WINDOW - len(bos)]
                             for s in range(WINDOW, len(ids), WINDOW - len(bos))]


def _run_windows(runner: GraphRunner, windows: list[list[int]], chunk: int, observe: Observer) -> None:
    """Each window from an empty KV cache, in chunks (the chunk number is the
    observer's key, so positions restart per window but chunks stay distinct)."""
    n = 0
    for ids in windows:
        runner.reset()
        for start in range(0, len(ids), chunk):
            runner.forward(ids[start:start + chunk], start, lambda op, ins, _s, k=n: observe(op, ins, k))
            n += 1



def product_errors(graph: Graph, cfg: LlmConfig, weights: dict[str, np.ndarray], compiled: dict,
                   tokenizer: LlmTokenizer, text: str, chunk: int = 64) -> dict[str, float]:
    """Sensitivity of each group of products that read one input (one NPU
    segment: q+k+v, gate+up, attn_output, ffn_down) to its compiled arithmetic:
    on the calibration text, run the float model (`weights`, fp32, as smoothed)
    and at each product compare its output with the compiled one (`compiled`:
    weight name -> runtime weight, e.g. Int8Weight) on the same input —
    the noise-to-signal ratio sum |y_c - y|^2 / sum |y|^2 of the group, keyed
    by its input tensor. The output head is not measured (kept as compiled)."""
    windows = calibration_windows(tokenizer, text)
    dense = {name: runtime_weight(w) for name, w in weights.items()}
    noise: dict[str, float] = {}
    signal: dict[str, float] = {}

    def observe(op, ins, start) -> bool:
        if op.type != "Linear":
            return True
        if op.outputs[0] == "logits":
            return False  # the head: not a candidate, and the largest product
        w = op.inputs[1]
        if w in compiled:
            x = np.asarray(ins[0], np.float32)
            y = x @ dense[w].dense().T
            err = compiled[w].matmul(x) - y
            key = op.inputs[0]
            noise[key] = noise.get(key, 0.0) + float(np.sum(err.astype(np.float64) ** 2))
            signal[key] = signal.get(key, 0.0) + float(np.sum(y.astype(np.float64) ** 2))
        return True

    _run_windows(GraphRunner(graph, cfg, dense, WINDOW + 1), windows, chunk, observe)
    return {k: noise[k] / max(signal[k], 1e-30) for k in noise}
