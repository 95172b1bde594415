"""Attention of one query row (a decode step) over the KV cache, for the
load-time plans (runtime/llm/prepared.py): the bits of kernels.attend (the
einsum formulation the interpreter runs), at the cost of its arithmetic.

kernels.attend's second einsum lays the values out afresh on every call (a
copy of the cache, 0.5 MB a layer for Gemma 3 at position 512), and its
softmax runs numpy reductions over a [P, G] layout whose inner loop is G
long (4): most of the call at long positions. Here each contraction is the
matmul the einsum ends in (numpy >= 2.4's bmm_einsum: the same operands in
the same layout, so BLAS sums in the same order), on views of the cache,
and the softmax's shift and normalisation are compiled loops
(runtime/llm/jit.py) doing numpy's float32 operations in numpy's order;
the exp stays numpy's (its SIMD exp is not libm's). tests/llm/test_attention.py
holds the equality over head sizes, groupings, key counts, windows and masks.
"""

from __future__ import annotations

import numpy as np

from rkc.runtime.llm import jit
from rkc.runtime.llm.kernels import attend


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
    hkv = keys.shape[1]
    g = heads // hkv
    qh = q.astype(np.float32).reshape(hkv, g, hd)
    if hkv == 1:  # the einsum's operands are matrices (2-D matmuls)
        s = np.matmul(keys[:, 0, :], qh[0].T)[None]  # [1, P, G]
    else:
        s = np.matmul(keys.transpose(1, 0, 2), qh.transpose(0, 2, 1))  # [Hkv, P, G]
    jit.scores_shift(s, np.float32(attrs["scale"]), np.asarray(kpos, np.int64), int(pos[0]), int(attrs["window"]))
    np.exp(s, out=s)
    if g == 1:  # the scores' P is innermost: numpy's pairwise sum
        s /= s.sum(axis=1, keepdims=True)
    else:
        jit.normalize_columns(s, s)
    if hkv == 1:
        out = np.matmul(values[:, 0, :].T, s[0])  # [hdv, G]
    else:
        out = np.matmul(values.transpose(1, 2, 0), s)  # [Hkv, hdv, G]
    full = np.zeros((rows, heads * values.shape[-1]), np.float32)
    full[0] = out.reshape(hkv, -1, g).transpose(0, 2, 1).reshape(-1)
    return full
