"""What preparing an LLM's integer weights will cost, estimated from the
graph's shapes before any of it starts, and the cheaper choices a compile
makes when the estimate is over budget (one report line says so).

* Calibration runs the float model over the calibration text: its CPU time is
  tokens x the products' multiply-adds. A 7B model over the built-in text's
  ~1600 tokens is ~15 CPU minutes here, so large models calibrate on fewer
  tokens (whole windows, at least one).
* GPTQ holds every product input's X^T X (float64, K^2 each; the products
  that read one input share one) from calibration until its layer is
  rounded, and its rounding costs ~N K^2 per product: Qwen2.5-7B's ffn_down
  inputs (K = 18944) are 2.9 GB each. A compile that was not told how to round
  takes the first scheme of ROUNDING_FALLBACK whose estimate fits.

Rates measured on the project's shared build host (x86-64, one BLAS thread,
CPU time per step from the compile's report, compiler/llm/step_clock.py;
docs/notes/2026-12-06-int4-7b-compile.md): a 2-layer cut of the Qwen2.5-7B shape
(hidden-gptq, 2056 tokens, --jobs 2, load average ~18) calibrated at 0.037 CPU ns
per token and product multiply-add (the hidden inputs' X^T X and reading the
weights included; Gemma 3 270M had given 0.076 on 514 tokens) and GPTQ-rounded at
0.0155 ns per N K^2 (the factor included; the head's 152064 rows in blocks of 4681:
larger products than the 0.03-0.09 measured before on 512-row blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from rkc.compiler.llm.quantize import method_for
from rkc.ir.graph import Graph

CALIBRATION_NS_PER_MAC = 0.04  # CPU ns per calibration token and product multiply-add (measured 0.037)
GPTQ_NS_PER_NK2 = 0.02  # CPU ns per N K^2 of GPTQ rounding (measured 0.0155)
CALIBRATION_BUDGET_S = 300.0  # CPU seconds calibration may take before it runs on fewer tokens
GPTQ_BUDGET_S = 600.0  # CPU seconds of GPTQ rounding a default compile allows
HESSIAN_BUDGET_BYTES = 2 << 30  # X^T X held at once (float64)
# a compile not told how to round drops to the next scheme until the estimate fits
ROUNDING_FALLBACK = ("gptq", "hidden-gptq", "head-gptq", "rtn")


@dataclass(frozen=True)
class GptqCost:
    hessian_bytes: int  # every X^T X GPTQ needs, held together
    seconds: float  # estimated CPU seconds of rounding

    def fits(self) -> bool:
        return self.hessian_bytes <= HESSIAN_BUDGET_BYTES and self.seconds <= GPTQ_BUDGET_S

    def describe(self) -> str:
        return f"{self.hessian_bytes / 2**30:.1f} GiB of X^T X, ~{self.seconds / 60:.0f} CPU min"


def _products(graph: Graph) -> list[tuple[str, str, int, int]]:
    """(weight name, input tensor, N, K) of every matrix product, the head included."""
    seen, out = set(), []
    for op in graph.ops:
        if op.type == "Linear" and op.inputs[1] not in seen:
            seen.add(op.inputs[1])
            n, k = graph.tensors[op.inputs[1]].type.shape
            out.append((op.inputs[1], op.inputs[0], int(n), int(k)))
    return out


def _head(graph: Graph) -> str:
    return next(op.inputs[1] for op in graph.ops if op.type == "Linear" and op.outputs[0] == "logits")


def gptq_cost(graph: Graph, rounding: str) -> GptqCost:
    """What scheme `rounding` costs GPTQ on this graph (nothing for rtn)."""
    head = _head(graph)
    inputs: dict[str, int] = {}
    ops = 0
    for name, x, n, k in _products(graph):
        if method_for(rounding, name, name == head) == "gptq":
            inputs[x] = k
            ops += n * k * k
    return GptqCost(sum(8 * k * k for k in inputs.values()), ops * GPTQ_NS_PER_NK2 * 1e-9)


def affordable_rounding(graph: Graph, rounding: str) -> tuple[str, GptqCost]:
    """`rounding`, or the first cheaper scheme of ROUNDING_FALLBACK whose GPTQ fits the budget."""
    start = ROUNDING_FALLBACK.index(rounding) if rounding in ROUNDING_FALLBACK else len(ROUNDING_FALLBACK) - 1
    for scheme in ROUNDING_FALLBACK[start:]:
        cost = gptq_cost(graph, scheme)
        if cost.fits():
            return scheme, cost
    return "rtn", gptq_cost(graph, "rtn")


def calibration_tokens(graph: Graph, tokens: int, window: int) -> int:
    """At most `tokens`, in whole windows (at least one), within CALIBRATION_BUDGET_S."""
    macs = sum(n * k for _, _, n, k in _products(graph))
    # (+ 1e-9: a budget of exactly n tokens' work is n tokens, not n - 1 by float rounding)
    affordable = int(CALIBRATION_BUDGET_S / (macs * CALIBRATION_NS_PER_MAC * 1e-9) + 1e-9)
    return min(tokens, max(window, affordable // window * window))
