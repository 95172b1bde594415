"""Hypothesis strategies for structured mutations of rkc's three input formats:
an rkbin's module JSON, a GGUF's metadata, an ONNX graph. Not byte flips: each
mutation keeps the file well-formed as a container and changes what a loader
must interpret (a field's type or value, a list's length, a name, a shape, an
attribute), which is where loaders go wrong. Used by tests/test_fuzz_loaders.py
and tools/hostile_outcomes.py."""

from __future__ import annotations

import copy
import math
from typing import Any

from hypothesis import strategies as st

# values a hostile file puts where a loader expects something else
HOSTILE_INTS = st.sampled_from([0, -1, 1, 2, 3, 7, 255, 65535, 1 << 16, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40,
                                1 << 63, -(1 << 31)])
HOSTILE_SCALARS = st.one_of(
    HOSTILE_INTS, st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0.5, -0.0, 58.5, math.nan, math.inf, -math.inf, 1e308]),
    st.sampled_from(["", "x", "16", "1", "fp128", "object", "host", "weights", "regcmd", "scratch", "\u0000"]),
    st.none(), st.booleans(),
)
HOSTILE_VALUES = st.one_of(
    HOSTILE_SCALARS,
    st.lists(HOSTILE_SCALARS, max_size=4),
    st.dictionaries(st.sampled_from(["name", "size", "x"]), HOSTILE_SCALARS, max_size=2),
)


def paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a node of a JSON tree."""
    out = [prefix]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += paths(v, prefix + (i,))
    return out


def _parent(tree: Any, path: tuple):
    node = tree
    for key in path[:-1]:
        node = node[key]
    return node


@st.composite
def mutated_json(draw, tree: Any, max_edits: int = 3) -> Any:
    """`tree` with 1..max_edits edits: replace a node by a hostile value, delete a
    dict key, duplicate or drop a list element, or copy one node over another
    (names that point at the wrong thing)."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.integers(1, max_edits))):
        every = [p for p in paths(tree) if p]
        if not every:
            break
        path = draw(st.sampled_from(every))
        parent, key = _parent(tree, path), path[-1]
        kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "duplicate", "copy"]))
        if kind == "replace":
            parent[key] = draw(HOSTILE_VALUES)
        elif kind == "delete":
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif kind == "copy":
            donor = draw(st.sampled_from(every))
            value = copy.deepcopy(_parent(tree, donor)[donor[-1]]) if donor[:len(path)] != path else None
            parent[key] = value
    return tree


# GGUF metadata keys a loader interprets (llama architecture)
GGUF_KEYS = [
    "llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
    "llama.attention.head_count_kv", "llama.attention.key_length", "llama.attention.value_length",
    "llama.context_length", "llama.rope.freq_base", "llama.rope.dimension_count",
    "llama.attention.layer_norm_rms_epsilon", "llama.rope.scaling.type", "llama.rope.scaling.factor",
    "llama.attention.sliding_window", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "general.architecture",
]


@st.composite
def mutated_metadata(draw, kv: dict) -> dict:
    kv = dict(kv)
    for key in draw(st.lists(st.sampled_from(GGUF_KEYS), min_size=1, max_size=3, unique=True)):
        if draw(st.booleans()) and key in kv:
            del kv[key]
        else:
            kv[key] = draw(HOSTILE_SCALARS | st.lists(HOSTILE_INTS, max_size=3))
    return kv


# ONNX: a Conv + MaxPool + Gemm graph whose attributes, shapes and data are drawn
ONNX_ATTRS = {
    "Conv": ["group", "strides", "dilations", "pads", "kernel_shape"],
    "MaxPool": ["kernel_shape", "strides", "pads", "dilations", "ceil_mode"],
    "Gemm": ["transA", "transB", "alpha"],
    "Softmax": ["axis"],
    "Gather": ["axis"],
    "Split": ["axis"],
}
ONNX_INTS = HOSTILE_INTS.filter(lambda v: -(1 << 63) <= v < 1 << 63)  # what protobuf's int64 can carry
ATTR_VALUES = st.one_of(ONNX_INTS, st.lists(ONNX_INTS, min_size=1, max_size=5))
DIM_VALUES = st.one_of(st.integers(1, 64), ONNX_INTS.filter(lambda d: d >= 0))


@st.composite
def onnx_model(draw):
    """(op, model) with hostile attributes, input dims, weight shapes, data and opset."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    op = draw(st.sampled_from(sorted(ONNX_ATTRS)))
    attrs = {a: draw(ATTR_VALUES) for a in draw(st.lists(st.sampled_from(ONNX_ATTRS[op]), max_size=3, unique=True))}
    rank = {"Conv": 4, "MaxPool": 4, "Gemm": 2, "Softmax": 2, "Gather": 2, "Split": 2}[op]
    dims = [draw(DIM_VALUES) if draw(st.integers(0, 4)) == 0 else d for d in ([1, 8, 8, 8] if rank == 4 else [4, 8])]
    inits, inputs, outputs = [], ["x"], ["y"]
    if op in ("Conv", "Gemm", "Gather", "Split"):
        shape = {"Conv": [8, 8, 3, 3], "Gemm": [8, 4], "Gather": [2], "Split": [2]}[op]
        shape = [draw(st.integers(0, 9)) if draw(st.integers(0, 4)) == 0 else d for d in shape]
        if op in ("Gather", "Split"):  # indices / split sizes: around the axis' size, and hostile
            values = st.integers(-9, 9) | ONNX_INTS
            data = np.array(draw(st.lists(values, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                            np.int64).reshape(shape)
        else:
            data = np.ones(shape, np.float32)
        if op == "Split":  # as many outputs as sizes, or not
            outputs = [f"y{i}" for i in range(draw(st.sampled_from([max(len(data.reshape(-1)), 1), 1, 3])))]
        w = numpy_helper.from_array(data, "w")
        if draw(st.integers(0, 5)) == 0:
            w.raw_data = w.raw_data[:draw(st.integers(0, max(len(w.raw_data) - 1, 0)))]
        inits.append(w)
        inputs.append("w")
    if op == "MaxPool" and "kernel_shape" not in attrs:
        attrs["kernel_shape"] = [2, 2]
    node = helper.make_node(op, inputs, outputs, **attrs)
    graph = helper.make_graph([node], "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in outputs], inits)
    opset = draw(st.sampled_from([13, 17, 17, 17, 99]))
    return op, helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@st.composite
def mutated_tensor_shapes(draw, shapes: dict[str, tuple[int, ...]], blocks: dict[str, int]) -> dict[str, tuple]:
    """Another shape (numpy order) for 1..3 of a GGUF's tensors: a dimension grown, shrunk, swapped with another
    or dropped, a new one added (plain types; a block type stays 2-D); the row length stays a multiple of the
    tensor type's block (else there is no GGUF to write). `shapes`: the good file's; `blocks`: each tensor's
    block length (1: a plain type)."""
    out = {}
    for name in draw(st.lists(st.sampled_from(sorted(shapes)), min_size=1, max_size=3, unique=True)):
        shape, block = list(shapes[name]), blocks[name]
        kinds = ["grow", "shrink", "swap"] + (["drop", "add"] if block == 1 else [])  # blocks: 2-D rows only
        kind = draw(st.sampled_from(kinds))
        i = draw(st.integers(0, len(shape) - 1))
        if kind == "swap" and len(shape) > 1:
            shape = shape[::-1]
        elif kind == "drop" and len(shape) > 1:
            del shape[i]
        elif kind == "add":
            shape.insert(0, draw(st.integers(2, 4)))
        else:
            step = block if i == len(shape) - 1 else 1
            delta = step * draw(st.integers(1, 3))
            shape[i] = shape[i] + delta if kind == "grow" or shape[i] <= delta else shape[i] - delta
        if shape[-1] % block == 0 and tuple(shape) != shapes[name]:
            out[name] = tuple(shape)
    return out
