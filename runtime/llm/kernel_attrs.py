"""What each LLM CPU kernel (runtime/llm/kernels.py, and its prepared form in
prepared.py) reads of its step: how many inputs, and every attribute's type
and range. runtime/module_check.py holds each LLM step of an rkbin to this
table at load, so a hostile attribute is one FormatError line, never a numpy
exception (exit 70) in the middle of a generation.

The attributes are those compiler/frontend/gguf.py and
compiler/llm/program_builder.py write; an attribute the table does not name is
refused (no kernel would read it, so it can only be a broken or crafted file).
"""

from __future__ import annotations

import math
from typing import Any, Callable

INT_LIMIT = 1 << 31
MAX_TERMS = 2  # int8 rows per activation row (runtime/llm/weights.quantize_rows): the value and its residual


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


# rule name -> (test, what it must be)
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "finite": (_number, "a finite number"),
    "positive": (lambda v: _number(v) and v > 0, "a finite number > 0"),
    "non-negative": (lambda v: _number(v) and v >= 0, "a finite number >= 0"),
    "count": (lambda v: _int(v) and 0 < v < INT_LIMIT, "an int in [1, 2^31)"),
    "index": (lambda v: _int(v) and 0 <= v < INT_LIMIT, "an int in [0, 2^31)"),
    "even count": (lambda v: _int(v) and 0 < v < INT_LIMIT and v % 2 == 0, "an even int in [2, 2^31)"),
    "shape": (lambda v: isinstance(v, list) and 0 < len(v) <= 8 and all(_int(d) and -1 <= d < INT_LIMIT for d in v)
              and sum(d == -1 for d in v) <= 1, "a list of 1-8 dims >= 0 (one may be -1)"),
    "rope mode": (lambda v: v in ("norm", "neox"), "'norm' or 'neox'"),
    "rotation": (lambda v: v == "hadamard", "'hadamard'"),
    "weight dtype": (lambda v: v in ("int8", "float16"), "'int8' or 'float16' (packed NPU weights)"),
    "tensor": (lambda v: isinstance(v, str) and v != "", "a tensor name"),
    "terms": (lambda v: _int(v) and 1 <= v <= MAX_TERMS, f"an int in [1, {MAX_TERMS}]"),
}

ROTATION = {"rotation": "rotation", "block": "count"}  # rotated rows: the factor's inputs follow
ROTATION_INPUTS = {"QuantizeRows": 1, "QuantizeNibbles": 1, "GatherPacked": 2, "GatherRows": 3}  # where the signs [K] (then F [m, m]) sit

# op -> (fewest inputs, most inputs (None: any), {attribute: rule}, attributes required)
KERNEL_ATTRS: dict[str, tuple[int, int | None, dict[str, str], tuple[str, ...]]] = {
    "Gather": (2, 2, {}, ()),
    "Scale": (1, 1, {"factor": "finite"}, ("factor",)),
    "RMSNorm": (2, 2, {"epsilon": "non-negative"}, ("epsilon",)),
    "Linear": (2, 3, {}, ()),
    "Reshape": (1, 1, {"shape": "shape"}, ("shape",)),
    "RoPE": (2, 3, {"base": "positive", "scale": "finite", "dims": "even count", "mode": "rope mode"},
             ("base", "scale", "dims", "mode")),
    "Attention": (4, 4, {"layer": "index", "scale": "finite", "window": "index", "kv_heads": "count"},
                  ("layer", "scale", "window")),
    "SiLU": (1, 1, {}, ()),
    "GeluTanh": (1, 1, {}, ()),
    "Tanh": (1, 1, {}, ()),
    "Mul": (2, 2, {}, ()),
    "Add": (2, 2, {}, ()),
    "TakeLast": (1, 1, {}, ()),
    "GatherRows": (2, 5, dict(ROTATION), ()),
    "GatherPacked": (1, 4, {"packed": "tensor", "rows": "count", "cols": "count", "dtype": "weight dtype",
                            **ROTATION}, ("packed", "rows", "cols", "dtype")),
    "QuantizeRows": (1, 3, {**ROTATION, "terms": "terms"}, ()),
    "DequantizeRows": (3, None, {"partials": "count", "terms": "terms"}, ()),  # partials + row scale + channel scale (+ bias)
    "SumPartials": (1, None, {}, ()),
    # int4 products (runtime/llm/int4_rows.py)
    # pair_group: one token's nibble rows carry two K groups of that many channels (int4_rows.pair_rows)
    "QuantizeNibbles": (1, 3, {**ROTATION, "pair_group": "count"}, ()),
    "CombineInt4": (3, 4, {"pair_group": "count"}, ()),  # partials + row scale + group scales [G, N] (+ bias)
    # Gemma 4
    "AttentionShared": (2, 2, {"layer": "index", "source": "index", "scale": "finite", "window": "index",
                               "kv_heads": "count"}, ("layer", "source", "scale", "window")),
    "RMSNormPlain": (1, 1, {"epsilon": "non-negative"}, ("epsilon",)),
    "Pick": (1, 1, {"index": "index"}, ("index",)),
    "ScaleBy": (2, 2, {}, ()),
}

# the first output's shape from the inputs' (None: not decided by the op alone)
BROADCASTING = frozenset({"SiLU", "GeluTanh", "Tanh", "Scale", "RMSNorm", "Mul", "Add", "SumPartials", "ScaleBy"})
SHAPE_OF_FIRST = frozenset({"RoPE", "QuantizeRows", "DequantizeRows", "RMSNormPlain"})


def output_shape(op: str, shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> tuple[int, ...] | None:
    """What kernel `op` makes of inputs of these shapes (attributes already checked);
    ValueError when it cannot run on them."""
    import numpy as np

    if "rotation" in attrs:
        _check_rotation(op, shapes, attrs)
    if op in BROADCASTING:
        try:
            return tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            raise ValueError("they do not broadcast") from None
    terms = attrs.get("terms", 1)
    if op == "QuantizeRows" and terms > 1 and shapes[0]:  # T int8 rows per row
        return (terms * shapes[0][0], *shapes[0][1:])
    if op == "DequantizeRows" and terms > 1 and shapes[0]:  # T rows of sums per output row
        if shapes[0][0] % terms:
            raise ValueError(f"{shapes[0][0]} rows of sums are not {terms} terms per row")
        return (shapes[0][0] // terms, *shapes[0][1:])
    if op == "QuantizeNibbles" and shapes[0]:  # two nibble rows per row, two nibbles per byte
        if len(shapes[0]) != 2 or shapes[0][1] % 32:
            raise ValueError("QuantizeNibbles takes rows [M, K] with K % 32 == 0")
        if "pair_group" in attrs:  # four nibble rows per row: two K groups' (int4_rows.pair_rows)
            if attrs["pair_group"] % 32:
                raise ValueError("QuantizeNibbles pairs K groups of a multiple of 32")
            return (4 * shapes[0][0], shapes[0][1] // 2)
        return (2 * shapes[0][0], shapes[0][1] // 2)
    if op == "CombineInt4":  # partials [2M, G * Np], row scales [M], group scales [G, N] (+ bias [N])
        p, rows, scales = shapes[0], shapes[1], shapes[2]
        paired = "pair_group" in attrs  # [4M, ceil(G / 2) * Np]
        blocks = -(-scales[0] // 2) if paired and len(scales) == 2 else scales[0] if len(scales) == 2 else 0
        if (len(p) != 2 or len(scales) != 2 or p[0] != (4 if paired else 2) * rows[0]
                or p[1] != blocks * -(-scales[1] // 64) * 64):
            raise ValueError("CombineInt4 takes partials [2M, G x align(N, 64)] (paired: [4M, ceil(G / 2) x "
                             "align(N, 64)]), row scales [M], scales [G, N]")
        return (rows[0], scales[1])
    if op == "RoPE":  # x [T, heads, dim], positions [T] (+ frequency factors per rotated pair)
        x, pos, half = shapes[0], shapes[1], attrs["dims"] // 2
        if len(x) != 3 or tuple(pos) != (x[0],) or 2 * half > x[2]:
            raise ValueError(f"RoPE takes x as [T, heads, dim >= {2 * half}] and positions as [T]")
        if len(shapes) > 2 and tuple(shapes[2]) not in ((half,), (1,)):
            raise ValueError(f"RoPE's frequency factors are [{half}], one per rotated pair")
    if op in SHAPE_OF_FIRST:
        return shapes[0]
    if op == "Reshape":
        size, target = math.prod(shapes[0]), list(attrs["shape"])
        if -1 in target:
            rest = math.prod(d for d in target if d != -1)
            if rest == 0 or size % rest:
                raise ValueError(f"no reshape to {target}")
            target[target.index(-1)] = size // rest
        if math.prod(target) != size:
            raise ValueError(f"{size} elements do not reshape to {target}")
        return tuple(target)
    if op == "Attention":
        q, k, v, pos = shapes
        if len(q) != 3 or len(k) != 3 or len(v) != 3 or len(pos) != 1:
            raise ValueError("attention takes q, k, v as [T, heads, dim] and positions as [T]")
        if not (q[0] == k[0] == v[0] == pos[0] and q[2] == k[2] and k[1] == v[1] and k[1] and q[1] % k[1] == 0):
            raise ValueError("q, k, v and positions do not agree (rows, heads, head dims)")
        return (q[0], q[1] * v[2])
    if op == "Pick":  # one layer's slice of the per-layer inputs [T, layers, width]
        if len(shapes[0]) != 3 or not attrs["index"] < shapes[0][1]:
            raise ValueError(f"Pick {attrs['index']} of an input of shape {list(shapes[0])}")
        return (shapes[0][0], shapes[0][2])
    return None


def attribute_problem(op: str, n_inputs: int, attrs: dict[str, Any]) -> str | None:
    """Why a step of LLM kernel `op` with these inputs and attributes cannot run (None: it can)."""
    fewest, most, rules, required = KERNEL_ATTRS[op]
    for name in required:
        if name not in attrs:
            return f"{op} needs attribute {name!r}"
    for name, value in attrs.items():
        rule = rules.get(name)
        if rule is None:
            return f"{op} has no attribute {name!r}"
        test, meaning = RULES[rule]
        if not test(value):
            return f"{op} attribute {name}={value!r:.40}: not {meaning}"
    if "rotation" in attrs and "block" not in attrs:
        return f"{op} with a rotation needs its block size"
    if "rotation" in attrs and not ROTATION_INPUTS[op] < n_inputs <= ROTATION_INPUTS[op] + 2:
        return f"{op} with a rotation takes its signs (and factor) as inputs {ROTATION_INPUTS[op]}.., not {n_inputs} inputs"
    if op == "DequantizeRows":
        fewest = attrs.get("partials", 1) + 2
        most = fewest + 1
    if n_inputs < fewest or (most is not None and n_inputs > most):
        span = f"{fewest}" if most == fewest else f"{fewest}..{most if most is not None else ''}"
        return f"{op} takes {span} inputs, not {n_inputs}"
    return None


def _check_rotation(op: str, shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> None:
    """Signs [K] for the rotated rows' K columns, a power-of-two block dividing K,
    the factor (if any) [K / block, K / block] (runtime/kernels/hadamard.py)."""
    k = attrs["cols"] if op == "GatherPacked" else (shapes[0][-1] if shapes[0] else 0)
    at, block = ROTATION_INPUTS[op], attrs["block"]
    if shapes[at] != (k,):
        raise ValueError(f"rotation signs of shape {list(shapes[at])} for {k} columns")
    if block & (block - 1) or k % block:
        raise ValueError(f"rotation block {block} is not a power of two dividing {k}")
    if len(shapes) > at + 1 and shapes[at + 1] != (k // block, k // block):
        raise ValueError(f"rotation factor of shape {list(shapes[at + 1])}, not [{k // block}, {k // block}]")


def check_layers(module, cfg) -> None:
    """Each Attention step names a layer (and KV source) of the model's KV cache (cfg.n_layer)."""
    from rkc.ir.errors import FormatError

    for prog in module.programs:
        for step in prog.steps:
            if step.kind == "cpu" and step.op in ("Attention", "AttentionShared") and \
                    max(step.attrs["layer"], step.attrs.get("source", 0)) >= cfg.n_layer:
                source = f" (KV source {step.attrs['source']})" if "source" in step.attrs else ""
                raise FormatError(f"program {prog.name!r} step {step.name!r}: {step.op} layer "
                                  f"{step.attrs['layer']}{source} of a {cfg.n_layer}-layer model")
