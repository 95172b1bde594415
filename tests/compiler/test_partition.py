"""Partitioning: convex segments, every op exactly once, a valid order, and
the fewest segments on the shapes where that number is known."""

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from rkc.compiler.partition import partition
from rkc.ir.graph import Graph
from rkc.ir.types import DType, TensorType

T = TensorType(DType.FP32, (1, 4))


def _graph(n_ops: int, edges: list[tuple[int, int]]) -> Graph:
    """Op i reads graph input x plus the outputs of its predecessors (edges a->b with a < b)."""
    g = Graph()
    g.add_input("x", T)
    for i in range(n_ops):
        preds = [f"t{a}" for a, b in edges if b == i]
        g.add_op("Add" if preds else "Relu", preds or ["x"], [(f"t{i}", T)])
    g.outputs = [f"t{n_ops - 1}"]
    return g


def _check(g: Graph, npu: set[int]):
    steps = partition(g, lambda i: i in npu)
    seen = sorted(i for s in steps for i in s.ops)
    assert seen == list(range(len(g.ops)))
    dag = g.dependency_graph()
    position = {i: k for k, s in enumerate(steps) for i in s.ops}
    for a, b in dag.edges:  # steps run in dependency order
        assert position[a] <= position[b]
    for s in steps:
        assert all((i in npu) == (s.device == "npu") for i in s.ops)
        if s.device == "cpu":
            assert len(s.ops) == 1
        members = set(s.ops)
        for a in members:  # convex: no path leaves the segment and comes back
            for d in nx.descendants(dag, a) - members:
                assert not (nx.descendants(dag, d) & members), f"segment {s.ops} is not convex"
    return steps


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 14).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
    st.sets(st.integers(0, n - 1)))))
def test_random_dags_give_convex_ordered_segments(case):
    n, raw, npu = case
    edges = sorted({(min(a, b), max(a, b)) for a, b in raw if a != b})
    _check(_graph(n, edges), npu)


def test_chain_splits_only_at_cpu_ops():
    # npu npu cpu npu npu cpu npu: 2 hard boundaries -> 3 segments
    n = 7
    steps = _check(_graph(n, [(i, i + 1) for i in range(n - 1)]), {0, 1, 3, 4, 6})
    assert [s.device for s in steps] == ["npu", "cpu", "npu", "cpu", "npu"]
    assert [s.ops for s in steps if s.device == "npu"] == [[0, 1], [3, 4], [6]]


def test_unrelated_branches_share_a_segment():
    # 0 -> 1(cpu) -> 2 and an independent 3: {0, 3} or {2, 3} merge; never 3 segments
    steps = _check(_graph(4, [(0, 1), (1, 2)]), {0, 2, 3})
    assert sum(s.device == "npu" for s in steps) == 2


def test_segment_edges_name_the_crossing_tensors():
    steps = _check(_graph(3, [(0, 1), (1, 2)]), {0, 2})
    assert steps[0].outputs == ["t0"] and steps[1].inputs == ["t0"] and steps[2].outputs == ["t2"]


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
    st.lists(st.sampled_from([None, "int8", "fp16"]), min_size=n, max_size=n))))
def test_mixed_kinds_never_share_a_segment(case):
    """Mixed precision: NPU ops of different kinds (dtypes) land in different
    convex segments; the rest of the contract holds as for one kind."""
    n, raw, kinds = case
    edges = sorted({(min(a, b), max(a, b)) for a, b in raw if a != b})
    g = _graph(n, edges)
    steps = partition(g, lambda i: kinds[i])
    dag = g.dependency_graph()
    assert sorted(i for s in steps for i in s.ops) == list(range(n))
    for s in steps:
        assert len({kinds[i] for i in s.ops}) == 1
        assert (s.device == "npu") == (kinds[s.ops[0]] is not None)
        members = set(s.ops)
        for a in members:
            for d in nx.descendants(dag, a) - members:
                assert not (nx.descendants(dag, d) & members)


def test_a_chain_of_two_kinds_splits_where_the_kind_changes():
    steps = partition(_graph(4, [(0, 1), (1, 2), (2, 3)]), lambda i: ["int8", "int8", "fp16", "int8"][i])
    assert [s.ops for s in steps] == [[0, 1], [2], [3]]
