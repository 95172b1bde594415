"""An int8 build's prefill FFN in fp16 (issue 37): decode keeps the int8 FFN
weights, the multi-row programs (prefill_C, score_C) read an fp16 copy of
gate, up and down, so their FFN is the one NPU segment fp16 builds have
(compiler/llm/ffn_fusion.py) instead of a host stretch between two int8
segments.

Why: the int8 FFN's host stretch (in edges, activation x up, the down input's
rotation and per-token codes) costs ~1.8 ms a layer of a 128-row chunk of
Gemma 3 270M, more than the rest of a layer's host work; one token of decode
quantizes one row and reads the weights once, where int8's half bytes pay.
The copy is what it costs: 2 bytes a FFN weight in the rkbin and in memory,
and the prefill's FFN GEMMs at fp16's pace on the NPU (docs/llm.md,
"The prefill FFN of an int8 build").

The copy is encoded from the same smoothed weights as the int8 FFN (SmoothQuant
folds its factors into the FFN norm and the up rows, which both paths read),
unrotated (fp16 products take unrotated inputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from rkc.compiler.llm.ffn_fusion import gated_ffns
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph
from rkc.runtime.llm.weights import ByRows

if TYPE_CHECKING:
    from rkc.compiler.llm.program_builder import EncodedWeight

PREFILL_FFN_CHOICES = ("auto", "fp16", "int8")
DEFAULT_PREFILL_FFN = "auto"
# auto makes the copy when it adds at most this many bytes (docs/llm.md: Gemma 3 270M's
# is 142 MB; the next supported size, Qwen2.5-0.5B, would add 627 MB, Gemma 3 1B 1.24 GB)
AUTO_MAX_COPY_BYTES = 256 << 20
SUFFIX = ".prefill_fp16"


def copy_name(weight: str) -> str:
    """The constant the multi-row programs read for FFN weight `weight`."""
    stem = weight.removesuffix(".weight")
    return f"{stem}{SUFFIX}.weight" if weight.endswith(".weight") else stem + SUFFIX


def ffn_weights(graph: Graph) -> list[str]:
    """The weights of `graph`'s gated FFNs (gate, up, down), in graph order."""
    return [graph.ops[i].inputs[1] for f in gated_ffns(graph, lambda w: True) for i in (f.gate, f.up, f.down)]


def copy_bytes(graph: Graph, names: list[str] | None = None) -> int:
    """Bytes the fp16 copy of FFN weights `names` (None: every one) takes."""
    return sum(2 * int(graph.tensors[w].type.numel) for w in (ffn_weights(graph) if names is None else names))


def copied_weights(graph: Graph, precision: str, choice: str, keep_fp16: tuple[str, ...] = ()) -> list[str]:
    """The FFN weights an fp16 copy is made of for the prefill programs: none
    but for int8 builds; `choice` fp16 all of them, auto all of them while the
    copy adds at most AUTO_MAX_COPY_BYTES, int8 none. Weights already fp16
    (--keep-fp16) need none."""
    if choice not in PREFILL_FFN_CHOICES:
        raise UnsupportedError(f"prefill FFN {choice!r} is not known (choose {', '.join(PREFILL_FFN_CHOICES)})")
    if precision != "int8" or choice == "int8":
        return []
    names = [w for w in ffn_weights(graph) if not any(k in w for k in keep_fp16)]
    if choice == "auto" and copy_bytes(graph, names) > AUTO_MAX_COPY_BYTES:
        return []
    return names


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
