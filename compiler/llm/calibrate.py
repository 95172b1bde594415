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
from typing import Callable, Collection, Mapping

import numpy as np

from rkc.compiler.llm.step_clock import STEPS
from rkc.compiler.llm.weights import layer_of, runtime_weight
from rkc.ir.graph import Graph
from rkc.ir.llm import LlmConfig
from rkc.runtime.llm.kernels import KERNELS
from rkc.runtime.llm.kvcache import KVCache
from rkc.runtime.llm.tokenizer import LlmTokenizer
from rkc.runtime.llm.weights import Weight

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
        return self.run_ops(self.ops, {}, ids, start, observe)

    def run_ops(self, ops: list, values: dict[str, np.ndarray], ids: list[int], start: int,
                observe: Observer | None = None) -> dict[str, np.ndarray]:
        """`ops` (in order) of one step over `ids` at positions start.., given
        the `values` earlier ops computed; returns every value."""
        weights = self.weights
        values = {**values, "tokens": np.asarray(ids, np.int32),
                  "positions": np.arange(start, start + len(ids), dtype=np.int32)}
        for op in ops:
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


def calibrate(graph: Graph, cfg: LlmConfig, weights: Mapping[str, np.ndarray], tokenizer: LlmTokenizer,
              hessians: bool | Collection[str] = True, chunk: int = 64, text: str | None = None,
              max_tokens: int = MAX_TOKENS) -> Calibration:
    """Ranges of every Linear's input over the calibration text, and X^T X of
    every Linear's input (hessians True) or of the Linears named in `hessians`.
    The model runs one layer at a time over the whole text (layer_stages), so
    only one layer's weights are held in fp32; `weights` may be lazy (read
    per layer), and a Gather table that can give rows (`weights.rows`) gives
    only the rows the text uses."""
    windows = calibration_windows(tokenizer, text if text is not None else CALIBRATION_TEXT.read_text(), max_tokens)
    cal = Calibration(tokens=sum(len(w) for w in windows))
    summed: dict[str, int] = {}  # input tensor -> last chunk added (q/k/v read one input)
    by_input: dict[str, np.ndarray] = {}

    def observe(op, ins, chunk_no) -> bool:
        if op.type != "Linear":
            return True
        x, w = np.asarray(ins[0], np.float32), op.inputs[1]
        amax = np.abs(x).max(axis=0)
        cal.ranges[w] = amax if w not in cal.ranges else np.maximum(cal.ranges[w], amax)
        if hessians is True or (hessians and w in hessians):
            key = op.inputs[0]
            if summed.get(key) != chunk_no:
                x64 = x.astype(np.float64)
                if key not in by_input:
                    by_input[key] = np.zeros((x.shape[1], x.shape[1]))
                by_input[key] += x64.T @ x64
                summed[key] = chunk_no
            cal.hessians[w] = by_input[key]
        return op.outputs[0] != "logits"

    _run_by_layer(graph, cfg, weights, windows, chunk, observe)
    return cal


def layer_stages(graph: Graph) -> list[list]:
    """The graph's ops in topological order, cut into stages: an op's stage is
    the largest layer (blk.N) among its constants and its inputs' stages, so a
    stage reads only earlier stages' values and its own layer's weights."""
    stage_of: dict[str, int] = {}
    stages: dict[int, list] = {}
    for op in graph.topological_ops():
        s = -1
        for name in op.inputs:
            t = graph.tensors.get(name) if name else None
            if t is None:
                continue
            s = max(s, layer_of(name) if t.kind == "const" else stage_of.get(name, -1))
        stages.setdefault(s, []).append(op)
        for name in op.outputs:
            stage_of[name] = s
    return [stages[k] for k in sorted(stages)]


class _LazyConst:
    """A constant as the CPU kernels read it (runtime Weight), built on first
    use: an op the observer skips (the output head) never reads its weights,
    and a Gather reads only its rows when `weights` can give rows (weights.rows)."""

    def __init__(self, weights: Mapping[str, np.ndarray], name: str) -> None:
        self._weights, self._name, self._dense = weights, name, None

    def rows(self, ids: np.ndarray) -> np.ndarray:
        if self._dense is None and hasattr(self._weights, "rows"):
            with STEPS.step("calibration read"):
                return self._weights.rows(self._name, ids)
        return self._weight().rows(ids)

    def _weight(self) -> Weight:
        if self._dense is None:
            with STEPS.step("calibration read"):
                self._dense = runtime_weight(self._weights[self._name])
        return self._dense

    def __getattr__(self, attr: str):
        return getattr(self._weight(), attr)


def _run_by_layer(graph: Graph, cfg: LlmConfig, weights: Mapping[str, np.ndarray], windows: list[list[int]],
                  chunk: int, observe: Observer) -> None:
    """What _run_windows computes, stage by stage (layer_stages): every chunk
    of every window through one stage, then the next; each op sees the very
    inputs it sees in a whole-model run (same chunks, same KV cache history),
    and the values a later stage reads are carried per chunk. So is a KV cache
    a later stage attends over (gemma4's shared KV): the view the source
    layer's store left at each chunk (KVCache.shared), copied in its memory
    order, is given back to the cache before the reading stage runs that chunk."""
    stages = layer_stages(graph)
    last_use: dict[str, int] = {}
    for s, ops in enumerate(stages):
        for op in ops:
            for name in op.inputs:
                if name:
                    last_use[name] = s
    stage_of_layer = {int(op.attrs["layer"]): s for s, ops in enumerate(stages) for op in ops
                      if op.type == "Attention"}
    read_later = {int(op.attrs["source"]) for s, ops in enumerate(stages) for op in ops
                  if op.type == "AttentionShared" and stage_of_layer[int(op.attrs["source"])] < s}
    chunks = [(w, start, ids[start:start + chunk]) for w, ids in enumerate(windows)
              for start in range(0, len(ids), chunk)]
    carried: list[dict[str, np.ndarray]] = [{} for _ in chunks]
    shared_views: list[dict[int, tuple]] = [{} for _ in chunks]
    runner = GraphRunner(graph, cfg, {}, WINDOW + 1)
    for s, ops in enumerate(stages):
        consts = [n for op in ops for n in op.inputs if n and graph.tensors[n].kind == "const"]
        runner.weights = {n: _LazyConst(weights, n) for n in dict.fromkeys(consts)}
        stores = [layer for layer, st in stage_of_layer.items() if st == s and layer in read_later]
        window = None
        for n, (w, start, ids) in enumerate(chunks):
            if w != window:
                runner.reset()
                window = w
            for layer, view in shared_views[n].items():
                runner.state.cache.share(layer, view)
            values = runner.run_ops(ops, carried[n], ids, start, lambda op, ins, _s, k=n: observe(op, ins, k))
            carried[n] = {k: v for k, v in values.items() if last_use.get(k, -1) > s}
            for layer in stores:
                shared_views[n][layer] = tuple(np.array(a, order="K") for a in runner.state.cache.shared(layer))
        runner.weights = {}


def calibration_windows(tokenizer: LlmTokenizer, text: str, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    ids = tokenizer.encode(text)[:max_tokens]
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
