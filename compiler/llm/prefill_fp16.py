"""An int8 build's prefill products in fp16 (issue 37): decode keeps the int8
weights, the multi-row programs (prefill_C, score_C) read an fp16 copy of the
FFN's gate, up and down (`ffn`) or of every product but the output head
(`all`: q, k, v and the attention output too), so their FFN is the one NPU
segment fp16 builds have (compiler/llm/ffn_fusion.py) instead of a host
stretch between two int8 segments, and (all) their other edges are fp16 casts
instead of rotations, per-token codes and row scales.

Why: the int8 FFN's host stretch (in edges, activation x up, the down input's
rotation and per-token codes) costs ~1.8 ms a layer of a 128-row chunk of
Gemma 3 270M, more than the rest of a layer's host work; the other int8 edges
(the residual stretches' rotated codes, the attention output's QuantizeRows)
most of the rest of what int8's prompt costs over fp16's. One token of decode
quantizes one row and reads the weights once, where int8's half bytes pay.
The copy is what it costs: 2 bytes a copied weight in the rkbin and in memory,
and those GEMMs at fp16's pace on the NPU (docs/llm.md, "The prefill products
of an int8 build"). The output head stays int8 (prefill reads one row of it;
its fp16 copy would be the largest of all).

The copy is encoded from the same smoothed weights as the int8 ones
(SmoothQuant folds its factors into the norms and producing rows, which both
paths read), unrotated (fp16 products take unrotated inputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from rkc.compiler.llm.ffn_fusion import gated_ffns
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph
from rkc.runtime.llm.weights import ByRows

if TYPE_CHECKING:
    from rkc.compiler.llm.program_builder import EncodedWeight

PREFILL_FP16_CHOICES = ("auto", "all", "ffn", "none")
DEFAULT_PREFILL_FP16 = "auto"
# auto copies all, else the FFN, whichever first adds at most this many bytes (docs/llm.md:
# Gemma 3 270M's all is 200 MB; Qwen2.5-0.5B's FFN alone would add 627 MB, Gemma 3 1B's 1.24 GB)
AUTO_MAX_COPY_BYTES = 256 << 20
SUFFIX = ".prefill_fp16"


def copy_name(weight: str) -> str:
    """The constant the multi-row programs read for weight `weight`."""
    stem = weight.removesuffix(".weight")
    return f"{stem}{SUFFIX}.weight" if weight.endswith(".weight") else stem + SUFFIX


def ffn_weights(graph: Graph) -> list[str]:
    """The weights of `graph`'s gated FFNs (gate, up, down), in graph order."""
    return [graph.ops[i].inputs[1] for f in gated_ffns(graph, lambda w: True) for i in (f.gate, f.up, f.down)]


def copy_bytes(graph: Graph, names: list[str] | None = None) -> int:
    """Bytes the fp16 copy of weights `names` (None: every FFN weight) takes."""
    return sum(2 * int(graph.tensors[w].type.numel) for w in (ffn_weights(graph) if names is None else names))


def body_weights(graph: Graph) -> list[str]:
    """Every product's weight but the output head's, in graph order (each once)."""
    head = next(op.inputs[1] for op in graph.ops if op.type == "Linear" and op.outputs[0] == "logits")
    return list(dict.fromkeys(op.inputs[1] for op in graph.ops if op.type == "Linear" and op.inputs[1] != head))


def copied_kind(graph: Graph, precision: str, choice: str, keep_fp16: tuple[str, ...] = ()) -> str:
    """Which weights an fp16 copy is made of for the multi-row programs: none
    but for int8 builds; `choice` all (every product's but the head's), ffn
    (the FFNs'), none, or auto: all, else ffn, the first whose copy adds at
    most AUTO_MAX_COPY_BYTES, else none."""
    if choice not in PREFILL_FP16_CHOICES:
        raise UnsupportedError(f"prefill fp16 {choice!r} is not known (choose {', '.join(PREFILL_FP16_CHOICES)})")
    if precision != "int8":
        return "none"
    if choice != "auto":
        return choice
    return next((kind for kind in ("all", "ffn")
                 if copy_bytes(graph, _weights_of(graph, kind, keep_fp16)) <= AUTO_MAX_COPY_BYTES), "none")


def copied_weights(graph: Graph, precision: str, choice: str, keep_fp16: tuple[str, ...] = ()) -> list[str]:
    """The weights of copied_kind's choice (those already fp16, --keep-fp16, need none)."""
    return _weights_of(graph, copied_kind(graph, precision, choice, keep_fp16), keep_fp16)


def _weights_of(graph: Graph, kind: str, keep_fp16: tuple[str, ...]) -> list[str]:
    names = body_weights(graph) if kind == "all" else ffn_weights(graph) if kind == "ffn" else []
    return [w for w in names if not any(k in w for k in keep_fp16)]


def with_copies(graph: Graph, copies: list[str]) -> Graph:
    """`graph` (one multi-row program's) with its products of `copies` reading
    their fp16 copies (constants of the same shape, added): the graph is edited
    in place and returned."""
    wanted = set(copies)
    for op in graph.ops:
        if op.type == "Linear" and op.inputs[1] in wanted:
            name = copy_name(op.inputs[1])
            if name not in graph.tensors:
                graph.add_const(name, graph.tensors[op.inputs[1]].type)
            op.inputs[1] = name
    return graph


def emulated(matrices: Mapping[str, "EncodedWeight"]) -> dict:
    """The encoded matrices as the runtime's CPU arithmetic computes them (the
    CPU emulation of the programs): a weight with an fp16 copy reads it for
    inputs of more than one row, as the multi-row programs do."""
    out = {n: e.as_runtime() for n, e in matrices.items() if not n.removesuffix(".weight").endswith(SUFFIX)}
    for n in out:
        if copy_name(n) in matrices:
            out[n] = ByRows(out[n], matrices[copy_name(n)].as_runtime())
    return out


def prefill_fp16_line(entry: Mapping) -> str:
    """The compile summary's and rkc inspect's line for metadata["quantization"]["prefill_fp16"]."""
    what = {"all": "every product but the head", "ffn": "the FFN products"}.get(entry["products"])
    if what is None:
        return f"prefill products int8, as decode's (--prefill-fp16 {entry['choice']})"
    return (f"prefill: {what} fp16 (--prefill-fp16 {entry['choice']}): an fp16 copy of {entry['copies']} weights "
            f"that only the multi-row programs read, +{entry['extra_weight_bytes'] / 1e6:.1f} MB; decode reads "
            f"the int8 ones")
