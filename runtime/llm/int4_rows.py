"""The CPU steps around an int4 product (W4A8 by nibble rows; compiler/llm/int4.py
quantizes the weights, compiler/npu/gemm_int4.py emits the NPU side).

Activations: int8 per token in [-119, 119], each row written as two signed
nibble rows a = 16 hi + lo (hi, lo in [-8, 7]; lo = ((a + 8) mod 16) - 8), the hi
row of token m at 2m, its lo row at 2m + 1: two rows of one int4 GEMM, so the
weights are read once. The NPU writes one exact int16 partial per K group; the
combine is y[m, n] = s_a[m] sum_g s_w[g, n] (16 P_hi[m, g, n] + P_lo[m, g, n]) (+ bias)
in float32 (each group's integer sum is exact in float32; the float64 sum differs by
float32 rounding only, tests/llm/test_int4.py).
"""

from __future__ import annotations

import numpy as np

from rkc.ir.npu import layout
from rkc.runtime.kernels.hadamard import Rotation, rotate
from rkc.runtime.llm.weights import symmetric_rows

ACT_LIMIT = 119  # |a| <= 119: hi = (a - lo) / 16 stays within [-8, 7]


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: int8 values in [-119, 119] and the row scale (max|x| / 119)."""
    return symmetric_rows(np.asarray(x, np.float32), ACT_LIMIT)


def split_nibbles(q: np.ndarray) -> np.ndarray:
    """int8 rows [M, K] in [-119, 119] -> [2M, K] int4 rows (hi of row m at 2m, lo at 2m + 1)."""
    q = np.asarray(q, np.int16)
    lo = ((q + 8) & 15) - 8
    hi = (q - lo) >> 4
    out = np.empty((2 * q.shape[0], q.shape[1]), np.int8)
    out[0::2], out[1::2] = hi, lo
    return out


def npu_rows(x: np.ndarray, rotation: Rotation | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Float rows [M, K] (rotated first if a rotation is given) -> int4 rows [2M, K] and row scales [M]."""
    x = np.asarray(x, np.float32)
    if rotation is not None:
        x = rotate(x, rotation)
    q, s = quantize_activations(x)
    return split_nibbles(q), s


def pair_rows(rows: np.ndarray, group: int) -> np.ndarray:
    """Nibble rows [2M, K] -> [4M, K] with two K groups per NPU segment
    (GemmInt4.row_split): token m's group g of `group` channels in rows
    4m + 2 (g % 2) and 4m + 2 (g % 2) + 1, zeros in the other two. One token's
    2 rows fill the 4 the NPU reads anyway, so its partials carry no padding."""
    m2, k = rows.shape
    out = np.zeros((2 * m2, k), rows.dtype)
    for k0 in range(0, k, group):
        r = 2 * (k0 // group % 2)
        out[r::4, k0:k0 + group] = rows[0::2, k0:k0 + group]
        out[r + 1::4, k0:k0 + group] = rows[1::2, k0:k0 + group]
    return out


def unpair_partials(partials: np.ndarray, groups: int) -> np.ndarray:
    """Paired partials [4M, P * Np] (pair_rows' product) -> [2M, G, Np]: token m's
    group 2p + h hi and lo sums are rows 4m + 2h, 4m + 2h + 1 of block p."""
    p = np.asarray(partials)
    blocks = -(-groups // 2)
    m = p.shape[0] // 4
    p = p.reshape(m, 2, 2, blocks, p.shape[1] // blocks)  # [token, h, nibble row, block, Np]
    return p.transpose(0, 2, 3, 1, 4).reshape(2 * m, 2 * blocks, -1)[:, :groups]


def packed_rows(rows: np.ndarray) -> np.ndarray:
    """int4 rows [R, K] (K % 32 == 0) -> [R, K / 2] bytes as int8: as an int8 GEMM
    operand of K / 2 columns these are the int4 operand's native bytes (a 16-byte
    atom holds 16 int8 or 32 int4 channels, the even one in the low nibble)."""
    return layout.pack_nibbles(rows).view(np.int8)


def combine(partials: np.ndarray, row_scales: np.ndarray, scales: np.ndarray,
            bias: np.ndarray | None = None, paired: bool = False) -> np.ndarray:
    """int16 partials [2M, G, N] (or [2M, G * Np] with N = scales' columns; `paired`:
    [4M, ceil(G / 2) * Np], unpair_partials) -> float32 [M, N];
    `scales` [G, N] are the weight group scales."""
    g, n = scales.shape
    p = np.asarray(partials)
    if paired:
        p = unpair_partials(p, g)[:, :, :n]
    elif p.ndim == 2:
        p = p.reshape(p.shape[0], g, -1)[:, :, :n]
    y = np.zeros((p.shape[0] // 2, n), np.float32)
    for k in range(g):  # per group: the int8 activations' sum (|16 hi + lo| < 2^20: exact in float32), scaled
        merged = p[0::2, k].astype(np.float32)
        merged *= 16
        merged += p[1::2, k]
        merged *= scales[k]
        y += merged
    y *= np.asarray(row_scales, np.float32)[:, None]
    if bias is not None:
        y += bias
    return y
