"""Memory planning: buffers alive together never overlap; reuse happens."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rkc.compiler.memplan import Buffer, check_plan, plan_memory

buffers = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(buffers)
def test_no_two_live_buffers_overlap(raw):
    bufs = [Buffer(f"b{i}", size, first, first + span) for i, (size, first, span) in enumerate(raw)]
    plan = plan_memory(bufs)
    check_plan(bufs, plan)
    assert all(plan.offsets[b.name] % b.align == 0 for b in bufs)
    assert plan.size <= sum(-(-b.size // 64) * 64 for b in bufs)
    peak = max(sum(b.size for b in bufs if b.first <= t <= b.last) for t in range(27))
    assert plan.size >= peak


def test_a_chain_reuses_memory():
    bufs = [Buffer(f"t{i}", 1024, i, i + 1) for i in range(10)]
    plan = plan_memory(bufs)
    assert plan.size == 2048
