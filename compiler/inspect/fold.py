"""Repeated layers of a program, found from its value names, and the segment
graph with every layer of one structure folded into one drawn cluster.

A step belongs to layer N of block prefix P when the values it writes named
"<program>/P.N.<...>" (GGUF's "blk.N.", as the LLM compiler keeps it;
compiler/llm/program_builder.py) are all of layer N, and so does a step that
writes no layer's values between two steps of layer N. Two layers have the same structure when
their steps match one for one: kind, op, attributes (names with the layer's
own number blanked), which step of the layer feeds which, and per NPU segment
its ops, precision and tasks. Each distinct structure ("kind") is drawn once,
its first layer standing for all, with the count and the layers it stands for;
attributes that differ between kinds (sliding-window vs full attention, fp16
vs int8 products) are named on each cluster."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

import networkx as nx

from rkc.compiler.inspect.graph import (is_conversion, local_name, segment_precision, segment_products,
                                        step_graph, step_label)
from rkc.ir.program import Module, Program, Step

_BLOCK = re.compile(r"^([A-Za-z][A-Za-z_]*)\.(\d+)\.")
MIN_LAYERS = 2  # fewer repeats are no structure worth folding
# attributes that name the layer itself, not its structure: (op or None for any, attribute); "layer" is
# its KV-cache slot, Pick's "index" its slice of Gemma 4's per-layer inputs (runtime/llm/kernel_attrs.py)
IDENTITY_ATTRS = frozenset({(None, "layer"), ("Pick", "index")})


def _identity(step: Step, key: str) -> bool:
    return (None, key) in IDENTITY_ATTRS or (step.op, key) in IDENTITY_ATTRS

# the attributes that name what sets a kind of layer apart, and how each reads (key "": the op's presence)
def _window(v: int) -> str:
    return f"sliding-window attention (window {v})" if v else "full attention"


ATTR_WORDS = {
    ("Attention", "window"): _window,
    ("AttentionShared", "window"): _window,
    ("AttentionShared", ""): lambda op: "",  # its source says it
    ("AttentionShared", "source"): lambda v: f"KV cache of blk.{v}",
    ("RoPE", "base"): lambda v: f"RoPE base {v:g}",
}


@dataclass
class Layer:
    prefix: str  # "blk"
    index: int
    steps: list[int]  # indices into program.steps, one contiguous run

    @property
    def name(self) -> str:
        return f"{self.prefix}.{self.index}"


@dataclass
class LayerKind:
    layers: list[Layer]
    signature: tuple

    @property
    def first(self) -> Layer:
        return self.layers[0]


def _block_of(program: Program, step: Step) -> tuple[str, int] | None:
    """The one layer whose values the step writes (it may write others too: an
    NPU segment running a product of the embedding beside the layer's own)."""
    keys = set()
    for name in step.outputs:
        m = _BLOCK.match(local_name(program, name)) if name else None
        if m:
            keys.add((m.group(1), int(m.group(2))))
    return keys.pop() if len(keys) == 1 else None


def _absorb(keys: list) -> list:
    """Steps writing no layer's values between two steps of the same layer
    belong to that layer (Gemma 4: the per-layer embedding's steps run inside
    layer 0, after the segment its projection shares with layer 0's q/k/v)."""
    out = list(keys)
    last = None  # (index, key) of the last step with a layer
    for i, key in enumerate(keys):
        if key is None:
            continue
        if last and last[1] == key:
            for j in range(last[0] + 1, i):
                out[j] = key
        last = (i, key)
    return out


def find_layers(program: Program) -> list[Layer]:
    """The program's layers in step order, or [] where its steps are not a run
    of contiguous layers of one prefix (then nothing is folded)."""
    keys = _absorb([_block_of(program, s) for s in program.steps])
    prefixes = Counter(k[0] for k in keys if k)
    if not prefixes:
        return []
    prefix = prefixes.most_common(1)[0][0]
    layers: list[Layer] = []
    for i, key in enumerate(keys):
        if key is None or key[0] != prefix:
            continue
        if layers and layers[-1].index == key[1] and layers[-1].steps[-1] == i - 1:
            layers[-1].steps.append(i)
        elif any(layer.index == key[1] for layer in layers):
            return []  # a layer in two pieces
        else:
            layers.append(Layer(prefix, key[1], [i]))
    span = range(layers[0].steps[0], layers[-1].steps[-1] + 1)
    if len(layers) < MIN_LAYERS or sum(len(layer.steps) for layer in layers) != len(span):
        return []  # other steps between the layers
    return layers


def _blank(text: str, layer: Layer) -> str:
    return text.replace(f"{layer.name}.", f"{layer.prefix}.#.")


def _attrs(step: Step, layer: Layer) -> str:
    kept = {k: v for k, v in step.attrs.items() if not _identity(step, k)}
    return _blank(json.dumps(kept, sort_keys=True, default=str), layer)


def signature(program: Program, layer: Layer) -> tuple:
    """What two layers of the same structure share (see the module docstring)."""
    own: dict[str, tuple[int, int]] = {}
    items = []
    for pos, i in enumerate(layer.steps):
        s = program.steps[i]
        inputs = []
        for name in s.inputs:
            if name in own:
                inputs.append(own[name])
            elif name in program.inputs:
                inputs.append(("input", name))
            elif name.startswith(f"{program.name}/"):
                inputs.append(("before",))  # an earlier layer's value (or the embedding's)
            else:
                inputs.append(("const", _blank(name, layer)))
        for k, name in enumerate(s.outputs):
            own[name] = (pos, k)
        npu = ()
        if s.kind == "npu":
            npu = (s.stats.get("tasks"), len(s.jobs), s.chained,
                   tuple((entry["op"], entry.get("dtype"), entry.get("tasks"), entry.get("macs"),
                          _blank(entry["name"], layer)) for entry in s.stats.get("layers", [])))
        items.append((s.kind, s.op, tuple(inputs), len(s.outputs), _attrs(s, layer), npu))
    return tuple(items)


def layer_kinds(program: Program, layers: list[Layer]) -> list[LayerKind]:
    """Layers grouped by structure, in the order each structure first occurs."""
    kinds: dict[tuple, LayerKind] = {}
    for layer in layers:
        sig = signature(program, layer)
        kinds.setdefault(sig, LayerKind([], sig)).layers.append(layer)
    return list(kinds.values())


def _features(program: Program, kind: LayerKind) -> dict[tuple[str, str], tuple[str, ...]]:
    """The CPU ops of the kind's first layer, in the order they first run: for
    each, (op, "") -> (op,) that it is there, and (op, attribute) -> the
    attribute's distinct values as JSON (conversions follow their segment's
    precision and are left out). Keyed by op, not position, so kinds with
    different numbers of steps (Gemma 4's) compare too."""
    out: dict[tuple[str, str], set[str]] = {}
    for i in kind.first.steps:
        s = program.steps[i]
        if s.kind == "npu" or is_conversion(s):
            continue
        out.setdefault((s.op, ""), set()).add(s.op)
        for key, value in s.attrs.items():
            if not _identity(s, key):
                out.setdefault((s.op, key), set()).add(json.dumps(value, sort_keys=True, default=str))
    return {key: tuple(sorted(values)) for key, values in out.items()}


def _read(op: str, key: str, value: str) -> str:
    """An op's presence (`key` ""), or one JSON value of its attribute, in words ("" says nothing)."""
    return ATTR_WORDS[(op, key)](value if not key else json.loads(value))


def precision_words(program: Program, kind: LayerKind) -> str:
    """"fp16 products", or "int8 products; fp16: attn_out, ffn_out" for a hybrid layer."""
    drop = f"{kind.first.name}."
    segments = [program.steps[i] for i in kind.first.steps if program.steps[i].kind == "npu"]
    counts = Counter(segment_precision(s) for s in segments)
    if not counts:
        return "no NPU products"
    main = counts.most_common(1)[0][0]
    others: dict[str, list[str]] = {}
    for s in segments:
        if segment_precision(s) != main:
            others.setdefault(segment_precision(s), []).append("+".join(segment_products(program, s, drop)))
    return "; ".join([f"{main} products", *(f"{p}: {', '.join(names)}" for p, names in others.items())])


def differences(program: Program, kinds: list[LayerKind]) -> list[list[str]]:
    """Per kind, in words, what sets it apart from the other kinds (empty for
    a single kind): the attributes of ATTR_WORDS whose values differ between
    kinds (an op one kind has and another lacks differs too)."""
    if len(kinds) < 2:
        return [[] for _ in kinds]
    features = [_features(program, k) for k in kinds]
    keys = list(dict.fromkeys(key for f in features for key in f))  # in the order the ops first run
    # only what ATTR_WORDS can say (the rest, head sizes, reshapes, scales, follows from it or is
    # wiring); kinds that then read alike are told apart by the first step that differs
    varying = [key for key in keys if key in ATTR_WORDS and len({f.get(key) for f in features}) > 1]
    out = []
    for f in features:
        words = []
        for op, key in varying:
            for value in f.get((op, key), ()):
                text = _read(op, key, value)
                if text and text not in words:
                    words.append(text)
        out.append(words)
    return _tell_apart(program, kinds, out)


def _tell_apart(program: Program, kinds: list[LayerKind], words: list[list[str]]) -> list[list[str]]:
    """Where kinds would read alike (they differ in tasks, wiring, ...), name
    the first step of each that differs from the most common of them."""
    said = [tuple([*w, precision_words(program, k)]) for k, w in zip(kinds, words)]
    for i, kind in enumerate(kinds):
        alike = [j for j in range(len(kinds)) if said[j] == said[i]]
        main = max(alike, key=lambda j: len(kinds[j].layers))  # the first of the most common
        if i != main:
            pos = next((p for p, (a, b) in enumerate(zip(kind.signature, kinds[main].signature)) if a != b),
                       min(len(kind.signature), len(kinds[main].signature)) - 1)
            step = program.steps[kind.first.steps[pos]]
            direction, sep, value = step.name.rpartition(":")  # a conversion: "to_npu:<program>/<value>"
            name = f"{direction}{sep}{local_name(program, value)}"
            what = f"NPU {step.name}" if step.kind == "npu" else f"{step.op} {name}"
            words[i] = [*words[i], f"unlike {kinds[main].first.name}: {what}"]
    return words


def ranges(indices: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0-2, 4, 6-7"."""
    out, start = [], None
    for a, b in zip(indices, [*indices[1:], None]):
        start = a if start is None else start
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = None
    return ", ".join(out)


def kind_title(program: Program, kind: LayerKind, words: list[str], one: Layer | None = None) -> str:
    """A cluster's title: "blk.0 x 15: blk 0-4, 6-10, 12-16" (or `one` layer's
    name when every layer is drawn), then what the kind computes."""
    layers = kind.layers
    head = one.name if one else (f"{kind.first.name} x {len(layers)}: {kind.first.prefix} "
                                 f"{ranges([layer.index for layer in layers])}")
    return f"{head}\\n{', '.join([*words, precision_words(program, kind)])}"


def _end_title(program: Program, steps: list[int], before: bool) -> str:
    if not before:
        return "head"
    return "embedding" if any(program.steps[i].op.startswith("Gather") for i in steps) else "before the layers"


def folded_graph(module: Module, program: Program, sink: str | None = None, full: bool = False) -> nx.DiGraph:
    """The segment graph with layers clustered: each kind of layer drawn once,
    its first layer standing for the others (`full`: every layer drawn, one
    cluster each), the steps before the layers (embedding) and after them
    (head) in clusters of their own. A program without repeated layers comes
    back as its plain step graph."""
    g = step_graph(module, program, sink)
    layers = find_layers(program)
    if not layers:
        return g
    kinds = layer_kinds(program, layers)
    words = differences(program, kinds)
    out = nx.DiGraph(clusters={})

    def place(node: str, cluster: str | None, label: str | None = None) -> None:
        out.add_node(node, **{**g.nodes[node], "cluster": cluster, **({"label": label} if label else {})})

    for n in g:
        if n.startswith("in:"):
            place(n, None)
    ends = (list(range(layers[0].steps[0])), list(range(layers[-1].steps[-1] + 1, len(program.steps))))
    if ends[0]:
        out.graph["clusters"]["before"] = _end_title(program, ends[0], True)
    for i in ends[0]:
        place(f"step{i}", "before")
    rep: dict[str, str] = {}  # a layer step's node -> the node drawn for it
    drawn = [(LayerKind([layer], k.signature), k, w) for k, w in zip(kinds, words) for layer in k.layers] if full \
        else list(zip(kinds, kinds, words))
    drawn.sort(key=lambda d: d[0].first.steps[0])
    for n, (shown, kind, w) in enumerate(drawn):
        key = f"layers{n}"
        out.graph["clusters"][key] = kind_title(program, kind, w, shown.first if full else None)
        drop = f"{shown.first.name}."
        for pos, i in enumerate(shown.first.steps):
            node = f"step{i}"
            place(node, key, step_label(module, program, program.steps[i], g.nodes[node]["segment"] or 0, drop))
            for layer in shown.layers:
                rep[f"step{layer.steps[pos]}"] = node
    if ends[1]:
        out.graph["clusters"]["after"] = _end_title(program, ends[1], False)
    for i in ends[1]:
        place(f"step{i}", "after")
    for n in g:
        if n.startswith("out:") or n == "sink":
            place(n, None)
    rank = {n: r for r, n in enumerate(out)}
    for a, b, data in g.edges(data=True):
        a, b = rep.get(a, a), rep.get(b, b)
        # a folded layer feeding the next layer of its kind, or a kind drawn above it: not drawn
        if a != b and rank[a] < rank[b] and not out.has_edge(a, b):
            out.add_edge(a, b, **data)
    return out
