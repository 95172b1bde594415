"""Multi-row (prefill) attention: the contraction kernels.attend's einsum
formulation runs (`contract`), and chunks of more than `BLOCK` rows in
blocks of query rows (`attend_blocks`); a shorter chunk's plans run
runtime/llm/chunk_attention.py.

In blocks, each block's scores and weighted values are BLAS products over
the keys the block can see, so what the causal mask (or a sliding window)
hides is neither computed nor materialised. A 512-token chunk at position 0
computes about half the products of the full [T, P] attention, and masks
only the diagonal blocks.

The arithmetic is the einsum formulation's (runtime/llm/kernels.attend),
element for element: each score is one float32 sgemm dot product over the
head dimension, scaled, masked, exponentiated after the row max, summed over
the keys in key order, divided; each output is an sgemm sum over the keys.
What changes is only which keys a product spans: a hidden key contributes an
exact zero to both sums, so a block's results equal the full product's
wherever sgemm adds its terms in the same order — but sgemm splits a long
sum (more keys than its K block) at places that depend on the sum's length,
and edge tiles of a product may group terms differently, so past a few
hundred keys a value can differ from the einsum's in its last bits.
tests/llm/test_attention.py bounds the difference against a float64
attention (no worse than the einsum's own error) and checks the bits where
the spans do not change.
"""

from __future__ import annotations

import numpy as np

try:  # what np.einsum(optimize=True) runs for a pair of operands (numpy >= 2.4; private, so checked below)
    from numpy._core.einsumfunc import bmm_einsum as _bmm_einsum
except ImportError:  # pragma: no cover - older numpy
    _bmm_einsum = None

F32 = np.float32

# The attention contractions as (einsum equation, the same with the operands swapped).
SCORES = ("tkgd,pkd->kgtp", "pkd,tkgd->kgtp")
VALUES = ("kgtp,pkd->tkgd", "pkd,kgtp->tkgd")


def _private_path_is_einsums() -> bool:
    """Whether numpy's private bmm_einsum still takes these arguments and gives
    np.einsum(optimize=True)'s bits for both contractions: a numpy that changed
    it falls back to np.einsum (the same bits, without the skipped path search)."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((3, 2, 2, 8), F32), rng.standard_normal((5, 2, 8), F32)
    s = rng.standard_normal((2, 2, 3, 5), F32)
    try:
        return all(np.array_equal(_bmm_einsum(swapped, b, a), np.einsum(eq, a, b, optimize=True))
                   for (eq, swapped), a, b in ((SCORES, q, k), (VALUES, s, k)))
    except Exception:  # pragma: no cover - a different private signature
        return False


if _bmm_einsum is not None and not _private_path_is_einsums():  # pragma: no cover
    _bmm_einsum = None

BLOCK = 64  # query rows per block: large enough for sgemm to run near its peak, small enough to skip half the keys


class Workspace:
    """Score buffers reused across calls (a 512-row chunk's block scores are
    ~0.5 MB: allocating them per block costs page faults). A plan's engine
    keeps one (runtime/llm/prepared.py: made at load, one per engine, whose
    steps run one at a time); without one a call makes its own."""

    def __init__(self) -> None:
        self.buf = np.empty(0, F32)

    def take(self, rows: int, cols: int) -> np.ndarray:
        n = rows * cols
        if self.buf.size < n:
            self.buf = np.empty(n, F32)
        return self.buf[:n].reshape(rows, cols)


def contract(eq: str, swapped: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.einsum(eq, a, b, optimize=True) without its path search (most of its
    cost at one row): for two operands the path is the one contraction, of
    (b, a) as `swapped` spells it, which numpy >= 2.4 runs as bmm_einsum
    (batched matmuls on operands it lays out itself); older numpy: einsum."""
    if _bmm_einsum is None:
        return np.einsum(eq, a, b, optimize=True)
    return _bmm_einsum(swapped, b, a)


def visible_span(kpos: np.ndarray, first: int, last: int, window: int) -> tuple[int, int]:
    """[lo, hi) of the keys (positions ascending) that some query at
    positions first..last can see: a query at p sees p - window < k <= p, so
    the span runs from the first key past first - window to the last key at
    or before last."""
    hi = int(np.searchsorted(kpos, last, side="right"))
    lo = int(np.searchsorted(kpos, first - window, side="right")) if window else 0
    return lo, max(lo, hi)


def attend_blocks(q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray,
                  scale: np.float32, window: int, out: np.ndarray, work: Workspace | None = None) -> None:
    """Softmax attention of q [T, H, hd] over keys/values [P, Hkv, hd] at
    kpos (ascending) into out [T, H * hd_v] (C order), causal and windowed,
    `BLOCK` query rows at a time (score buffers from `work`)."""
    work = Workspace() if work is None else work
    T, H, hd = q.shape
    Hkv, hd_v = keys.shape[1], values.shape[-1]
    G = H // Hkv
    qg = q.reshape(T, Hkv, G, hd)
    out4 = out.reshape(T, Hkv, G, hd_v)
    for t0 in range(0, T, BLOCK):
        t1 = min(T, t0 + BLOCK)
        pq = pos[t0:t1]
        lo, hi = visible_span(kpos, int(pq.min()), int(pq.max()), window)
        if hi == lo:  # no key visible: the full formulation's softmax of nothing but -inf
            out[t0:t1] = np.nan
            continue
        n = (t1 - t0) * G  # score columns: (query row, head of the group)
        kp = kpos[lo:hi]
        qcol = np.repeat(pq, G)  # each column's position
        allowed = None
        if (kp[-1] > qcol.min() or (window and qcol.max() - kp[0] >= window)):
            allowed = kp[:, None] <= qcol[None, :]
            if window:
                allowed &= (qcol[None, :] - kp[:, None]) < window
        for k in range(Hkv):
            qb = qg[t0:t1, k].reshape(n, hd)
            s = work.take(hi - lo, n)
            np.matmul(keys[lo:hi, k], qb.T, out=s)  # [keys, columns], as the einsum's product
            s *= scale
            if allowed is not None:
                np.copyto(s, -np.inf, where=~allowed)
            s -= s.max(axis=0, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=0, keepdims=True)
            o = np.matmul(values[lo:hi, k].T, s)  # [hd_v, columns]
            out4[t0:t1, k] = o.T.reshape(t1 - t0, G, hd_v)
