"""4-bit weights for the NPU's int4 GEMM (W4A8 by nibble rows), and the CPU side of it.

Weights: symmetric int4 per group of `group` input channels (K) and output
channel, scale chosen per group from a few clip ratios by least squares (as
llama.cpp's Q4_0 maps a group's largest magnitude to -8, but searched); the
weights then rounded to nearest, or by GPTQ on the input's X^T X with those
scales (`hessian`). The
NPU has no mixed int4 x int8 MAC (hw-matmul.md 0), so the activation side is
int8 per token in [-119, 119] written as two signed nibble rows, a = 16 hi + lo
with hi, lo in [-8, 7] (lo = ((a + 8) mod 16) - 8): the hi and lo rows are two rows
of one int4 GEMM, so the weights are read once, and in decode (M = 1, padded to 4
rows anyway) the second row is free. The NPU writes one int16 partial per K
group (compiler/npu/gemm_int4.py: a group of at most 480 keeps every partial
exact); the CPU combines

    y[m, n] = s_a[m] * sum_g s_w[g, n] * (16 P_hi[m, g, n] + P_lo[m, g, n])  (+ bias)

`npu_rows` / `combine` (runtime/llm/int4_rows.py) are the two CPU steps around the NPU; `emulate` is the
whole product in numpy (the NPU's integer partials computed exactly), which the
simulator's result equals (tests/llm/test_int4.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from rkc.compiler.llm.step_clock import STEPS
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout
from rkc.runtime.llm.int4_rows import ACT_LIMIT, combine, npu_rows, quantize_activations, split_nibbles  # noqa: F401

DEFAULT_GROUP = 256  # K per weight group = per NPU K segment (api.INT4_SEGMENT)
# candidate group maxima, as fractions of the largest |w|: 1.0 down to 0.6 by 0.05
# (Gemma 3 270M's GPTQ output error on held-out text ~1.5 % below the grid 1.0..0.8;
# the search is most of a round-to-nearest compile's quantize time: no finer steps;
# docs/notes/2026-12-06-int4-quality-7b.md)
CLIP_RATIOS = tuple(float(r) for r in np.linspace(1.0, 0.6, 9))
# GPTQ's damping for int4, of the mean diagonal of X^T X. The calibration text is
# ~1600 tokens, fewer than a 2048-wide input has dimensions: the paper's 1 %
# fits the text (Gemma 3 270M: output error 0.05 of RTN's 0.16 on it) and
# barely helps elsewhere (0.160 against RTN's 0.169 on held-out text); 0.5
# trades the fit for held-out error 0.124 (0.3: 0.127, 1.0: 0.124, 3.0: 0.128)
GPTQ_DAMP = 0.5


@dataclass
class Int4Weight:
    """W[N, K] ~ q[n, k] * scales[k // group, n]."""

    data: np.ndarray  # [N, K] int8 in [-8, 7]
    scales: np.ndarray  # [G, N] float32
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape

    def dequantized(self) -> np.ndarray:
        n, k = self.data.shape
        s = np.repeat(self.scales.T, self.group, axis=1)[:, :k]
        return self.data.astype(np.float32) * s

    def nbytes(self) -> int:
        """Bytes a product reads per token: the nibbles and the group scales."""
        n, k = self.data.shape
        return n * layout.align(k, layout.INT4_C2) // 2 + self.scales.nbytes


# weights a quantize_weight pass holds at once (its float32 temporaries are this size):
# rows are rounded independently, and a 7B model's ffn_down whole is 68 M weights
ROUND_ELEMENTS = 1 << 24
_INT4_MIN, _INT4_MAX = layout.INT4_MIN, layout.INT4_MAX  # (module constants: the compiled search reads them)


def quantize_weight(w: np.ndarray, group: int = DEFAULT_GROUP, hessian: np.ndarray | None = None) -> Int4Weight:
    """Symmetric int4 per (group of K, output channel): for each group the scale of
    the clip ratio (CLIP_RATIOS) with the least squared error, its largest
    magnitude mapped to -8 (the wider side of [-8, 7]) or clipped to 7; rounded
    to nearest, or by GPTQ on the input's X^T X (`hessian`) with those scales.
    In blocks of rows (ROUND_ELEMENTS)."""
    w = np.asarray(w, np.float32)
    n, k = w.shape
    if group % layout.CHANNEL_GROUP or group <= 0:
        raise UnsupportedError(f"int4 group {group} must be a positive multiple of 32")
    g = -(-k // group)
    data = np.empty((n, k), np.int8)
    scales = np.empty((g, n), np.float32)
    step = max(1, ROUND_ELEMENTS // (g * group))
    for r0 in range(0, n, step):
        q, s = _quantize_rows(w[r0:r0 + step], group, hessian)
        data[r0:r0 + len(q)] = q
        scales[:, r0:r0 + len(q)] = s.T
    return Int4Weight(data, scales, group)


def _quantize_rows(w: np.ndarray, group: int, hessian: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """quantize_weight of a block of rows: (int4 values [rows, K], scales [rows, G])."""
    w = np.ascontiguousarray(w, np.float32)
    q = np.empty(w.shape, np.int8)
    best_s = np.empty((w.shape[0], -(-w.shape[1] // group)), np.float32)
    with STEPS.step("int4 clip search"):
        _clip_search(w, group, np.asarray(CLIP_RATIOS, np.float32), q, best_s)
    if hessian is not None:  # GPTQ rounding on the input's X^T X, the group scales kept (compiler/llm/quantize.py)
        from rkc.compiler.llm.quantize import gptq

        per_weight = np.repeat(best_s, group, axis=1)[:, :w.shape[1]]
        return gptq(w, hessian, per_weight, GPTQ_DAMP, levels=(layout.INT4_MIN, layout.INT4_MAX)), best_s
    return q, best_s


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _clip_search(w, group, ratios, q, best_s):  # pragma: no cover (compiled; run by every int4 compile)
    """Per row and group of `w` [N, K] (float32): the scale amax * ratio / 8 of
    `ratios` (float32, the first of equals kept) with the least squared error
    sum (clip(rint(w / s), -8, 7) s - w)^2 (float64 sums), written to best_s
    [N, G], and the values rounded to nearest with it into q [N, K]. One pass
    over a group per ratio, fused: the numpy form's seven passes over float32
    temporaries per ratio were most of an int4 compile (~45 ns a weight)."""
    n, k = w.shape
    lo, hi = np.float32(_INT4_MIN), np.float32(_INT4_MAX)
    eight = np.float32(8.0)
    for r in range(n):
        for g0 in range(0, k, group):
            g1 = min(k, g0 + group)
            amax = np.float32(0.0)
            for j in range(g0, g1):
                amax = max(amax, abs(w[r, j]))
            best, best_err = np.float32(1.0), np.inf
            if amax > 0:
                for ratio in ratios:
                    s = amax * ratio / eight
                    err = 0.0
                    for j in range(g0, g1):
                        v = min(max(np.rint(w[r, j] / s), lo), hi)
                        e = v * s - w[r, j]
                        err += e * e
                    if err < best_err:
                        best, best_err = s, err
            best_s[r, g0 // group] = best
            for j in range(g0, g1):
                q[r, j] = np.int8(min(max(np.rint(w[r, j] / best), lo), hi))


AUTO_GROUP = 0  # LlmCompileOptions.int4_group: the longest groups whose int16 partials are safe


def group_for(k: int, parts: int) -> int:
    """K in `parts` groups of equal length (a multiple of 32; the last may be shorter)."""
    return layout.align(-(-k // parts), layout.CHANNEL_GROUP)


def safe(w: Int4Weight) -> bool:
    """Every int16 partial of these weights stays in range for any int4 activations (Q23)."""
    from rkc.compiler.npu.gemm_int4 import INT16_MAX, partial_bound, segment_limit

    return w.group <= segment_limit() or partial_bound(w.data.T, w.group) <= INT16_MAX


def partial_products(rows: np.ndarray, w: Int4Weight) -> np.ndarray:
    """What the NPU's int4 GEMM writes: [rows, G, N] exact integer partials per K group."""
    k = w.data.shape[1]
    return np.stack([rows[:, k0:k0 + w.group].astype(np.int64) @ w.data[:, k0:k0 + w.group].T.astype(np.int64)
                     for k0 in range(0, k, w.group)], axis=1)


def emulate(x: np.ndarray, w: Int4Weight, bias: np.ndarray | None = None) -> np.ndarray:
    """x [M, K] float -> y [M, N] as the NPU + CPU compute it (partials exact)."""
    rows, s = npu_rows(x)
    return combine(partial_products(rows, w), s, w.scales, bias)
