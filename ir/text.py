"""Print a Graph as text and parse it back (grammar: ir/ir.lark).

print_graph(parse_graph(t)) == t for any text print_graph produced, and
parse_graph(print_graph(g)) equals g up to payload contents, which the text
only references (``@name``).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from importlib import resources

from lark import Lark, Transformer, v_args
from lark.exceptions import LarkError, VisitError

from rkc.ir.errors import FormatError, VerifyError
from rkc.ir.graph import AttrValue, Graph, PayloadRef, Tensor
from rkc.ir.types import BlockQuant, DType, PerAxisQuant, PerTensorQuant, Quant, TensorType

_BARE = re.compile(r"[A-Za-z0-9_.\-/]+\Z")


# -- printing -----------------------------------------------------------------
def _name(prefix: str, name: str) -> str:
    return prefix + (name if _BARE.match(name) else json.dumps(name))


def _float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = repr(float(v))
    return text if any(c in text for c in ".en") else text + ".0"


def format_value(v: AttrValue) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, PayloadRef):
        return _name("@", v.name)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def format_quant(q: Quant) -> str:
    if isinstance(q, PerTensorQuant):
        return f"q(scale={_float(q.scale)}, zp={q.zero_point})"
    if isinstance(q, PerAxisQuant):
        return f"q(axis={q.axis}, scale={_name('@', q.scale)}, zp={_name('@', q.zero_point)})"
    if isinstance(q, BlockQuant):
        return f"q(block={json.dumps(q.ggml_type)})"
    raise TypeError(f"unknown quantization {q!r}")


def format_type(t: TensorType) -> str:
    dims = ",".join(str(d) for d in t.shape)
    text = f"{t.dtype.value}[{dims}]"
    return f"{text} {format_quant(t.quant)}" if t.quant is not None else text


def _decl(t: Tensor) -> str:
    return f"{_name('%', t.name)}: {format_type(t.type)}"


def print_graph(g: Graph) -> str:
    lines = [f"graph {json.dumps(g.name)} {{"]
    for key, value in g.metadata.items():
        lines.append(f"  meta {key} = {format_value(value)}")
    for name in g.inputs:
        lines.append(f"  input {_decl(g.tensors[name])}")
    for t in g.tensors.values():
        if t.kind == "const":
            lines.append(f"  const {_decl(t)} = {_name('@', t.payload or t.name)}")
    for op in g.ops:
        outs = ", ".join(_decl(g.tensors[o]) for o in op.outputs)
        args = ", ".join(_name("%", i) if i else "_" for i in op.inputs)
        text = f"  {outs} = {op.type}({args})"
        if op.attrs:
            text += " {" + ", ".join(f"{k}={format_value(v)}" for k, v in op.attrs.items()) + "}"
        if op.name is not None:
            text += f" as {json.dumps(op.name)}"
        lines.append(text)
    if g.outputs:
        lines.append("  output " + ", ".join(_name("%", o) for o in g.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- parsing ------------------------------------------------------------------
@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = resources.files("rkc.ir").joinpath("ir.lark").read_text()
    return Lark(grammar, parser="lalr", maybe_placeholders=True)


def _unquote(token) -> str:
    text = str(token)
    return json.loads(text) if text.startswith('"') else text


@v_args(inline=True)
class _Build(Transformer):
    def __init__(self) -> None:
        super().__init__()
        self.graph = Graph()

    # leaves
    def tref(self, tok):
        return _unquote(tok)

    def ref(self, tok):
        return PayloadRef(_unquote(tok))

    def absent(self):
        return ""

    def int_dim(self, tok):
        return int(tok)

    def sym_dim(self, tok):
        return str(tok)

    def int_value(self, tok):
        return int(tok)

    def float_value(self, tok):
        return float(str(tok))

    def string(self, tok):
        return json.loads(str(tok))

    def list(self, *items):
        return [] if items == (None,) else list(items)

    def qitem(self, key, value):
        return str(key), value

    def quant(self, *items):
        kv = dict(items)
        if "block" in kv:
            return BlockQuant(str(kv["block"]))
        if "axis" in kv:
            return PerAxisQuant(int(kv["axis"]), kv["scale"].name, kv["zp"].name)
        return PerTensorQuant(float(kv["scale"]), int(kv.get("zp", 0)))

    def ttype(self, dtype, *rest):
        quant = rest[-1] if rest and isinstance(rest[-1], (PerTensorQuant, PerAxisQuant, BlockQuant)) else None
        dims = [d for d in (rest[:-1] if quant is not None else rest) if d is not None]
        return TensorType(DType(str(dtype)), tuple(dims), quant)

    def tdecl(self, name, ttype):
        return name, ttype

    def attr(self, key, value):
        return str(key), value

    def attrs(self, *items):
        return dict(i for i in items if i is not None)

    def opname(self, tok):
        return _OpName(json.loads(str(tok)))

    # statements
    def meta(self, key, value):
        self.graph.metadata[str(key)] = value

    def input(self, decl):
        self.graph.add_input(*decl)

    def const(self, decl, ref):
        self.graph.add_const(decl[0], decl[1], payload=ref.name)

    def output(self, *names):
        self.graph.outputs.extend(names)

    def op(self, *parts):
        rest = list(parts)
        decls = []
        while rest and isinstance(rest[0], tuple):
            decls.append(rest.pop(0))
        op_type = str(rest.pop(0))
        name = rest.pop().name if rest and isinstance(rest[-1], _OpName) else None
        attrs = rest.pop() if rest and isinstance(rest[-1], dict) else {}
        inputs = [] if rest == [None] else rest
        self.graph.add_op(op_type, inputs, decls, attrs, name)

    def start(self, name, *_stmts):
        self.graph.name = json.loads(str(name))
        return self.graph


class _OpName(str):
    """Marks the trailing `as "name"` of an op line (an arg is a plain str)."""

    @property
    def name(self) -> str:
        return str(self)


def parse_graph(text: str, source: str = "<text>") -> Graph:
    try:
        tree = _parser().parse(text)
        return _Build().transform(tree)
    except VisitError as exc:
        inner = exc.orig_exc
        if isinstance(inner, (VerifyError, FormatError)):
            raise type(inner)(f"{source}: {inner}") from None
        raise FormatError(f"{source}: {type(inner).__name__}: {inner}") from None
    except LarkError as exc:
        first = str(exc).strip().splitlines()[0]
        raise FormatError(f"{source}: not valid IR text: {first}") from None
