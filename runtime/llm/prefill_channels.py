"""Compiled (numba) kernels for prefill tensors held channel-major: an NPU
output read in its layout has the chunk's tokens innermost, so a per-head
view [T, H, D] is [H, D, T] in memory (C order once the token axis is moved
last). Each kernel runs its loops with the tokens innermost, where they
are contiguous and independent, so every pass is a vector loop; the row
kernels (runtime/llm/jit.py) would read one value per token row with a
stride, and a reshape of such a view into rows copies it.

Float32 arithmetic in its own order (issue 37: not numpy's bits); bounded
against float64 references in tests/llm/test_prefill_channels.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import narrow_value, widen_value

_JIT = {"cache": True, "nogil": True, "fastmath": False}


def channel_major(a: np.ndarray) -> np.ndarray | None:
    """a [T, ..., K] as a C-order view [B, K, T] (B: the product of the middle
    axes), or None when a's tokens are not its innermost axis in memory."""
    if a.ndim < 2 or a.dtype != np.float32:
        return None
    t = np.moveaxis(a, 0, -1)
    if not t.flags.c_contiguous:
        return None
    return t.reshape(-1, a.shape[-1], a.shape[0])


@njit(**_JIT)
def rms_norm(x, w, eps, out):
    """out[b, :, t] = x[b, :, t] / sqrt(mean(x[b, :, t]^2) + eps) * w over x,
    out [B, K, T] (C order): the squares summed in float64, one token per lane."""
    nb, k, t_ = x.shape
    acc = np.empty(t_, np.float64)
    inv = np.empty(t_, np.float32)
    for b in range(nb):
        for t in range(t_):
            acc[t] = 0.0
        for i in range(k):
            row = x[b, i]
            for t in range(t_):
                v = np.float64(row[t])
                acc[t] += v * v
        for t in range(t_):
            inv[t] = np.float32(1.0 / np.sqrt(acc[t] / k + np.float64(eps)))
        for i in range(k):
            row, dst, wi = x[b, i], out[b, i], w[i]
            for t in range(t_):
                dst[t] = (row[t] * inv[t]) * wi


@njit(**_JIT)
def per_layer_inputs(x, scale, w, eps, rows, mix, out, lo, hi, tokens):
    """Gemma 4's per-layer inputs of layers lo..hi-1, the first `tokens` rows:
    out[t, l] = (RMSNorm(scale * x[l, :, t], w) + rows[t, l]) * mix, with x
    [L, P, T] (the projection as the NPU left it, tokens innermost, or any
    strided view), rows and out [T, L, P] (C order): the Scale, RMSNorm, Add
    and Scale steps in one pass (squares summed in float64)."""
    p_ = x.shape[1]
    acc = np.empty(tokens, np.float64)
    inv = np.empty(tokens, np.float32)
    for l in range(lo, hi):
        for t in range(tokens):
            acc[t] = 0.0
        for i in range(p_):
            row = x[l, i]
            for t in range(tokens):
                v = np.float64(row[t] * scale)
                acc[t] += v * v
        for t in range(tokens):
            inv[t] = np.float32(1.0 / np.sqrt(acc[t] / p_ + np.float64(eps)))
        for t in range(tokens):
            src, dst, f = rows[t, l], out[t, l], inv[t]
            for i in range(p_):
                dst[i] = ((x[l, i, t] * scale) * f * w[i] + src[i]) * mix


@njit(**_JIT)
def rope(x, cos_t, sin_t, dims, neox, out):
    """Rotary embedding of x [B, D, T] (C order) into out: cos_t, sin_t
    [dims / 2, T] (each pair's angle per token); NeoX pairs channel i with
    i + dims / 2, else 2i with 2i + 1; channels past dims copied."""
    nb, d, t_ = x.shape
    half = dims // 2
    for b in range(nb):
        for i in range(dims, d):
            src, dst = x[b, i], out[b, i]
            for t in range(t_):
                dst[t] = src[t]
        for i in range(half):
            a_i, b_i = (i, i + half) if neox else (2 * i, 2 * i + 1)
            xa, xb, oa, ob, c, s = x[b, a_i], x[b, b_i], out[b, a_i], out[b, b_i], cos_t[i], sin_t[i]
            for t in range(t_):
                a = xa[t]
                bb = xb[t]
                oa[t] = a * c[t] - bb * s[t]
                ob[t] = a * s[t] + bb * c[t]


_TOKENS = 16  # tokens narrowed before their rows are stored: a [16, D] fp16 tile stays in L1


@njit(**_JIT)
def store_half_rows(x, rows16, rows32):
    """A chunk's keys or values x [B, D, T] (float32, C order) into KV cache
    rows [T, B, D]: rows16 their fp16 bits (fptrunc: to nearest, ties to
    even, numpy's values; a NaN stays a NaN, its payload not kept), rows32
    those widened back (float32). Tiles of 16 tokens: each channel's run of
    the tile's tokens narrowed into a [16, D] tile (contiguous reads), then
    each token's row copied and widened in two contiguous passes; both
    conversions vectorise (runtime/half's value forms: vcvtps2ph,
    vcvtph2ps). 0.5x the time of converting 16 channels' whole token runs
    and storing them token by token with the bit forms (Gemma 3 270M's
    keys at 128 tokens: 28 against 58 us)."""
    nb, d, t_ = x.shape
    tile = np.empty((_TOKENS, d), np.uint16)
    for b in range(nb):
        for t0 in range(0, t_, _TOKENS):
            n = min(_TOKENS, t_ - t0)
            for i in range(d):
                src = x[b, i]
                for j in range(n):
                    tile[j, i] = narrow_value(src[t0 + j])
            for j in range(n):
                d16, d32, half = rows16[t0 + j, b], rows32[t0 + j, b], tile[j]
                for i in range(d):
                    d16[i] = half[i]
                for i in range(d):
                    d32[i] = widen_value(half[i])


def store_rows(x: np.ndarray, rows16: np.ndarray, rows32: np.ndarray) -> bool:
    """store_half_rows of x [T, B, D] when its tokens are innermost in memory
    and the rows [T, B, D] are C order; False (nothing written) otherwise."""
    xc = channel_major(x)
    if (xc is None or rows16.dtype != np.float16 or rows32.dtype != np.float32 or rows16.shape != x.shape
            or rows32.shape != x.shape or not (rows16.flags.c_contiguous and rows32.flags.c_contiguous)):
        return False
    store_half_rows(xc, rows16.view(np.uint16), rows32)
    return True



@njit(**_JIT)
def norm_rope(x, norm, w, eps, rotary, cos_t, sin_t, dims, neox, lo, hi, tokens):
    """rms_norm then rope (each when asked) of x [B, D, T] (C order) in place,
    blocks lo..hi-1, tokens 0..tokens-1 (the rest pad a short chunk and are
    left as they are), in one pass over each pair of channels: rms_norm's and
    rope's float32 operations in their order, so the values those two
    kernels give one after the other."""
    nb, d, t_ = x.shape
    t_ = min(t_, tokens)
    half = dims // 2 if rotary else 0
    acc = np.empty(t_, np.float64)
    inv = np.empty(t_, np.float32)
    for b in range(lo, hi):
        if norm:
            for t in range(t_):
                acc[t] = 0.0
            for i in range(d):
                row = x[b, i]
                for t in range(t_):
                    v = np.float64(row[t])
                    acc[t] += v * v
            for t in range(t_):
                inv[t] = np.float32(1.0 / np.sqrt(acc[t] / d + np.float64(eps)))
        for i in range(half):
            a_i, b_i = (i, i + half) if neox else (2 * i, 2 * i + 1)
            xa, xb, c, s = x[b, a_i], x[b, b_i], cos_t[i], sin_t[i]
            if norm:
                wa, wb = w[a_i], w[b_i]
                for t in range(t_):
                    a = (xa[t] * inv[t]) * wa
                    bb = (xb[t] * inv[t]) * wb
                    xa[t] = a * c[t] - bb * s[t]
                    xb[t] = a * s[t] + bb * c[t]
            else:
                for t in range(t_):
                    a = xa[t]
                    bb = xb[t]
                    xa[t] = a * c[t] - bb * s[t]
                    xb[t] = a * s[t] + bb * c[t]
        if norm:
            for i in range(2 * half, d):  # channels rope leaves (past dims; all of them without rope)
                row, wi = x[b, i], w[i]
                for t in range(t_):
                    row[t] = (row[t] * inv[t]) * wi
