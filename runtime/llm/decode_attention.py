"""Attention of one query row (a decode step) over the KV cache, for the
load-time plans (runtime/llm/prepared.py, fused.py): the bits of
kernels.attend (the einsum formulation the interpreter runs), at the cost of
its arithmetic.

kernels.attend's second einsum lays the values out afresh on every call (a
copy of the cache, 0.5 MB a layer for Gemma 3 at position 512), and its
softmax runs numpy reductions over a [P, G] layout whose inner loop is G
long (4): most of the call at long positions. Here each contraction is the
matmul the einsum ends in (numpy >= 2.4's bmm_einsum: the same operands in
the same layout, so BLAS sums in the same order), and the softmax's shift
and normalisation are compiled loops (runtime/llm/jit.py) doing numpy's
float32 operations in numpy's order; the exp stays numpy's (its SIMD exp is
not libm's). tests/llm/test_attention.py holds the equality over head
sizes, groupings, key counts, windows and masks.

`attend_row` reads fp32 views of the cache. `RowAttention` (a fused
attention stretch's, made at load) reads the cache's fp16 rows: at long
positions the call is mostly reading the cache from DRAM (fp32, 1 MB of K
and V a Gemma 3 layer at 512), and fp16 is half of it. The rows are widened
exactly (numpy's fp16 -> fp32) into one buffer shared by the layers, small
enough for the CPU's caches, laid out as the cache's fp32 rows (the same
strides), so the products are the same BLAS calls on the same values.
"""

from __future__ import annotations

import numpy as np

from rkc.runtime.half import widen_all
from rkc.runtime.llm import jit
from rkc.runtime.llm.kernels import attend

F32 = np.float32


def attend_row(q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray,
               attrs: dict, rows: int) -> np.ndarray:
    """kernels.attend for q [1, H, hd] over keys/values [P, Hkv, hd(v)] at
    kpos: [rows, H * hdv] (rows past the first zero). Other shapes go to
    kernels.attend (its result or its numpy error), and so do keys or values
    with a negative stride (the einsum copies those first; the cache's views
    have none)."""
    if (q.ndim != 3 or keys.ndim != 3 or values.ndim != 3 or q.shape[0] != 1 or len(pos) != 1
            or keys.shape[0] == 0 or keys.shape[1] == 0 or q.shape[1] % keys.shape[1]
            or keys.shape[2] != q.shape[2] or values.shape[:2] != keys.shape[:2] or kpos.shape != keys.shape[:1]
            or min(keys.strides + values.strides) < 0):
        return attend(q, keys, values, kpos, pos, attrs, rows)
    _, heads, hd = q.shape
    p, hkv = keys.shape[:2]
    g, hdv = heads // hkv, values.shape[2]
    full = np.zeros((rows, heads * hdv), F32)
    s = np.empty((hkv, p, g), F32)
    _scores(q.astype(F32).reshape(hkv, g, hd), keys, s)
    _softmax_and_values(s, values, np.asarray(kpos, np.int64), int(pos[0]), F32(attrs["scale"]),
                        int(attrs["window"]), np.empty((hkv, hdv, g), F32), full[0].reshape(hkv, g, hdv))
    return full


def _scores(qh: np.ndarray, keys: np.ndarray, s: np.ndarray) -> None:
    """s [Hkv, P, G] = the scores of qh [Hkv, G, hd] against keys [P, Hkv, hd],
    as the einsum's matmul gives them."""
    if qh.shape[0] == 1:  # the einsum's operands are matrices (2-D matmuls)
        np.matmul(keys[:, 0, :], qh[0].T, out=s[0])  # [P, G]
    else:
        np.matmul(keys.transpose(1, 0, 2), qh.transpose(0, 2, 1), out=s)  # [Hkv, P, G]


def _softmax_and_values(s, values, kpos, p0: int, scale, window: int, out, dst) -> None:
    """The softmax of scores s [Hkv, P, G] in place (scaled, masked for the
    query at p0), then its product with values [P, Hkv, hdv] into dst
    [Hkv, G, hdv]; out [Hkv, hdv, G]: the product's own layout (the einsum's)."""
    hkv, _, g = s.shape
    jit.scores_shift(s, scale, kpos, p0, window)
    np.exp(s, out=s)
    if g == 1:  # the scores' P is innermost: numpy's pairwise sum
        s /= s.sum(axis=1, keepdims=True)
    else:
        jit.normalize_columns(s, s)
    if hkv == 1:
        np.matmul(values[:, 0, :].T, s[0], out=out[0])  # [hdv, G]
    else:
        np.matmul(values.transpose(1, 2, 0), s, out=out)  # [Hkv, hdv, G]
    dst[...] = out.transpose(0, 2, 1)


class RowWork:
    """The widened rows and the scores of a one-row attention, shared by
    every layer of an engine's plans (their steps run one at a time); grown
    to the longest context seen."""

    def __init__(self) -> None:
        self.rows = np.empty(0, F32)
        self.scores = np.empty(0, F32)

    def buffers(self, n_rows: int, n_scores: int) -> tuple[np.ndarray, np.ndarray]:
        if self.rows.size < n_rows:
            self.rows = np.empty(max(n_rows, 2 * self.rows.size), F32)
        if self.scores.size < n_scores:
            self.scores = np.empty(max(n_scores, 2 * self.scores.size), F32)
        return self.rows, self.scores


class RowAttention:
    """One layer's one-row attention over the cache's fp16 rows (KVCache.store_half),
    for q [1, heads, hd] and keys/values [P, hkv, hd(v)]: [1, heads * hdv],
    the same bits as attend_row over the fp32 rows. Its output row is made
    once (valid until the next call)."""

    def __init__(self, heads: int, hkv: int, hd: int, hdv: int, scale: float, window: int, work: RowWork) -> None:
        self.hkv, self.g, self.hd, self.hdv = hkv, heads // hkv, hd, hdv
        self.scale, self.window, self.work = F32(scale), int(window), work
        self.full = np.zeros((1, heads * hdv), F32)
        self.dst = self.full[0].reshape(hkv, self.g, hdv)
        self.out = np.empty((hkv, hdv, self.g), F32)

    def __call__(self, q: np.ndarray, k16: np.ndarray, v16: np.ndarray, kpos: np.ndarray, p0: int) -> np.ndarray:
        p, hkv, g, hd, hdv = len(kpos), self.hkv, self.g, self.hd, self.hdv
        rows, scores = self.work.buffers(p * hkv * max(hd, hdv), hkv * p * g)
        s = scores[:hkv * p * g].reshape(hkv, p, g)
        widened = rows.view(np.uint32)
        keys = rows[:p * hkv * hd].reshape(p, hkv, hd)  # as the fp32 cache's rows: C order
        widen_all(k16.reshape(-1).view(np.uint16), widened)
        _scores(q.reshape(hkv, g, hd), keys, s)
        # the values into the same buffer, once the keys are read
        values = rows[:p * hkv * hdv].reshape(p, hkv, hdv)
        widen_all(v16.reshape(-1).view(np.uint16), widened)
        _softmax_and_values(s, values, kpos, p0, self.scale, self.window, self.out, self.dst)
        return self.full
