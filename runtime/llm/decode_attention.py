"""Attention of one query row (a decode step) over the KV cache, in the
cache's storage layout (runtime/llm/kvcache.py: fp16 keys stored
transposed, [kv heads, head dim, positions], values [positions, kv heads,
head dim]): one compiled call that reads every key and value once, fp16
widened as it is read, and fuses the scores, the softmax and the weighted
sum. kernels.attend runs it for every one-row query, so the interpreter,
the plans and the CPU emulation share its bits.

The order of the sums is this kernel's, not BLAS's: a score sums its head
dimension in sequence (the keys' positions are the vectorised lanes), the
softmax's normaliser sums in float64, each output sums its keys in sequence
(the head dimension the lanes). tests/llm/test_attention.py bounds it
against a float64 attention, no looser than the einsum formulation it
replaced (numpy's bmm matmuls over a float32 cache: twice the bytes, and a
copy of the values' layout per call).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.llm.jit import widen

F32 = np.float32


@njit(cache=True, nogil=True)
def _attend(q, kt, lo, values, kpos, p0, window, scale, scores, acc, wide, out):
    """q [H, hd]; kt [Hkv, hd, N] (keys at lo..lo+P), values [P, Hkv, hdv],
    kpos [P]; work: scores [G, >= P] and acc [G, hdv] (float64), wide
    [4, >= max(P, hdv)] (float32); out [H * hdv]. Every sum is float64 in
    sequence (the products of float32 operands exact), rounded to float32
    once at the end; four terms are added per pass over an accumulator (the
    same order, a quarter of the loads and stores)."""
    hkv, hd = kt.shape[0], kt.shape[1]
    p_, hdv = values.shape[0], values.shape[2]
    g_ = q.shape[0] // hkv
    w0, w1, w2, w3 = wide[0], wide[1], wide[2], wide[3]
    for k in range(hkv):
        for g in range(g_):
            srow = scores[g]
            for p in range(p_):
                srow[p] = 0.0
        for d in range(0, hd, 4):  # each score sums its head dimension in sequence; the positions are the lanes
            n = min(4, hd - d)
            for j in range(n):
                krow, wj = kt[k, d + j][lo:], wide[j]  # (an offset index would defeat the vectoriser)
                for p in range(p_):
                    wj[p] = widen(krow[p])  # widened once for the group's heads
            for g in range(g_):
                h, srow = k * g_ + g, scores[g]
                if n == 4:
                    q0, q1 = np.float64(q[h, d]), np.float64(q[h, d + 1])
                    q2, q3 = np.float64(q[h, d + 2]), np.float64(q[h, d + 3])
                    for p in range(p_):
                        srow[p] = (((srow[p] + q0 * w0[p]) + q1 * w1[p]) + q2 * w2[p]) + q3 * w3[p]
                else:
                    for j in range(n):
                        qj, wj = np.float64(q[h, d + j]), wide[j]
                        for p in range(p_):
                            srow[p] += qj * wj[p]
        for g in range(g_):
            srow = scores[g]
            top = -np.inf
            for p in range(p_):
                seen = kpos[p] <= p0 and (window == 0 or p0 - kpos[p] < window)
                x = srow[p] * scale if seen else -np.inf
                srow[p] = x
                if x > top or x != x:  # a NaN stays the maximum, as in numpy's max
                    top = x
            total = 0.0
            for p in range(p_):
                e = np.exp(srow[p] - top)
                srow[p] = e
                total += e
            for p in range(p_):
                srow[p] = srow[p] / total
            arow = acc[g]
            for d in range(hdv):
                arow[d] = 0.0
        for p in range(0, p_, 4):  # each output sums its keys in sequence; the head dimension is the lanes
            n = min(4, p_ - p)
            for j in range(n):
                vrow, wj = values[p + j, k], wide[j]
                for d in range(hdv):
                    wj[d] = widen(vrow[d])
            for g in range(g_):
                arow, srow = acc[g], scores[g]
                if n == 4:
                    a0, a1, a2, a3 = srow[p], srow[p + 1], srow[p + 2], srow[p + 3]
                    for d in range(hdv):
                        arow[d] = (((arow[d] + a0 * w0[d]) + a1 * w1[d]) + a2 * w2[d]) + a3 * w3[d]
                else:
                    for j in range(n):
                        aj, wj = srow[p + j], wide[j]
                        for d in range(hdv):
                            arow[d] += aj * wj[d]
        for g in range(g_):
            base = (k * g_ + g) * hdv
            for d in range(hdv):
                out[base + d] = F32(acc[g, d])


class Workspace:
    """The buffers of one attention step's calls, made once (the fused
    attention stretch keeps one): scores grow with the keys seen, the output
    [rows, H * hdv] is reused (rows past the first stay zero)."""

    def __init__(self, heads: int, kv_heads: int, head_dim_v: int, rows: int) -> None:
        g = heads // kv_heads
        self.scores = np.empty((g, 0), np.float64)
        self.wide = np.empty((4, head_dim_v), F32)
        self.acc = np.empty((g, head_dim_v), np.float64)
        self.full = np.zeros((rows, heads * head_dim_v), F32)

    def grow(self, keys: int) -> None:
        if self.scores.shape[1] < keys:
            n = max(keys, 2 * self.scores.shape[1], 64)
            self.scores = np.empty((len(self.scores), n), np.float64)
            self.wide = np.empty((4, max(n, self.acc.shape[1])), F32)


def fits(q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray) -> bool:
    """Shapes the kernel indexes safely (numba does not check bounds): one
    query row [1, H, hd] over keys [P, Hkv, hd] and values [P, Hkv, hdv] of
    fp16 or float32, P > 0, H a multiple of Hkv; anything else is
    kernels.attend's einsum (its result or its numpy error)."""
    return (q.ndim == 3 and keys.ndim == 3 and values.ndim == 3 and q.shape[0] == 1 and np.ndim(pos) == 1
            and len(pos) == 1 and keys.shape[0] > 0 and keys.shape[1] > 0 and q.shape[1] % keys.shape[1] == 0
            and keys.shape[2] == q.shape[2] and values.shape[:2] == keys.shape[:2] and kpos.shape == keys.shape[:1]
            and keys.dtype in (np.float16, np.float32) and values.dtype in (np.float16, np.float32))


def _key_rows(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """The keys [P, Hkv, hd] as rows [Hkv, hd, N] (C order) and the first
    key's index in them: the cache's own storage when keys is its view
    (storage.transpose(2, 0, 1)[lo:hi]), else a copy in that layout."""
    base = keys.base
    if (isinstance(base, np.ndarray) and base.ndim == 3 and base.flags.c_contiguous and base.dtype == keys.dtype
            and base.shape[:2] == keys.shape[1:] and keys.strides == base.transpose(2, 0, 1).strides):
        lo, rest = divmod(keys.ctypes.data - base.ctypes.data, keys.strides[0])
        if rest == 0 and 0 <= lo and lo + len(keys) <= base.shape[2]:
            return base, lo
    return np.ascontiguousarray(keys.transpose(1, 2, 0)), 0


def _lanes(a: np.ndarray) -> np.ndarray:
    """fp16 as its bits (the kernel widens them), float32 as it is."""
    return a.view(np.uint16) if a.dtype == np.float16 else a


def attend_row(q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray,
               attrs: dict, rows: int, work: Workspace | None = None) -> np.ndarray:
    """Softmax attention of q [1, H, hd] over keys/values [P, Hkv, hd(v)] at
    kpos, causal (and windowed): [rows, H * hdv], rows past the first zero
    (work's buffer when given: valid until its next call). The shapes are
    `fits`'s."""
    heads, hkv, hdv = q.shape[1], keys.shape[1], values.shape[2]
    if work is None or work.acc.shape != (heads // hkv, hdv) or work.full.shape != (rows, heads * hdv):
        work = Workspace(heads, hkv, hdv, rows)  # (the kernel indexes its buffers unchecked)
    work.grow(len(keys))
    kt, lo = _key_rows(keys)
    qh = np.ascontiguousarray(q[0], F32)
    vals = _lanes(np.ascontiguousarray(values))
    kp = np.ascontiguousarray(kpos, np.int64)
    _attend(qh, _lanes(kt), lo, vals, kp, int(pos[0]), int(attrs["window"]), float(F32(attrs["scale"])),
            work.scores, work.acc, work.wide, work.full[0])
    return work.full
