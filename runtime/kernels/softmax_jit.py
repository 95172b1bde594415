"""Compiled (numba) softmax between two NPU products: attention's probabilities
(YOLO11n's C2PSA; compiler/passes/heads.py splits its heads into GEMMs with a
run-time B, compiler/emitter_matmul.py).

The first product S = Q K^T [M, N] comes out of the NPU as fp16 atoms of a GEMM
output ("native-gemm": [ceil(N / 8), rows, 8], ir/npu/geometry.py); the second
product reads P^T [N, M], P = softmax(S) over the keys, as its run-time weights
("native-weights": kernel m is P's row m, channels grouped by 32, kernels by 16,
ir/npu/layout.py's pack_weights). One pass per query row reads its scores where
the NPU wrote them, takes the softmax in float32 (exp: prefill_kernels.exp_parts'
polynomial, vectorised in the row's loop) and writes the row, rounded to fp16, straight into
its kernel: no widened copy, no transpose, no pack (four passes over M x N before).
Rows are shared by the host threads (runtime/kernels/threads.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.ir.npu import layout
from rkc.runtime.half import narrow_value, widen_value
from rkc.runtime.kernels.threads import over_rows
from rkc.runtime.llm.prefill_kernels import exp_parts

# the maximum and the sum reassociate (vectorised); no nnan/ninf: a row of -inf scores stays NaN as numpy's
_JIT = {"cache": True, "nogil": True, "fastmath": {"reassoc", "contract", "nsz", "arcp"}}


_LANES = 16


@njit(**_JIT)
def _row_max(t, n, lanes):
    """max(t[:n]) over _LANES running maxima (one chain of compares did not vectorise:
    4x slower). A NaN is passed over (the scores of finite inputs have none)."""
    lanes[:] = t[0]
    body = n - n % _LANES
    for j in range(0, body, _LANES):
        for lane in range(_LANES):
            v = t[j + lane]
            lanes[lane] = v if v > lanes[lane] else lanes[lane]
    mx = t[0]
    for lane in range(_LANES):
        mx = lanes[lane] if lanes[lane] > mx else mx
    for j in range(body, n):
        mx = t[j] if t[j] > mx else mx
    return mx


@njit(inline="always")
def _softmax_into(src, dst, n, bits, lanes):
    """dst[:n] = softmax(src[:n]) in float32 (dst may be src; `bits`: an int32 row of n
    for exp_parts' 2^k). Inlined, so its loops vectorise in the caller: a call to
    prefill_kernels.exp_into from the row loop did not."""
    scaled = bits.view(np.float32)
    mx = _row_max(src, n, lanes)
    for j in range(n):
        dst[j], bits[j] = exp_parts(src[j] - mx)
    total = np.float32(0.0)
    for j in range(n):
        dst[j] = dst[j] * scaled[j]
        total += dst[j]
    inv = np.float32(1.0) / total
    for j in range(n):
        dst[j] = dst[j] * inv


@njit(**_JIT)
def _rows_into_kernels(atoms, rows, n, scale, kg, out, lo, hi):
    """Query rows [lo, hi) of fp16 scores atoms [C1, >= rows, C2] (bits, N = n keys)
    -> the softmax of scale times them rounded to fp16, row m into kernel m of the weights `out`
    (flat fp16 bits: kernel groups of kg kernels of cp = n rounded up to the atom,
    each group's whole 32-channel tiles then its last shorter one); kernels from
    `rows` on (up to whole groups) zero."""
    c1, stored, c2 = atoms.shape
    flat = atoms.reshape(c1 * stored * c2)  # C-contiguous (softmax_into_weights checks)
    step = np.uint64(stored * c2)  # from one key group's atom of a row to the next group's
    cp = (n + c2 - 1) // c2 * c2
    whole = cp // layout.CHANNEL_GROUP * layout.CHANNEL_GROUP
    t = np.zeros(cp, np.float32)
    bits = np.empty(n, np.int32)
    lanes = np.empty(_LANES, np.float32)
    p = np.empty(cp, np.float32)
    p[n:] = np.float32(0.0)
    q = np.empty(cp, np.uint16)
    for m in range(lo, hi):
        if m >= rows:
            q[:] = 0
            _into_kernel(q, m, kg, cp, whole, out)
            continue
        full = n // c2
        at = np.uint64(m * c2)
        for a in range(full):  # whole atoms: 8 lanes each, unsigned positions (no negative-index test,
            for b in range(c2):  # no view made per atom: 0.07 -> 0.05 ms a 400x400 head)
                t[a * c2 + b] = widen_value(flat[at + np.uint64(b)]) * scale
            at += step
        for j in range(full * c2, n):
            t[j] = widen_value(atoms[full, m, j - full * c2]) * scale
        _softmax_into(t, p, n, bits, lanes)
        for j in range(cp):  # the row rounded in one loop (vcvtps2ph: probabilities, no NaN payload
            q[j] = narrow_value(p[j])  # to hand on), then moved tile by tile
        _into_kernel(q, m, kg, cp, whole, out)


@njit(**_JIT)
def _into_kernel(q, m, kg, cp, whole, out):
    """Kernel m of flat fp16 weights `out` (pack_weights' order) <- the fp16 row q (bits)."""
    tile = layout.CHANNEL_GROUP
    base = m // kg * kg * cp
    k = m % kg
    for g in range(whole // tile):  # unsigned positions: the copy vectorises (0.057 -> 0.037 ms a head)
        at, frm = np.uint64(base + g * kg * tile + k * tile), np.uint64(g * tile)
        for c in range(tile):
            out[at + np.uint64(c)] = q[frm + np.uint64(c)]
    at = base + whole * kg + k * (cp - whole)
    for c in range(cp - whole):
        out[at + c] = q[whole + c]


@njit(**_JIT)
def _rows(x, out, lo, hi):
    """out[r] = softmax(x[r]) for rows [lo, hi) of float32 x [R, N] (out may be x)."""
    n = x.shape[1]
    bits = np.empty(n, np.int32)
    lanes = np.empty(_LANES, np.float32)
    for r in range(lo, hi):
        _softmax_into(x[r], out[r], n, bits, lanes)


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of a C-contiguous float32 array (a new array): the host
    Softmax's float32 case (runtime/kernels/nn.py), rows shared by the host threads."""
    out = np.empty_like(x)
    rows = x.reshape(-1, x.shape[-1])
    over_rows(lambda lo, hi: _rows(rows, out.reshape(rows.shape), lo, hi), rows.shape[0], x.size)
    return out


def softmax_into_weights(atoms: np.ndarray, m: int, n: int, out: np.ndarray, scale: float = 1.0) -> None:
    """P = softmax over the keys of scale times the fp16 scores S [m, n] held as GEMM output atoms
    [C1, >= m, 8] (uint16 bits), written as the fp16 run-time weights of P^T
    (geometry's "native-weights" of an [n, m] B: uint16 bits, at least
    align(m, 16) * align(n, 8) of them; kernels past m zeroed)."""
    kg = layout.kernel_group_for(2)
    cp = layout.align(n, layout.c2_for(2))
    kernels = layout.align(m, kg)
    if out.size < kernels * cp or atoms.shape[1] < m or atoms.shape[0] * atoms.shape[2] < n \
            or not atoms.flags.c_contiguous:
        raise ValueError(f"softmax_into_weights: {list(atoms.shape)} atoms or {out.size} weights "
                         f"do not hold [{m}, {n}] scores")
    over_rows(lambda lo, hi: _rows_into_kernels(atoms, m, n, np.float32(scale), kg, out, lo, hi), kernels, m * n)
