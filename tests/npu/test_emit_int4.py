"""The int4 GEMM (compiler/npu/gemm_int4.py) on the simulator against numpy: exact
int16 partials per K segment, over shape sweeps; and the simulator's int4 strictness (Q23)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rkc.compiler.npu import api, gemm_int4
from rkc.compiler.npu.dispatch import emit
from rkc.ir.errors import UnsupportedError
from rkc.runtime import sim
from rkc.runtime.sim.errors import QuirkRejection
from rkc.runtime.sim.quirks import Quirks
from npu_runner import run

SWEEP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _int4(shape, seed):
    return np.random.default_rng(seed).integers(-8, 8, shape).astype(np.int8)


def _gemm4(m, k, n, segment, seed, device=None, a=None, b=None, **opts):
    a = _int4((m, k), seed) if a is None else a
    b = _int4((k, n), seed + 1) if b is None else b
    op = api.GemmInt4(api.Feature.gemm("A", 0, m, k, "int4"), b, None, m, segment, "g4")
    c = api.Feature.gemm("C", 0, m, op.segments * op.n_padded, "int16")
    op = api.GemmInt4(op.a, b, c, m, segment, "g4")
    r = emit(op, api.EmitOptions(**opts))
    apad = np.zeros((api.gemm_rows(m), k), np.int8)
    apad[:m] = a
    out = run([r], device or sim.SimDevice(), {"A": (op.a, apad.T[:, :, None])}).feature(c)[:, :m, 0].T
    got = out.reshape(m, op.segments, op.n_padded)[:, :, :n]
    return a, b, got, r


@SWEEP
@given(m=st.integers(1, 40), k=st.integers(1, 700), n=st.integers(1, 200),
       segment=st.sampled_from([32, 64, 128, 256, 480]), seed=st.integers(0, 999))
def test_int4_gemm_partials_are_exact(m, k, n, segment, seed):
    a, b, got, _ = _gemm4(m, k, n, segment, seed)
    np.testing.assert_array_equal(got, gemm_int4.reference(a, b, segment))


@pytest.mark.parametrize("m,k,n,tile", [(4, 1152, 1024, 4096), (200, 256, 320, 128), (3, 64, 64, 4096),
                                        (1100, 96, 128, 4096)])
def test_int4_gemm_tiles_over_m_n_and_cores(m, k, n, tile):
    a, b, got, r = _gemm4(m, k, n, 256, 7, n_tile_max=tile)
    np.testing.assert_array_equal(got, gemm_int4.reference(a, b, 256))
    assert len(r.jobs) == min(3, len(r.tasks))


def test_the_extreme_segment_sum_fits_int16():
    """All -8 x -8 over the longest segment: 480 x 64 = 30720, exact."""
    k = gemm_int4.segment_limit()
    a = np.full((4, k), -8, np.int8)
    b = np.full((k, 64), -8, np.int8)
    _, _, got, _ = _gemm4(4, k, 64, k, 0, a=a, b=b)
    assert (got == 64 * k).all()


def test_segments_that_could_leave_int16_are_refused():
    b = np.full((1024, 64), -8, np.int8)
    op = api.GemmInt4(api.Feature.gemm("A", 0, 4, 1024, "int4"), b,
                      api.Feature.gemm("C", 0, 4, 2 * 64, "int16"), 4, 512, "g")  # 2 segments of 64
    with pytest.raises(UnsupportedError, match="past int16"):
        emit(op)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        emit(api.GemmInt4(op.a, b, op.c, 4, 100, "g"))
    with pytest.raises(UnsupportedError, match="outside int4"):
        emit(api.GemmInt4(op.a, np.full((1024, 64), 9, np.int8), api.Feature.gemm("C", 0, 4, 4 * 64, "int16"), 4,
                          256, "g"))


def test_weights_are_checked_once_where_they_are_packed():
    """A GEMM whose weights the pack cache holds (an LLM's later programs: the same name
    and bytes) is not checked again: the values were checked as they were packed."""
    rng = np.random.default_rng(3)
    b = rng.integers(-8, 8, (256, 64), dtype=np.int8)
    a, c = api.Feature.gemm("A", 0, 4, 256, "int4"), api.Feature.gemm("C", 0, 4, 64, "int16")
    options = dataclasses.replace(api.DEFAULT_OPTIONS, pack_cache={})
    first = emit(api.GemmInt4(a, b, c, 4, 256, "g"), options)
    with pytest.raises(UnsupportedError, match="outside int4"):  # uncached: checked
        emit(api.GemmInt4(a, np.full_like(b, 9), c, 4, 256, "h"), options)
    again = emit(api.GemmInt4(a, np.broadcast_to(np.int8(0), b.shape), c, 4, 256, "g"), options)  # a stand-in
    assert again.constants[0].data == first.constants[0].data


def test_the_simulator_refuses_an_int16_overflow_unless_told_the_reading():
    """A probe-only program (one task over K=1024, EmitOptions.int4_segment_max raised)
    overflows int16: strict by default (Q23); the readings a board may give are switches."""
    k = 1024
    a = np.full((4, k), -8, np.int8)
    b = np.full((k, 64), -8, np.int8)
    with pytest.raises(QuirkRejection, match="Q23"):
        _gemm4(4, k, 64, 1024, 0, a=a, b=b, int4_segment_max=1024)
    _, _, got, _ = _gemm4(4, k, 64, 1024, 0, a=a, b=b, int4_segment_max=1024,
                          device=sim.SimDevice(quirks=Quirks(int4_int16_overflow="saturate")))
    assert (got == 32767).all()
    _, _, got, _ = _gemm4(4, k, 64, 1024, 0, a=a, b=b, int4_segment_max=1024,
                          device=sim.SimDevice(quirks=Quirks(int4_int16_overflow="wrap")))
    assert (got == (64 * k + 32768) % 65536 - 32768).all()


@pytest.mark.parametrize("k,segment", [(1024, 1024), (2048, 1024), (1000, 640)])
def test_long_segments_run_when_the_weights_bound_every_partial(k, segment):
    """Weights of small magnitude (as rotated int4 weights are, mostly) let one task
    reduce more than 480 channels: the bound is checked, the sums stay exact."""
    rng = np.random.default_rng(k)
    b = np.clip(np.rint(rng.standard_normal((k, 128)) * 1.5), -3, 3).astype(np.int8)
    a = np.full((4, k), -8, np.int8)  # the worst activations
    assert gemm_int4.partial_bound(b, segment) <= 32767
    _, _, got, r = _gemm4(4, k, 128, segment, 0, a=a, b=b)
    np.testing.assert_array_equal(got, gemm_int4.reference(a, b, segment))
    assert len({t.label.split()[1] for t in r.tasks}) == -(-k // segment)  # one K group per segment


def _paired(k, n, group, seed, a=None, b=None, tokens=1, **opts):
    """Tokens' hi/lo rows [2T, K] in pair_rows' layout, two K groups per segment:
    the simulated partials unpaired to [2T, G, N]."""
    from rkc.runtime.llm.int4_rows import pair_rows, unpair_partials

    a = _int4((2 * tokens, k), seed) if a is None else a
    b = _int4((k, n), seed + 1) if b is None else b
    rows, m = pair_rows(a, group), 4 * tokens
    op = api.GemmInt4(api.Feature.gemm("A", 0, m, k, "int4"), b, None, m, 2 * group, "p4", row_split=group)
    c = api.Feature.gemm("C", 0, m, op.segments * op.n_padded, "int16")
    op = api.GemmInt4(op.a, b, c, m, 2 * group, "p4", row_split=group)
    r = emit(op, api.EmitOptions(**opts))
    out = run([r], sim.SimDevice(), {"A": (op.a, rows.T[:, :, None])}).feature(c)[:, :m, 0].T
    groups = -(-k // group)
    return a, b, unpair_partials(out, groups)[:, :, :n], r


@SWEEP
@given(k=st.integers(1, 40).map(lambda c: 32 * c), n=st.integers(1, 200),
       group=st.sampled_from([32, 64, 96, 256, 480]), tokens=st.sampled_from([1, 1, 3, 40]), seed=st.integers(0, 999))
def test_paired_rows_give_each_groups_exact_partials(k, n, group, tokens, seed):
    """Two K groups per task in the 4 rows one token's 2 nibble rows leave: every
    group's partials exact, as the unpaired GEMM's; half the tasks' segments."""
    a, b, got, r = _paired(k, n, group, seed, tokens=tokens)
    np.testing.assert_array_equal(got, gemm_int4.reference(a, b, group))
    assert len({t.label.split()[1] for t in r.tasks}) == -(-k // (2 * group))


def test_paired_rows_bound_each_group_not_the_segment():
    """All -8 x -8 over two groups of 480: each row sums one group (30720, exact),
    where one unpaired segment of 960 is refused (past int16) and the strict
    simulator would reject the sum (Q23)."""
    k = 2 * gemm_int4.segment_limit()
    a = np.full((2, k), -8, np.int8)
    b = np.full((k, 64), -8, np.int8)
    _, _, got, _ = _paired(k, 64, k // 2, 0, a=a, b=b)
    assert (got == 64 * k // 2).all()
    unpaired = api.GemmInt4(api.Feature.gemm("A", 0, 4, k, "int4"), b, api.Feature.gemm("C", 0, 4, 64, "int16"),
                            4, k, "g")
    with pytest.raises(UnsupportedError, match="past int16"):
        emit(unpaired)
    with pytest.raises(UnsupportedError, match="paired rows"):
        emit(api.GemmInt4(unpaired.a, b, unpaired.c, 4, k, "g", row_split=k // 4))


def test_a_placed_segment_computes_the_same_partials():
    """q/k/v-like products placed together over the cores (placement.place_segment_int4):
    only which core computes which channels changes."""
    from rkc.compiler.npu.placement import place_segment_int4

    shapes = [(640, 1024), (640, 256), (1024, 640)]
    ops, inputs, want = [], {}, {}
    for i, (k, n) in enumerate(shapes):
        a, b = _int4((2, k), 10 + i), _int4((k, n), 20 + i)
        op = api.GemmInt4(api.Feature.gemm(f"A{i}", 0, 2, k, "int4"), b, None, 2, 320, f"p{i}")
        op = api.GemmInt4(op.a, b, api.Feature.gemm(f"C{i}", 0, 2, op.segments * op.n_padded, "int16"), 2, 320,
                          f"p{i}")
        apad = np.zeros((4, k), np.int8)
        apad[:2] = a
        ops.append(op)
        inputs[f"A{i}"] = (op.a, apad.T[:, :, None])
        want[i] = gemm_int4.reference(a, b, 320)
    placed = place_segment_int4(ops, api.DEFAULT_OPTIONS)
    assert all(op.placement is not None for op in placed)
    results = [emit(op) for op in placed]
    got = run(results, sim.SimDevice(), inputs, independent=True)
    for i, op in enumerate(placed):
        out = got.feature(op.c)[:, :2, 0].T.reshape(2, op.segments, op.n_padded)[:, :, :op.n]
        np.testing.assert_array_equal(out, want[i])
    assert {lane for r in results for j in r.jobs for lane in [j.lane]} == {0, 1, 2}


def test_int4_modelled_time_counts_2048_macs_per_cycle():
    _, _, _, r = _gemm4(64, 256, 256, 256, 3)
    assert all(t.counters.mac_dtype == "int4" for t in r.tasks)


def test_int4_weight_bytes_follow_the_documented_formula():
    """hw-matmul.md 2.1: B as (N/64, K/32, 64, 32) nibbles, low nibble first; checked
    element by element against the index formula, with K >= 2 groups (the K=32 trap)."""
    from rkc.ir.npu import layout

    k, n = 96, 128
    w = _int4((n, k), 5)
    raw = layout.pack_weights_int4(w)
    for kk in range(k):
        for nn in range(0, n, 7):
            nib = (nn // 64) * 64 * k + (kk // 32) * 64 * 32 + (nn % 64) * 32 + kk % 32
            byte = int(raw[nib // 2])
            v = (byte >> 4) if nib % 2 else (byte & 0xF)
            assert (v ^ 8) - 8 == w[nn, kk]
    a = _int4((8, 64), 6)
    fa = layout.pack_gemm_a_int4(a).reshape(-1)
    for m in range(8):
        for kk in range(64):
            nib = (kk // 32) * 8 * 32 + m * 32 + kk % 32
            v = (int(fa[nib // 2]) >> 4) if nib % 2 else (int(fa[nib // 2]) & 0xF)
            assert (v ^ 8) - 8 == a[m, kk]


@pytest.mark.parametrize("k,n,segment,columns", [(1024, 64, 512, 16384), (1000, 130, 640, 48), (96, 3, 32, 2)])
def test_partial_bound_is_8_x_the_largest_segment_column_sum(k, n, segment, columns):
    rng = np.random.default_rng(k + n)
    b = rng.integers(-8, 8, (n, k), dtype=np.int8).T  # [K, N] as the LLM hands it: a transposed view
    b[:segment, 0] = -8  # the extreme column of the first segment
    want = max(int(np.abs(b[k0:k0 + segment].astype(np.int64)).sum(axis=0).max()) for k0 in range(0, k, segment))
    assert gemm_int4.partial_bound(b, segment, columns) == 8 * want
