"""Attention of a short prefill chunk (2 to prefill_attention.BLOCK query
rows: a chat's next turn) over the KV cache, for the load-time plans
(runtime/llm/prepared.py): the bits of kernels.attend (the einsum
formulation the interpreter runs), at a fraction of its cost.

Its two contractions stay the ones np.einsum(optimize=True) runs
(prefill_attention.contract: numpy's bmm_einsum, the same operands in the
same layout, so BLAS sums in the same order). Between them numpy ran seven
passes over the scores [Hkv, P, T x G] (scale, mask, max, shift, exp, sum,
divide), each reducing or broadcasting along P, which is not their innermost
axis: 1.6 ms a layer for 21 rows over 468 keys (the tiny qwen3, one BLAS
thread), 4.8 ms for 60 rows over 444, ten times the two products. Here the
scale, mask, max and shift are one compiled pass (jit.scores_shift_columns,
decode's too), the exp stays numpy's (its SIMD exp is not libm's), and the
sums and division are jit.normalize_columns (adding in sequence over P, as
numpy reduces an axis that is not innermost).
tests/llm/test_attention.py holds the equality over head sizes, groupings,
chunk sizes, cached histories and windows.

Not for one query head per key head (G = 1): there numpy's mask lays the
scores out with P innermost and sums them pairwise; those chunks keep
kernels.attend.
"""

from __future__ import annotations

import numpy as np
from rkc.runtime.llm.jit import normalize_columns, scores_shift_columns
from rkc.runtime.llm.prefill_attention import SCORES, VALUES, contract

F32 = np.float32


def attend_rows(q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray,
                scale: np.float32, window: int, rows: int) -> np.ndarray | None:
    """kernels.attend's einsum formulation for q [T, H, hd] (T >= 2) over
    keys/values [P, Hkv, hd(v)] at kpos, its softmax compiled: [rows, H * hdv]
    (rows past T zero). None where kernels.attend would sum the softmax in
    another order: one query head per key head (its mask's output puts P
    innermost: pairwise sums), or scores that do not come out of the first
    contraction as [Hkv, P, T x G] in memory; the caller runs kernels.attend."""
    T, H, hd = q.shape
    Hkv = keys.shape[1]
    if T < 2 or keys.ndim != 3 or H % Hkv or H == Hkv or kpos.shape != keys.shape[:1]:
        return None
    G = H // Hkv
    qg = q.astype(F32, order="C").reshape(T, Hkv, G, hd)  # as kernels.attend's operand
    s = contract(*SCORES, qg, keys)
    mem = s.transpose(0, 3, 2, 1)  # [Hkv, P, T, G]: the matmul's own layout
    if s.dtype != F32 or not mem.flags.c_contiguous:
        return None
    flat = mem.reshape(Hkv, len(kpos), T * G)
    query_pos = np.repeat(np.asarray(pos, np.int64), G)
    scores_shift_columns(flat, F32(scale), np.asarray(kpos, np.int64), query_pos, int(window))
    np.exp(flat, out=flat)
    normalize_columns(flat, flat)
    out = contract(*VALUES, s, values)  # s: the probabilities, in their layout
    full = np.zeros((rows, H * values.shape[-1]), F32)
    full[:T] = out.reshape(T, H * values.shape[-1])
    return full
