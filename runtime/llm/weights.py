"""Compiled weights as the runtime sees them: views into the rkbin's weight
blob, in the form the compiler chose for the precision.

* dense fp32 / fp16 (norm vectors, biases, fp16 matrices)
* int8 with one fp32 scale per output channel (row): W8A8. Its matmul quantizes
  the activations per token (row) to int8, accumulates in int32 and rescales —
  what the NPU's int8 GEMM + DPU requant computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.runtime.kernels.hadamard import Rotation, rotate, unrotate

# int8 products of K <= 1024 sum exactly in float32 (K * 127 * 127 < 2**24);
# longer rows are accumulated in float64 to stay exact like the NPU's int32.
_EXACT_F32_K = 1024


def quantize_rows(x: np.ndarray, rotation: Rotation | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: x R ~= q * scale[:, None] (R: the rotation, if
    any, applied first; runtime/kernels/hadamard.py)."""
    if rotation is not None:
        x = rotate(x, rotation)
    amax = np.abs(x).max(axis=-1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(x / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


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
        xq, xs = quantize_rows(x.astype(np.float32), self.rotation)
        acc = xq.astype(self._qt.dtype) @ self._qt  # exact int32 accumulation
        # rescaled (and the bias added) as DequantizeRows does after the NPU: float64, then fp32
        y = acc.astype(np.float64) * xs.astype(np.float64)[:, None] * self.scale.astype(np.float64)[None, :]
        if bias is not None:
            y += bias
        return y.astype(np.float32)
