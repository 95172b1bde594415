"""Compiled (numba) layer normalization of rows: a CPU LayerNormalization between two
NPU segments (examples/mlp.py) took ~50 us in numpy's float64 passes (five temporaries
over [4, 128]); one pass a row here, the same float64 arithmetic (mean, then the
variance of the deviations, then (x - mean) * inv_std * scale + b, rounded once into
the output's dtype)."""

from __future__ import annotations

import numpy as np
from numba import njit

# the sums reassociate (vectorised, float64 throughout); nothing else is relaxed
_JIT = {"cache": True, "nogil": True, "fastmath": {"reassoc"}}


@njit(**_JIT)
def layer_norm_rows(x, scale, bias, epsilon, out, mean, inv_std):
    """out[r] = (x[r] - mean[r]) * inv_std[r] * scale + bias for each row r of x
    [rows, n] (float32 or float64), in float64; mean and inv_std [rows] float64."""
    rows, n = x.shape
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += np.float64(x[r, j])
        m = s / n
        v = 0.0
        for j in range(n):
            d = np.float64(x[r, j]) - m
            v += d * d
        k = 1.0 / np.sqrt(v / n + epsilon)
        for j in range(n):
            out[r, j] = (np.float64(x[r, j]) - m) * k * scale[j] + bias[j]
        mean[r] = m
        inv_std[r] = k
