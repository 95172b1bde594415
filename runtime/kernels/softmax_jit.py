"""Compiled (numba) softmax between two NPU products: attention's probabilities
(YOLO11n's C2PSA; compiler/passes/heads.py splits its heads into GEMMs with a
run-time B, compiler/emitter_matmul.py).

The first product S = Q K^T [M, N] comes out of the NPU as fp16 atoms of a GEMM
output ("native-gemm": [ceil(N / 8), rows, 8], ir/npu/geometry.py). The second product
reads P = softmax(S) over the keys either as its A, in that same layout (computed
transposed, P V^T: compiler/passes/heads.py; `softmax_into_atoms`), or as P^T [N, M],
its run-time weights ("native-weights": kernel m is P's row m, channels grouped by 32,
kernels by 16, ir/npu/layout.py's pack_weights; `softmax_into_weights`). One pass per
group of 16 query rows reads their scores where the NPU wrote them, takes the softmax in
float32 (exp: prefill_kernels.exp_f32's polynomial, vectorised) and writes the rows,
rounded to fp16, straight into their atoms or kernels: no widened copy, no transpose, no
pack (four passes over M x N before). Row groups are shared by the host threads
(runtime/kernels/threads.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.ir.npu import layout
from rkc.runtime.half import narrow_value, widen_value
from rkc.runtime.kernels.threads import over_rows
from rkc.runtime.llm.prefill_kernels import exp_f32, exp_parts

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


_ATOM = 8  # fp16 lanes of a GEMM output atom (layout.c2_for(2))


# The pass below works on one kernel group (kg query rows) at a time: its rows' atoms of one key
# group lie side by side ([kg rows, 8 keys], 256 bytes), so every loop runs over kg * 8
# contiguous elements, which LLVM vectorises; a row at a time read 8 keys every 6.4 KB and its
# per-atom loops stayed scalar. 400x400 head, one thread: 0.35-0.46 -> 0.15-0.2 ms (2026-12-07
# notes). Unsigned positions: a signed one makes numba test each index for wraparound (scalar).
@njit(inline="always")
def _widened(src, dst, scale):
    for i in range(dst.size):
        u = np.uint64(i)
        dst[u] = widen_value(src[u]) * scale


@njit(inline="always")
def _larger(x, m, into):
    """into = the lane-wise maximum of x and m, a NaN in x passed over (vmaxps). `into` is not
    `m`: written back into m LLVM makes the store a masked one (vmaskmovps, x NaN -> m unchanged),
    microcoded on x86 (0.08 against 0.015 ms for 160k maxima)."""
    for i in range(into.size):
        u = np.uint64(i)
        v, w = x[u], m[u]
        into[u] = v if v > w else w


@njit(inline="always")
def _exp_summed(x, mx, sums):
    """x = exp(x - mx) in place, sums += x (lane-wise)."""
    for i in range(x.size):
        u = np.uint64(i)
        e = exp_f32(x[u] - mx[u])
        x[u] = e
        sums[u] += e


@njit(inline="always")
def _narrowed(x, inv, q):
    for i in range(q.size):
        u = np.uint64(i)
        q[u] = narrow_value(x[u] * inv[u])


@njit(inline="always")
def _lanes_combined(v, n, larger):
    """v[8r:8r+8] = their maximum (larger) or their sum's reciprocal (not larger), rows r < n."""
    for r in range(n):
        x = v[r * _ATOM]
        for b in range(1, _ATOM):
            y = v[r * _ATOM + b]
            x = (y if y > x else x) if larger else x + y
        if not larger:
            x = np.float32(1.0) / x
        v[r * _ATOM:(r + 1) * _ATOM] = x


@njit(inline="always")
def _group_exps(flat, stored, m0, live, n, scale, t, mx, other, inv):
    """t[a kg 8 + 8 r + b] <- exp(scale s - the row's maximum) of query row m0 + r, key 8a + b,
    rows [m0, m0 + live) of the fp16 scores `flat` (bits of atoms [C1, stored, 8]); inv[8 r + b]
    <- 1 / the row's sum. Keys past n (the last atom's padding lanes) count as -inf: exp gives
    ~1e-38 there, rounded to fp16 zero (the padding the next product reads)."""
    units = (n + _ATOM - 1) // _ATOM  # key groups: one atom of each row
    width = mx.size  # one key group of a kernel group's rows
    span = live * _ATOM
    for a in range(units):
        at = a * stored * _ATOM + m0 * _ATOM
        _widened(flat[at:at + span], t[a * width:a * width + span], scale)
    tail = n - (units - 1) * _ATOM  # keys in the last atom
    if tail < _ATOM:
        for r in range(live):
            t[(units - 1) * width + r * _ATOM + tail:(units - 1) * width + (r + 1) * _ATOM] = -np.inf
    mx[:span] = t[:span]
    for a in range(1, units):
        _larger(t[a * width:a * width + span], mx[:span], other[:span])
        mx, other = other, mx
    _lanes_combined(mx, live, True)
    inv[:span] = 0
    for a in range(units):
        _exp_summed(t[a * width:a * width + span], mx[:span], inv[:span])
    _lanes_combined(inv, live, False)


@njit(**_JIT)
def _groups_into_kernels(atoms, rows, n, scale, kg, out, lo, hi):
    """Kernel groups [lo, hi) of P^T's fp16 weights `out` (flat bits, pack_weights' order: kernel
    groups of kg kernels of cp = n rounded up to the atom, each group's whole 32-channel tiles
    then its last shorter one) <- the softmax of scale times query rows [g kg, g kg + kg) of the
    fp16 scores atoms [C1, >= rows, 8] (bits, N = n keys); kernels from `rows` on zero."""
    c1, stored, _ = atoms.shape
    flat = atoms.reshape(c1 * stored * _ATOM)  # C-contiguous (softmax_into_weights checks)
    units = (n + _ATOM - 1) // _ATOM
    cp = units * _ATOM
    width = kg * _ATOM
    t = np.empty(units * width, np.float32)
    mx = np.empty(width, np.float32)
    other = np.empty(width, np.float32)
    inv = np.empty(width, np.float32)
    q = np.empty(units * width, np.uint16)
    q64, out64 = q.view(np.uint64), out.view(np.uint64)  # 8 fp16 lanes = two 64-bit moves
    tile = layout.CHANNEL_GROUP
    for grp in range(lo, hi):
        m0 = grp * kg
        live = min(kg, rows - m0)
        base = m0 * cp
        if live < kg:  # kernels past the scores are zero (the live ones are written below)
            out[base:base + kg * cp] = 0
        if live <= 0:
            continue
        span = live * _ATOM
        _group_exps(flat, stored, m0, live, n, scale, t, mx, other, inv)
        for a in range(units):
            _narrowed(t[a * width:a * width + span], inv[:span], q[a * width:a * width + span])
        for a in range(units):  # atom (a, row r) -> tile a // 4 of the group, kernel r, channels 8 (a % 4) on
            g = a // (tile // _ATOM)
            w = min(tile, cp - g * tile)
            at = (base + g * tile * kg + a % (tile // _ATOM) * _ATOM) // 4
            frm = a * width // 4
            for r in range(live):
                d = np.uint64(at + r * w // 4)
                s = np.uint64(frm + 2 * r)
                out64[d] = q64[s]
                out64[d + np.uint64(1)] = q64[s + np.uint64(1)]


@njit(**_JIT)
def _groups_into_atoms(atoms, rows, n, scale, kg, out, lo, hi):
    """Row groups [lo, hi) (kg query rows each) of P's fp16 atoms `out` [C1, stored, 8] (bits,
    the scores' own layout: the next product's A) <- the softmax of scale times those rows of
    the fp16 scores `atoms` (the same layout; `out` may be `atoms`: a group's rows are all read
    before any is written); stored rows past `rows` zero."""
    c1, stored, _ = atoms.shape
    flat, into = atoms.reshape(c1 * stored * _ATOM), out.reshape(c1 * stored * _ATOM)
    units = (n + _ATOM - 1) // _ATOM
    width = kg * _ATOM
    t = np.empty(units * width, np.float32)
    mx = np.empty(width, np.float32)
    other = np.empty(width, np.float32)
    inv = np.empty(width, np.float32)
    for grp in range(lo, hi):
        m0 = grp * kg
        live = min(kg, stored - m0)
        scored = min(live, rows - m0)
        if scored < live:  # rows past the scores (GEMM rows stored padded to 4): zero
            for a in range(c1):
                into[(a * stored + m0 + max(scored, 0)) * _ATOM:(a * stored + m0 + live) * _ATOM] = 0
        if scored <= 0:
            continue
        span = scored * _ATOM
        _group_exps(flat, stored, m0, scored, n, scale, t, mx, other, inv)
        for a in range(units):
            at = (a * stored + m0) * _ATOM
            _narrowed(t[a * width:a * width + span], inv[:span], into[at:at + span])


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


def softmax_of_logits(lanes: np.ndarray, params: tuple[float, int] | None, out: np.ndarray) -> None:
    """out[j] = softmax over j < len(out) of a classifier's logits held as one pixel's atoms
    (lanes [C1, C2]: lane b of atom a is logit a * C2 + b, half.one_pixel_lanes): int8 codes
    dequantized by params = (scale, zero point) (float32((q - zp) * scale), exact: a code
    times a float32 scale), or fp16 bits widened (params None), then `_softmax_into`. One
    call for the model's last DequantizeLinear / Cast, Flatten and Softmax steps
    (runtime/logits_edges.py)."""
    if params is None:
        _widened_softmax(lanes, out)
    else:
        _dequantized_softmax(lanes, params[0], params[1], out)


@njit(**_JIT)
def _dequantized_softmax(lanes, scale, zero_point, out):
    c2, scale, zp = lanes.shape[1], np.float32(scale), np.float32(zero_point)
    for j in range(out.shape[0]):
        out[j] = (np.float32(lanes[j // c2, j % c2]) - zp) * scale
    _softmax_into(out, out, out.shape[0], np.empty(out.shape[0], np.int32), np.empty(_LANES, np.float32))


@njit(**_JIT)
def _widened_softmax(lanes, out):
    c2 = lanes.shape[1]
    for j in range(out.shape[0]):
        out[j] = widen_value(lanes[j // c2, j % c2])
    _softmax_into(out, out, out.shape[0], np.empty(out.shape[0], np.int32), np.empty(_LANES, np.float32))


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
    groups = kernels // kg
    over_rows(lambda lo, hi: _groups_into_kernels(atoms, m, n, np.float32(scale), kg, out[:kernels * cp], lo, hi),
              groups, m * n)


def softmax_into_atoms(atoms: np.ndarray, m: int, n: int, out: np.ndarray, scale: float = 1.0) -> None:
    """P = softmax over the keys of scale times the fp16 scores S [m, n] held as GEMM output atoms
    [C1, stored >= m, 8] (uint16 bits), written as fp16 atoms of the same layout into `out` (the
    next product's A, "native-gemm"; `out` may be `atoms`): lanes past n and rows past m zero."""
    kg = layout.kernel_group_for(2)  # 16 rows a pass: 128 contiguous lanes per key group
    if atoms.ndim != 3 or atoms.shape[1] < m or atoms.shape[0] * atoms.shape[2] < n or out.shape != atoms.shape \
            or not (atoms.flags.c_contiguous and out.flags.c_contiguous) or atoms.shape[0] != -(-n // _ATOM):
        raise ValueError(f"softmax_into_atoms: {list(atoms.shape)} atoms into {list(out.shape)} "
                         f"do not hold [{m}, {n}] scores")
    groups = -(-atoms.shape[1] // kg)
    over_rows(lambda lo, hi: _groups_into_atoms(atoms, m, n, np.float32(scale), kg, out, lo, hi), groups, m * n)
