"""runtime/kernels/gather_jit.py's moves by runs (a Relayout between NPU buffers,
runtime/feature_edges.py): `strided_runs` of a sweep of move maps (contiguous
rows, a Concat of whole pieces, lanes read across rows as a transpose does, a
permutation with no runs, backward steps, runs of 1 and 63-65 elements around the
view threshold) covers every move exactly once, and `move_runs` writes what the
element moves write: bit for bit unscaled, and within fp16's rounding of a float64
product scaled. Eight-lane transposes among the runs (`eight_lane_blocks`: YOLO11n's V^T
gathers) moved by `move_blocks` write what their runs write, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.kernels.gather_jit import eight_lane_blocks, move_blocks, move_elements, move_runs, strided_runs


def _maps(name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(result positions increasing, source positions) of one kind of move."""
    if name == "rows":
        return np.arange(5000), np.arange(5000) + 123
    if name == "concat":  # two pieces, the second before the first in the source
        return np.arange(300), np.concatenate([np.arange(200) + 700, np.arange(100)])
    if name == "transpose":  # result [8, 40] from source [40, 8]: runs of 8 lanes, step 8
        return np.arange(320), np.arange(320).reshape(40, 8).T.reshape(-1)
    if name in ("weights", "weights_shifted"):  # channels of a [C1, 50, 8] map into groups of 16 positions
        first = 0 if name == "weights" else 3  # shifted: channels 3-26, two atoms' worth whole
        into, frm = [], []
        for g in range(0, 50, 16):
            for c in range(first, first + 24):
                p = np.arange(g, min(g + 16, 50))
                frm.append(((c // 8) * 50 + p) * 8 + c % 8)
        frm = np.concatenate(frm)
        return np.arange(frm.size), frm
    if name == "backward":
        return np.arange(100), 500 - 3 * np.arange(100)
    if name == "permutation":
        return np.arange(1000), rng.permutation(1000)
    if name == "around_views":  # runs of 63, 64 and 65 elements, gaps in the result
        lengths, into, frm, at = (63, 64, 65, 1, 64), [], [], 0
        for k, n in enumerate(lengths):
            into.append(at + np.arange(n))
            frm.append(2000 - 300 * k + np.arange(n))
            at += n + 3
        return np.concatenate(into), np.concatenate(frm)
    raise ValueError(name)


KINDS = ["rows", "concat", "transpose", "backward", "permutation", "around_views"]


@pytest.mark.parametrize("kind", KINDS)
def test_runs_cover_every_move_once(kind):
    into, frm = _maps(kind, np.random.default_rng(7))
    runs = strided_runs(into.astype(np.int64), frm.astype(np.int64))
    got_into = np.concatenate([o + np.arange(n) for o, _, n, _ in runs])
    got_frm = np.concatenate([f + s * np.arange(n) for _, f, n, s in runs])
    assert np.array_equal(got_into, into) and np.array_equal(got_frm, frm)
    assert (runs[:, 2] >= 1).all()
    if kind in ("rows", "backward"):
        assert len(runs) == 1
    if kind == "transpose":
        assert len(runs) == 8 and (runs[:, 3] == 8).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scale", [1.0, 0.17677669])
def test_moves_by_runs_are_the_element_moves(kind, scale):
    rng = np.random.default_rng(11)
    into, frm = _maps(kind, rng)
    src = (rng.standard_normal(int(frm.max()) + 1) * 4).astype(np.float16)
    runs = strided_runs(into.astype(np.int64), frm.astype(np.int64))
    size = int(into.max()) + 1
    want, got = np.full(size, 0x7E00, np.uint16), np.full(size, 0x7E00, np.uint16)  # NaN where nothing moves
    move_elements(src.view(np.uint16), frm.astype(np.int32), want, into.astype(np.int32), np.float32(scale))
    move_runs(src.view(np.uint16), runs, got, np.float32(scale))
    if scale == 1.0:
        assert np.array_equal(got, want)
        return
    assert np.array_equal(np.isnan(got.view(np.float16)), np.isnan(want.view(np.float16)))
    exact = src[frm].astype(np.float64) * scale
    # the float32 product rounded to fp16: half an fp16 ulp (2^-11 of the value) plus float32's 2^-24
    assert (np.abs(got.view(np.float16)[into].astype(np.float64) - exact) <= 2.0 ** -11 * np.abs(exact)
            + 2.0 ** -24 + 2.0 ** -25).all()


@pytest.mark.parametrize("kind", [*KINDS, "weights", "weights_shifted"])
def test_eight_lane_blocks_move_what_their_runs_move(kind):
    into, frm = _maps(kind, np.random.default_rng(13))
    runs = strided_runs(into.astype(np.int64), frm.astype(np.int64))
    blocks, rest = eight_lane_blocks(runs)
    covered = [o + s * b + np.arange(n) for o, _, n, s in blocks for b in range(8)] + [o + np.arange(n) for o, _, n, _ in rest]
    assert np.array_equal(np.sort(np.concatenate(covered)), into)
    if kind in ("transpose", "weights"):  # all of it but the weights' last group of 2 positions (24 runs)
        assert (len(blocks), len(rest)) == ((1, 0) if kind == "transpose" else (3 * 3, 24))
    if kind == "weights_shifted":  # channels 8-15 and 16-23 of each group are whole atoms; 3-7, 24-26 not
        assert len(blocks) == 2 * 3
    if kind in ("rows", "permutation"):
        assert len(blocks) == 0
    rng = np.random.default_rng(17)
    src = rng.integers(0, 1 << 16, int(frm.max()) + 1).astype(np.uint16)  # any bits (NaNs too): moved as they are
    size = int(into.max()) + 1  # (gaps in the result: around_views)
    want, got = np.zeros(size, np.uint16), np.zeros(size, np.uint16)
    move_elements(src, frm.astype(np.int32), want, into.astype(np.int32), np.float32(1.0))
    move_blocks(src, blocks, got)
    move_runs(src, rest, got, np.float32(1.0))
    assert np.array_equal(got, want)
