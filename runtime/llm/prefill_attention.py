"""Multi-row (prefill) attention: chunks of two rows or more in blocks of
query rows (`attend_blocks`), and the contraction kernels.attend's einsum
formulation runs for other cases (`contract`).

In blocks, each (block, key head)'s scores and weighted values are BLAS
products over the keys the block can see, so what the causal mask (or a sliding window)
hides is neither computed nor materialised. A 512-token chunk at position 0
computes about half the products of the full [T, P] attention, and masks
only the diagonal blocks. Between the two products the softmax is one
compiled float32 kernel (prefill_kernels.softmax_columns), and the (block,
head) pairs are shared among threads (runtime/llm/threads.py). Not the einsum's bits (issue 37
dropped that rule): tests/llm/test_attention.py bounds the error against a
float64 attention."""

from __future__ import annotations

import threading

import numpy as np

from rkc.runtime.llm.prefill_kernels import softmax_columns
from rkc.runtime.llm.threads import THREADS, each

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
        self.queries = np.empty(0, F32)

    def take(self, rows: int, cols: int) -> np.ndarray:
        n = rows * cols
        if self.buf.size < n:
            self.buf = np.empty(n, F32)
        return self.buf[:n].reshape(rows, cols)

    def take_queries(self, rows: int, cols: int) -> np.ndarray:
        """A second buffer, for a job's gathered queries."""
        n = rows * cols
        if self.queries.size < n:
            self.queries = np.empty(n, F32)
        return self.queries[:n].reshape(rows, cols)


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
    in blocks of at most `BLOCK` query rows, as equal as they come. A job is a block's query heads of one key
    head, or a share of them (`_head_shares`: enough jobs for the threads):
    its queries gathered as the columns of one [hd, heads x rows] matrix (a
    copy of whole runs of rows, in either layout q comes in: an NPU output's,
    tokens innermost, or rows), the scores one sgemm over the keys the block
    can see, the compiled softmax (prefill_kernels.softmax_columns: scale,
    mask, max, exp, sum and division in float32, one pass each over
    contiguous rows), then each head's values product written into its rows
    of out in place. The jobs are shared among the host threads (BLAS and
    the compiled softmax release the GIL). `work`: kept for the callers'
    API (each thread keeps its own buffers)."""
    T, H, hd = q.shape
    Hkv, hd_v = keys.shape[1], values.shape[-1]
    G = H // Hkv
    kp64, pos64 = np.asarray(kpos, np.int64), np.asarray(pos, np.int64)
    blocks = []
    cuts = -(-T // BLOCK)  # blocks of equal rows, none over BLOCK: 72 rows as 36 + 36, not 64 + 8 (a block of
    bounds = [T * i // cuts for i in range(cuts + 1)]  # 8 rows runs its products far below sgemm's peak)
    for t0, t1 in zip(bounds[:-1], bounds[1:]):
        pq = pos64[t0:t1]
        lo, hi = visible_span(kp64, int(pq.min()), int(pq.max()), window)
        if hi == lo:  # no key visible: the full formulation's softmax of nothing but -inf
            out[t0:t1] = np.nan
            continue
        blocks.append((t0, t1, lo, hi, pq))
    per = G // _head_shares(len(blocks) * Hkv, G)
    jobs = [(t0, t1, lo, hi, pq, h0) for t0, t1, lo, hi, pq in blocks for h0 in range(0, H, per)]
    matmul, softmax, tile = np.matmul, softmax_columns, np.tile

    def run(job) -> None:
        t0, t1, lo, hi, pq, h0 = job
        k, n = h0 // G, t1 - t0
        w = _thread_work()
        qm = w.take_queries(hd, per * n)
        qm.reshape(hd, per, n)[...] = q[t0:t1, h0:h0 + per].transpose(2, 1, 0)  # [hd, (head, row)]
        s = w.take(hi - lo, per * n)
        matmul(keys[lo:hi, k], qm, out=s)  # [keys, (head, row)]
        softmax(s, F32(scale), kp64[lo:hi], tile(pq, per), int(window))
        for j in range(per):
            h = h0 + j
            matmul(s[:, j * n:(j + 1) * n].T, values[lo:hi, k], out=out[t0:t1, h * hd_v:(h + 1) * hd_v])
    each(run, jobs)


def _head_shares(jobs: int, group: int) -> int:
    """Into how many shares each (block, key head)'s query heads are cut:
    halved until every thread has a job (one product over all of a group's
    heads costs less CPU than one per head: 215 against 262 us for a Gemma 3
    270M layer's 32 rows over 192 keys, one thread)."""
    shares = 1
    while jobs * shares < THREADS and group % (2 * shares) == 0:
        shares *= 2
    return shares


_local = threading.local()


def _thread_work() -> Workspace:
    w = getattr(_local, "work", None)
    if w is None:
        w = _local.work = Workspace()
    return w
