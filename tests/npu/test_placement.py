"""A segment's GEMMs placed over the cores together (compiler/npu/placement.py):
the placement covers every output channel once, never models slower than each
GEMM's even split, and the placed programs compute on the simulator exactly
what numpy and the even split compute, over shape sweeps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, HealthCheck, given, settings, strategies as st

from rkc.compiler.npu import api, placement
from rkc.compiler.npu.assemble import assemble
from rkc.compiler.npu.conv_core import kernel_group
from rkc.compiler.npu.dispatch import emit
from rkc.ir.errors import RegisterError, UnsupportedError

sim = pytest.importorskip("rkc.runtime.sim", reason="the NPU simulator (issue 3) is not in this tree yet")
from npu_runner import run  # noqa: E402

SWEEP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPTIONS = api.EmitOptions()


def _covers(ranges, n: int, group: int, cores: int) -> None:
    pos = 0
    for start, size, lane in sorted(ranges):
        assert start == pos and size > 0 and start % group == 0 and 0 <= lane < cores
        pos = start + size
    assert pos == n


@settings(max_examples=200, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 9000)), min_size=1, max_size=4),
       rows=st.sampled_from([4, 32]), dtype=st.sampled_from(["int8", "fp16"]), cores=st.integers(1, 3))
def test_placement_covers_each_channel_once_and_is_never_slower(shapes, rows, dtype, cores):
    products = [placement.Product(rows, k, n, dtype, 4) for k, n in shapes]
    kicks = dtype == "int8"
    placed = placement.place(products, cores, kicks, OPTIONS.n_tile_max)
    for p, r in zip(products, placed):
        _covers(r, p.n, kernel_group(dtype), cores)
    even = [placement.even_split(p, cores, OPTIONS.n_tile_max) for p in products]
    assert placement.segment_seconds(products, placed, kicks, OPTIONS.n_tile_max) <= \
        placement.segment_seconds(products, even, kicks, OPTIONS.n_tile_max) * (1 + 1e-9)


def _lanes(ranges) -> dict[int, int]:
    """Tasks per lane of a segment's placed products (each range under n_tile_max here)."""
    out: dict[int, int] = {}
    for r in ranges:
        for _, _, lane in r:
            out[lane] = out.get(lane, 0) + 1
    return out


def test_small_int8_products_take_fewer_kicks_per_core():
    # Gemma 3 270M's q/k/v at decode: evenly split, every core kicks 3 tasks
    products = [placement.Product(4, 640, n, "int8", 4) for n in (1024, 256, 256)]
    placed = placement.place(products, 3, True, OPTIONS.n_tile_max)
    assert max(_lanes(placed).values()) == 2 and sum(_lanes(placed).values()) == 5
    even = [placement.even_split(p, 3, OPTIONS.n_tile_max) for p in products]
    assert max(_lanes(even).values()) == 3
    t_placed = placement.segment_seconds(products, placed, True, OPTIONS.n_tile_max)
    t_even = placement.segment_seconds(products, even, True, OPTIONS.n_tile_max)
    assert t_placed < 0.7 * t_even


def test_a_dram_bound_head_keeps_its_even_split():
    head = placement.Product(4, 640, 262144, "int8", 4)
    even = placement.even_split(head, 3, OPTIONS.n_tile_max)
    assert placement.place([head], 3, True, OPTIONS.n_tile_max) == [even]


def test_a_placement_that_misses_channels_is_refused():
    A = api.Feature.gemm("A", 0, 1, 64, "int8")
    C = api.Feature.gemm("C", 0, 1, 96, "int32")
    b = np.zeros((64, 96), np.int8)
    for bad in (((0, 64, 0),), ((0, 48, 0), (48, 48, 1)), ((0, 64, 0), (64, 32, 3))):
        with pytest.raises(UnsupportedError, match="placement"):
            emit(api.Gemm(A, b, C, 1, placement=bad), OPTIONS)


def _segment(m: int, k: int, ns: list[int], dtype: str, seed: int, placed: bool, chained: bool = False):
    """Run the GEMMs of one segment (one A, one C per product) on the simulator."""
    rng = np.random.default_rng(seed)
    if dtype == "int8":
        a = rng.integers(-128, 128, (m, k)).astype(np.int8)
        bs = [rng.integers(-128, 128, (k, n)).astype(np.int8) for n in ns]
    else:
        a = rng.standard_normal((m, k)).astype(np.float16)
        bs = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16) for n in ns]
    out = "int32" if dtype == "int8" else "fp16"
    A = api.Feature.gemm("A", 0, m, k, dtype)
    ops = [api.Gemm(A, b, api.Feature.gemm(f"C{i}", 0, m, b.shape[1], out), m, name=f"g{i}")
           for i, b in enumerate(bs)]
    if placed:
        ops = placement.place_segment(ops, OPTIONS, per_task_kicks=dtype == "int8")
    results = [emit(op, OPTIONS) for op in ops]
    apad = np.zeros((api.gemm_rows(m), k), a.dtype)
    apad[:m] = a
    # as an LLM segment is assembled: each core's tasks one job (compiler/npu/assemble.py independent)
    got = run(results, sim.SimDevice(), {"A": (A, apad.T[:, :, None])}, merge_jobs=True, independent=True,
              chained=chained)
    return a, bs, [got.feature(op.c)[:, :m, 0].T for op in ops], ops


@SWEEP
@given(m=st.integers(1, 8), k=st.integers(1, 400), ns=st.lists(st.integers(1, 400), min_size=1, max_size=4),
       dtype=st.sampled_from(["int8", "fp16"]), seed=st.integers(0, 999))
@example(m=5, k=385, ns=[81, 161, 289, 337], dtype="fp16", seed=0)  # a task shape that moves sgemm's order
def test_placed_segment_computes_what_numpy_and_the_even_split_compute(m, k, ns, dtype, seed):
    a, bs, placed, _ = _segment(m, k, ns, dtype, seed, placed=True)
    _, _, even, _ = _segment(m, k, ns, dtype, seed, placed=False)
    for b, got, ref in zip(bs, placed, even):
        if dtype == "int8":  # bit for bit: the cut moves channels, not arithmetic
            np.testing.assert_array_equal(got, ref)
        else:
            # the fp32 summation order of the hardware is unknown, and the simulator's (sgemm's,
            # runtime/sim/core.py) follows the task's shape: two orders differ by fp32 rounding
            # (at most 2 k eps32 sum|a b|), then one fp16 step where the fp16 rounding flips
            bound = 2 * k * 2.0 ** -24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
            step = np.spacing(np.abs(ref)).astype(np.float64)
            assert np.all(np.abs(got.astype(np.float64) - ref.astype(np.float64)) <= bound + step)
        if dtype == "int8":
            np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
        else:
            want = a.astype(np.float64) @ b.astype(np.float64)
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=3e-3, atol=3e-3 * max(1, np.abs(want).max()))


@pytest.mark.parametrize("k, ns", [(640, [1024, 256, 256]), (1152, [1024, 256, 256]), (640, [2048, 2048])])
def test_real_decode_segments_are_placed_and_exact(k, ns):
    """Gemma 3 270M / 1B q/k/v and gate/up at decode: the placement is used (not the
    even split), products cross core boundaries, and the result is exact."""
    a, bs, got, ops = _segment(1, k, ns, "int8", 3, placed=True)
    assert any(op.placement is not None for op in ops)
    assert any(len({lane for *_, lane in op.placement}) > 1 for op in ops if op.placement)
    for b, g in zip(bs, got):
        np.testing.assert_array_equal(g, a.astype(np.int64) @ b.astype(np.int64))


def test_an_fp16_segment_runs_as_one_chained_job_per_core_and_computes_the_same():
    """fp16 segments chain: each core's tasks of all the segment's products are one
    job, one kick; the chained run computes what the task-by-task run computes."""
    k, ns = 640, [1024, 256, 256]
    _, _, stock, ops = _segment(1, k, ns, "fp16", 5, placed=True)
    _, _, chained, _ = _segment(1, k, ns, "fp16", 5, placed=True, chained=True)
    for a, b in zip(stock, chained):
        np.testing.assert_array_equal(a, b)
    asm = assemble([emit(op, OPTIONS) for op in ops], independent=True)
    assert len(asm.jobs) == len({job.lane for job in asm.jobs}) == 3


def test_dependent_operations_are_not_merged_into_one_job_per_core():
    x = api.Feature.gemm("X", 0, 1, 64, "fp16")
    y = api.Feature.gemm("Y", 0, 1, 64, "fp16")
    z = api.Feature.gemm("Z", 0, 1, 64, "fp16")
    b = np.zeros((64, 64), np.float16)
    first, second = emit(api.Gemm(x, b, y, 1), OPTIONS), emit(api.Gemm(y, b, z, 1), OPTIONS)
    with pytest.raises(RegisterError, match="not independent"):
        assemble([first, second], independent=True)
