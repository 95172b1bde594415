"""Choices an int8 compile measures on the calibration text rather than
assumes: the SmoothQuant alpha of each product group (the one of ALPHA_GRID
with the least output noise) and, for the hybrid, which groups stay fp16
(the noisiest share)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rkc.compiler.llm.build_report import CompileReport
from rkc.compiler.llm.calibrate import Calibration, product_errors
from rkc.compiler.llm.program_builder import EncodedWeight
from rkc.compiler.llm.quantize import quantize_matrix
from rkc.compiler.llm.smooth import smooth
from rkc.ir.graph import Graph
from rkc.runtime.llm.tokenizer import LlmTokenizer
from rkc.runtime.llm.weights import Int8Weight

if TYPE_CHECKING:
    from rkc.compiler.llm.build import LlmCompileOptions


ALPHA_GRID = (0.0, 0.3, 0.5, 0.7, 0.85)


def search_alphas(graph: Graph, cfg, tokenizer: LlmTokenizer, weights: dict[str, np.ndarray], cal: Calibration,
                  options: LlmCompileOptions, products: set[str], head: str) -> dict[str, float]:
    """Per group of products reading one input, the alpha of ALPHA_GRID whose
    smoothed, round-to-nearest int8 products have the least output noise on the
    calibration text (smoothing is exact in float, so every group is measured
    on the same float activations, all groups in one pass per alpha).
    `products`: the int8 products' weight names; `head`: the output head's, left out."""
    text = Path(options.calibration).read_text()
    best: dict[str, tuple[float, float]] = {}
    for a in ALPHA_GRID:
        trial = dict(weights)  # smooth() replaces arrays, never writes into them
        factors = smooth(graph, trial, cal.ranges, a) if a > 0 else {}
        int8 = {n: Int8Weight(*quantize_matrix(trial[n])) for n in products if n != head}
        errors = product_errors(graph, cfg, trial, int8, tokenizer, text)
        for group, e in errors.items():
            if group not in best or e < best[group][1]:
                best[group] = (a, e)
        del trial, factors, int8
    return {g: a for g, (a, _) in best.items()}


def alpha_histogram(alpha: dict[str, float]) -> str:
    counts = {a: sum(1 for v in alpha.values() if v == a) for a in ALPHA_GRID}
    return ", ".join(f"{a}: {c} groups" for a, c in counts.items() if c)


def keep_noisiest_fp16(graph: Graph, cfg, tokenizer: LlmTokenizer, weights: dict[str, np.ndarray],
                       matrices: dict[str, EncodedWeight], options: LlmCompileOptions, report: CompileReport,
                       head: str) -> None:
    """The measured hybrid: re-encode as fp16 the options.fp16_share of product
    groups whose int8 output error is largest on the calibration text (`head`:
    the output head's weight name, left out)."""
    int8 = {n: e.as_runtime() for n, e in matrices.items() if e.scale is not None and n != head}
    errors = product_errors(graph, cfg, weights, int8, tokenizer, Path(options.calibration).read_text())
    chosen = sorted(errors, key=errors.get, reverse=True)[:round(options.fp16_share * len(errors))]
    names = {}
    for op in graph.ops:
        if op.type == "Linear" and op.inputs[0] in chosen and op.inputs[1] in int8:
            names.setdefault(op.inputs[0], []).append(op.inputs[1])
    extra = 0
    for group in chosen:
        for n in names.get(group, []):
            matrices[n] = EncodedWeight(weights[n].astype(np.float16))
            extra += matrices[n].data.nbytes // 2  # fp16 is twice int8's bytes
    kept = [n for g in chosen for n in names.get(g, [])]
    noisiest = ", ".join(f"{_short(names[g])} {errors[g]:.1e}" for g in chosen)
    report.say(f"int8: hybrid: {len(chosen)} of {len(errors)} product groups kept fp16 (largest int8 output "
               f"noise/signal on the calibration text: {noisiest}); +{extra / 1e6:.1f} MB of weights")
    report.quantization["hybrid"] = {"products": kept, "noise_to_signal": {g: errors[g] for g in chosen},
                                     "extra_weight_bytes": extra}


def _short(names: list[str]) -> str:
    """blk.3.attn_q.weight + blk.3.attn_k.weight -> blk.3.attn_q+k (for the summary)."""
    parts = [n.removesuffix(".weight") for n in names]
    head, _, first = parts[0].rpartition(".")
    return head + "." + "+".join([first] + [p.rpartition(".")[2].rpartition("_")[2] for p in parts[1:]])


