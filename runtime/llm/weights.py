"""Compiled weights as the runtime sees them: views into the rkbin's weight
blob, in the form the compiler chose for the precision.

* dense fp32 / fp16 (norm vectors, biases, fp16 matrices)
* int8 with one fp32 scale per output channel (row): W8A8. Its matmul quantizes
  the activations per token (row) to int8, accumulates in int32 and rescales —
  what the NPU's int8 GEMM + DPU requant computes.

An activation row may be quantized in `terms` int8 rows (two: x R ~ s1 q1 +
s2 q2, q2 the int8 residual x R - s1 q1): the terms run as more rows of the
same int8 product (one read of the weights) and are summed when rescaled, so
the activation has ~15 bits while every product stays int8 x int8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.runtime.kernels.hadamard import Rotation, rotate, unrotate

# int8 products of K <= 1024 sum exactly in float32 (K * 127 * 127 < 2**24);
# longer rows are accumulated in float64 to stay exact like the NPU's int32.
_EXACT_F32_K = 1024


def quantize_rows(x: np.ndarray, rotation: Rotation | None = None, terms: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: x R ~= q * scale[:, None] (R: the rotation, if
    any, applied first; runtime/kernels/hadamard.py). With terms T > 1 the
    rows [T * M, K] are T blocks of M: block t quantizes what blocks < t left
    (x R ~= sum_t q_t * scale_t), residuals in float32."""
    if rotation is not None:
        x = rotate(x, rotation)
    qs, scales = [], []
    for t in range(terms):
        q, scale = symmetric_rows(x)
        qs.append(q)
        scales.append(scale)
        if t + 1 < terms:
            x = x - q.astype(np.float32) * scale[:, None]
    return (qs[0], scales[0]) if terms == 1 else (np.concatenate(qs), np.concatenate(scales))


def symmetric_rows(x: np.ndarray, limit: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Per row: int8 codes in [-limit, limit] and the row scale max|x| / limit (1 for a zero row)."""
    amax = np.abs(x).max(axis=-1)
    scale = np.where(amax > 0, amax / float(limit), 1.0).astype(np.float32)
    q = np.clip(np.rint(x / scale[:, None]), -limit, limit).astype(np.int8)
    return q, scale


def dequantize(acc: np.ndarray, row_scale: np.ndarray, ch_scale: np.ndarray, bias: np.ndarray | None = None,
               terms: int = 1) -> np.ndarray:
    """int32 sums [T * M, N] of T activation terms (quantize_rows) -> fp32 [M, N]:
    each term's sums x its row scale x the channel scale, the terms added (and
    the bias) in float64, rounded once to fp32 — what DequantizeRows computes."""
    ch = ch_scale.astype(np.float64)[None, :]
    rs = row_scale.astype(np.float64)
    if terms == 1:  # (mismatched shapes: numpy's broadcasting error)
        y = acc.astype(np.float64) * rs[:, None] * ch
    else:
        if acc.shape[0] % terms or rs.shape != acc.shape[:1]:
            raise ValueError(f"{acc.shape[0]} rows of sums and {rs.shape[0]} row scales are not {terms} terms a row")
        m = acc.shape[0] // terms
        y = acc[:m].astype(np.float64) * rs[:m, None] * ch
        for t in range(1, terms):
            y += acc[t * m:(t + 1) * m].astype(np.float64) * rs[t * m:(t + 1) * m, None] * ch
    if bias is not None:
        y += bias
    return y.astype(np.float32)


@dataclass
class Weight:
    """A dense tensor (fp32 or fp16 storage)."""

    data: np.ndarray

    def __post_init__(self) -> None:
        self._f32 = self.data.astype(np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def dense(self) -> np.ndarray:
        return self._f32

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self._f32[ids]

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x @ W.T; fp16 weights compute as the NPU's fp16 GEMM: fp16 activations
        in, fp32 sums, fp16 out."""
        if self.data.dtype == np.float16:
            x = x.astype(np.float16).astype(np.float32)
            return (x @ self._f32.T).astype(np.float16).astype(np.float32)
        return x.astype(np.float32) @ self._f32.T


@dataclass
class Int8Weight:
    q: np.ndarray  # int8 [N, K]
    scale: np.ndarray  # fp32 [N]
    # the weight's input axis is rotated (q ~ W R): activations are rotated
    # before they are quantized, rows read back are rotated back
    rotation: Rotation | None = None
    act_terms: int = 1  # int8 rows per activation row (quantize_rows' terms)

    def __post_init__(self) -> None:
        wide = np.float32 if self.q.shape[1] <= _EXACT_F32_K else np.float64
        self._qt = np.ascontiguousarray(self.q.T.astype(wide))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.q.shape

    def dense(self) -> np.ndarray:
        return self._unrotated(self.q.astype(np.float32) * self.scale[:, None])

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self._unrotated(self.q[ids].astype(np.float32) * self.scale[ids][:, None])

    def _unrotated(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.rotation is None else unrotate(rows, self.rotation)

    def matmul(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        xq, xs = quantize_rows(x.astype(np.float32), self.rotation, self.act_terms)
        acc = xq.astype(self._qt.dtype) @ self._qt  # exact int32 accumulation
        # rescaled (and the bias added) as DequantizeRows does after the NPU
        return dequantize(acc, xs, self.scale, bias, self.act_terms)


@dataclass
class ByRows:
    """A weight the programs read in two forms (compiler/llm/prefill_fp16.py): a
    one-row input (decode) through `one`, more rows (prefill, score) through
    `many`, as the CPU emulation of an int8 build whose multi-row programs read
    an fp16 copy of the FFN weights."""

    one: "Int8Weight | Weight"
    many: "Int8Weight | Weight"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.one.shape

    def dense(self) -> np.ndarray:
        return self.one.dense()

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.one.rows(ids)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return (self.one if x.shape[0] == 1 else self.many).matmul(x)
