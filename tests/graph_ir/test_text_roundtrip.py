"""The IR text form round-trips: print -> parse -> print is a fixed point and the
parsed graph equals the original (payloads aside, which the text references)."""

import math

from hypothesis import given, settings, strategies as st

from rkc.ir.graph import Graph, PayloadRef
from rkc.ir.text import parse_graph, print_graph
from rkc.ir.types import BlockQuant, DType, PerAxisQuant, PerTensorQuant, TensorType

names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,12}", fullmatch=True),
    st.text(min_size=1, max_size=10),  # anything: printed quoted
)
dims = st.lists(st.one_of(st.integers(0, 4096), st.sampled_from(["N", "seq", "batch"])), max_size=5)
finite = st.floats(allow_nan=False, width=64)
scales = st.floats(min_value=1e-30, max_value=1e30, allow_nan=False)
quants = st.one_of(
    st.none(),
    st.builds(PerTensorQuant, scales, st.integers(-128, 255)),
    st.builds(PerAxisQuant, st.integers(0, 3), names, names),
    st.builds(BlockQuant, st.sampled_from(["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])),
)
types = st.builds(lambda d, s, q: TensorType(d, tuple(s), q), st.sampled_from(list(DType)), dims, quants)
scalar_attr = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=8),
                        st.builds(PayloadRef, names))
attr_value = st.one_of(scalar_attr, st.lists(st.integers(-1000, 1000), max_size=6),
                       st.lists(finite, max_size=4), st.lists(st.text(max_size=4), max_size=3))
attr_dicts = st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), attr_value, max_size=4)


@st.composite
def graphs(draw) -> Graph:
    g = Graph(name=draw(st.text(max_size=12)))
    g.metadata = draw(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), attr_value,
                                      max_size=3))
    pool = draw(st.lists(names, min_size=1, max_size=40, unique=True))
    it = iter(pool)
    available: list[str] = []
    for _ in range(draw(st.integers(0, 3))):
        name = next(it, None)
        if name is None:
            break
        g.add_input(name, draw(types))
        available.append(name)
    for _ in range(draw(st.integers(0, 3))):
        name = next(it, None)
        if name is None:
            break
        g.add_const(name, draw(types), payload=draw(names))
        available.append(name)
    for _ in range(draw(st.integers(0, 8))):
        outs = []
        for _ in range(draw(st.integers(1, 3))):
            name = next(it, None)
            if name is not None:
                outs.append((name, draw(types)))
        if not outs:
            break
        ins = draw(st.lists(st.one_of(st.sampled_from(available), st.just("")), max_size=4)) if available else []
        op_type = draw(st.from_regex(r"[A-Z][A-Za-z0-9_]{0,10}", fullmatch=True))
        op_name = draw(st.one_of(st.none(), st.text(max_size=8)))
        g.add_op(op_type, ins, outs, draw(attr_dicts), op_name)
        available.extend(n for n, _ in outs)
    if available:
        g.outputs = draw(st.lists(st.sampled_from(available), max_size=3))
    return g


def _same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_print_parse_print_is_a_fixed_point(g):
    text = print_graph(g)
    again = parse_graph(text)
    assert print_graph(again) == text


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_parse_reproduces_the_graph(g):
    back = parse_graph(print_graph(g))
    assert back.name == g.name
    assert back.inputs == g.inputs and back.outputs == g.outputs
    assert list(back.tensors) == [*g.inputs, *[n for n, t in g.tensors.items() if t.kind == "const"],
                                  *[o for op in g.ops for o in op.outputs]]
    for name, t in g.tensors.items():
        assert back.tensors[name] == t, name
    assert len(back.ops) == len(g.ops)
    for a, b in zip(back.ops, g.ops):
        assert (a.type, a.inputs, a.outputs, a.name) == (b.type, b.inputs, b.outputs, b.name)
        assert a.attrs.keys() == b.attrs.keys()
        assert all(_same_value(a.attrs[k], b.attrs[k]) for k in a.attrs), (a.attrs, b.attrs)
    assert back.metadata.keys() == g.metadata.keys()
    assert all(_same_value(back.metadata[k], g.metadata[k]) for k in g.metadata)
