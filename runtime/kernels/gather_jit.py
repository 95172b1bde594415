"""Compiled (numba) 2-D gather of map positions: a nearest Resize of [N, C, H,
W] maps (a detector's upsampling), out[n, c, i, j] = x[n, c, rows[i], cols[j]],
channels the innermost loop (a feature map's atom lanes, contiguous: runtime/
feature_edges.py reads and writes its planes in place), output rows shared
by the host threads (runtime/llm/threads.py). Exact: values are copied.
On a feature map [C1, H, W, C2] itself (`gather_atoms`) each position's
16-byte atom moves as two 64-bit words, written straight into the output map.
`cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import eight_atoms, narrow_bits, narrow_value, widen_value
from rkc.runtime.kernels.threads import over_rows


@njit(cache=True, nogil=True, fastmath=False)
def _gather_2d(x, rows, cols, out, lo, hi):
    """x [N, H, W, C] -> out [N, len(rows), len(cols), C], output rows [lo, hi) of N * OH."""
    oh, ow, c = out.shape[1], out.shape[2], out.shape[3]
    for job in range(lo, hi):
        p, i = job // oh, job % oh
        src, dst = x[p, rows[i]], out[p, i]
        for j in range(ow):
            a, b = src[cols[j]], dst[j]
            for lane in range(c):
                b[lane] = a[lane]


def gather_2d(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """[N, C, H, W] (any strides) -> [N, C, len(rows), len(cols)], channels
    innermost in memory (the layout of a feature map's planes). fp16 is moved
    as its int16 bits (numba has no fp16)."""
    if x.dtype == np.float16:
        return gather_2d(x.view(np.int16), rows, cols).view(np.float16)
    out = np.empty((x.shape[0], len(rows), len(cols), x.shape[1]), x.dtype)
    args = (x.transpose(0, 2, 3, 1), rows.astype(np.int64), cols.astype(np.int64), out)
    over_rows(lambda lo, hi: _gather_2d(*args, lo, hi), out.shape[0] * out.shape[1], out.size)
    return out.transpose(0, 3, 1, 2)


@njit(cache=True, nogil=True, fastmath=False)
def _gather_atoms(x, rows, cols, out, lo, hi):
    """x [C1, H, W, 2] -> out [C1, len(rows), len(cols), 2] (64-bit words), output rows [lo, hi) of C1 * OH."""
    oh, ow = out.shape[1], out.shape[2]
    for job in range(lo, hi):
        p, i = job // oh, job % oh
        r = rows[i]
        for j in range(ow):
            c = cols[j]
            out[p, i, j, 0] = x[p, r, c, 0]
            out[p, i, j, 1] = x[p, r, c, 1]


def gather_atoms(fm: np.ndarray, rows: np.ndarray, cols: np.ndarray, out: np.ndarray) -> None:
    """out[a, i, j] = fm[a, rows[i], cols[j]] for feature maps of 16-byte atoms
    (fm [C1, H, W, C2], out [C1, len(rows), len(cols), C2], both C-contiguous)."""
    if not (fm.flags.c_contiguous and out.flags.c_contiguous) or fm.itemsize * fm.shape[3] != 16:
        raise ValueError("gather_atoms moves the 16-byte atoms of C-contiguous feature maps")
    words = fm.reshape(-1).view(np.uint64).reshape(*fm.shape[:3], 2)
    into = out.reshape(-1).view(np.uint64).reshape(*out.shape[:3], 2)
    args = (words, rows.astype(np.int64), cols.astype(np.int64), into)
    # the work is a copy of whole atoms: counted in atoms, a copy under a few MB stays on one thread
    over_rows(lambda lo, hi: _gather_atoms(*args, lo, hi), out.shape[0] * out.shape[1], into.size // 2)


@njit(cache=True, nogil=True, fastmath=False)
def move_elements(src, frm, out, into, scale):
    """out[into[i]] = src[frm[i]] (times `scale` where it is not 1, in float32): fp16
    elements as uint16 bits, a Relayout between NPU buffers (runtime/feature_edges.py)."""
    if scale == 1.0:
        for i in range(frm.shape[0]):
            out[into[i]] = src[frm[i]]
        return
    for i in range(frm.shape[0]):
        out[into[i]] = narrow_bits(np.float32(widen_value(src[frm[i]]) * scale).view(np.uint32))


@njit(cache=True, nogil=True, fastmath=False)
def strided_runs(into, frm):
    """The moves out[into[i]] = src[frm[i]] (into increasing) as runs [R, 4] of (first
    result position, first source position, length, source step): consecutive result
    positions whose sources are evenly spaced. A Relayout's moves are runs of whole
    rows (a Concat, a Reshape: step 1) or of atom lanes read across rows (a transpose:
    step = the source's row of atoms), so its map shrinks from two int32 per element
    to a few per run, and the move loop runs over contiguous or evenly strided memory."""
    n = into.shape[0]
    runs = np.empty((n, 4), np.int64)
    r, i = 0, 0
    while i < n:
        step = frm[i + 1] - frm[i] if i + 1 < n and into[i + 1] == into[i] + 1 else 1
        j = i + 1
        while j < n and into[j] == into[j - 1] + 1 and frm[j] - frm[j - 1] == step:
            j += 1
        runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3] = into[i], frm[i], j - i, step
        r += 1
        i = j
    return runs[:r].copy()


_LONG_RUN = 64  # elements: a run this long is copied through views (their making costs more on a short one)
_ATOM_LANES = 8  # fp16 elements of a 16-byte atom


@njit(cache=True, nogil=True, fastmath=False)
def move_runs(src, runs, out, scale):
    """out[o + k] = src[f + k * step] for k < length, each run (o, f, length, step) of
    `strided_runs` (times `scale` where it is not 1, in float32): move_elements by runs.
    A long run of step 1 is a loop over two contiguous views, others index with unsigned
    positions: either way no negative-index test per element, so the copy vectorises
    (a 100k-element run 110 -> 4 us)."""
    one = scale == 1.0
    for r in range(runs.shape[0]):
        o, f, length, step = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3]
        if step == 1 and length >= _LONG_RUN:
            a, b = src[f:f + length], out[o:o + length]
            if one:
                for k in range(length):
                    b[k] = a[k]
            else:
                for k in range(length):
                    b[k] = narrow_value(widen_value(a[k]) * scale)
            continue
        if length == _ATOM_LANES and step != 1:  # an atom's lanes read across rows (a transpose: YOLO11n's
            o, f, step = np.uint64(o), np.uint64(f), np.uint64(step)  # V and head products), a loop of constant
            for k in range(_ATOM_LANES):  # length, unrolled: 3200 runs 0.020 -> 0.015 ms (step 1 vectorises as is)
                v = src[f + np.uint64(k) * step]
                out[o + np.uint64(k)] = v if one else narrow_value(widen_value(v) * scale)
            continue
        for k in range(length):
            v = src[np.uint64(f + k * step)]
            out[np.uint64(o + k)] = v if one else narrow_value(widen_value(v) * scale)


@njit(cache=True, nogil=True, fastmath=False)
def eight_lane_blocks(runs):
    """(blocks [B, 4], the other runs [R, 4]) of `strided_runs`' runs: a block is eight runs of
    one length (a multiple of 8) and source step 8 whose sources are the eight lanes of the same
    atoms (first positions f, f + 1, ..., f + 7) and whose results lie `stride` apart (first
    positions o, o + stride, ...), kept as (o, f, length, stride): every eight atoms of it one
    8x8 transpose (`move_blocks`). YOLO11n's V^T gathers are such blocks (a head's 64 channels
    read across 400 positions into the GEMM's weights)."""
    n = runs.shape[0]
    blocks = np.empty((n // 8, 4), np.int64)
    rest = np.empty((n, 4), np.int64)
    nb, nr, r = 0, 0, 0
    while r < n:
        o, f, length, step = runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3]
        whole = step == _ATOM_LANES and length % _ATOM_LANES == 0 and r + _ATOM_LANES <= n
        if whole:
            stride = runs[r + 1, 0] - o
            for b in range(1, _ATOM_LANES):
                if runs[r + b, 0] != o + b * stride or runs[r + b, 1] != f + b or runs[r + b, 2] != length \
                        or runs[r + b, 3] != step:
                    whole = False
                    break
        if whole:
            blocks[nb, 0], blocks[nb, 1], blocks[nb, 2], blocks[nb, 3] = o, f, length, stride
            nb += 1
            r += _ATOM_LANES
            continue
        rest[nr] = runs[r]
        nr += 1
        r += 1
    return blocks[:nb].copy(), rest[:nr].copy()


@njit(cache=True, nogil=True, fastmath=False)
def move_blocks(src, blocks, out):
    """out[o + b * stride + k] = src[f + 8 k + b] for b < 8, k < length, each block (o, f, length,
    stride) of `eight_lane_blocks` (unscaled: fp16 bits moved as they are), eight atoms at a time
    by half.eight_atoms' shuffles. The caller keeps the blocks inside both arrays."""
    for r in range(blocks.shape[0]):
        o, f, length, stride = blocks[r, 0], blocks[r, 1], blocks[r, 2], blocks[r, 3]
        for k in range(0, length, _ATOM_LANES):
            eight_atoms(src, f + _ATOM_LANES * k, out, o + k, stride)
