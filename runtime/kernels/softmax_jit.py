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
float32 (exp as 2^v by a short polynomial, vectorised: below) and writes the rows,
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


_ATOM = 8  # fp16 lanes of a GEMM output atom (layout.c2_for(2))


# The passes below work on one kernel group (kg query rows) at a time: its rows' atoms of one key
# group lie side by side ([kg rows, 8 keys], 256 bytes), so every loop runs over kg * 8
# contiguous elements, which LLVM vectorises; a row at a time read 8 keys every 6.4 KB and its
# per-atom loops stayed scalar. 400x400 head, one thread: 0.35-0.46 -> 0.15-0.2 ms (2026-12-07
# notes). Unsigned positions: a signed one makes numba test each index for wraparound (scalar).
#
# The weights are rounded to fp16 (half an ulp: 2^-11 of the value), so exp needs far less than
# float32's last bits: it is taken as 2^v with log2(e) folded into the scale (one multiply per
# score), v = k + r, k = round(v), and 2^r for |r| <= 1/2 by a degree-5 polynomial (a
# least-squares fit of the relative error, reweighted towards its peaks: 7.5e-8 in float64, 2.3e-7
# evaluated in float32), against exp_f32's range reduction in two parts and degree 7 (the LLM's kernels keep
# theirs). The maxima are taken on the fp16 scores as 16-bit keys (16 lanes a vector, no widened
# copy): scaling by a positive number keeps their order, so the row's maximum scaled is the
# maximum of the scaled scores exactly.
_LOG2E = 1.4426950408889634
_EXP2_LO, _EXP2_HI = np.float32(-126.0), np.float32(127.0)  # 2^k stays a normal float32
_P0, _P1, _P2 = np.float32(1.0000001192092896), np.float32(0.6931469440460205), np.float32(0.24022118747234344)
_P3, _P4, _P5 = np.float32(0.055507078766822815), np.float32(0.009675555862486362), np.float32(0.0013278163969516754)


@njit(inline="always")
def _exp2(v):
    """2^v in float32 (relative error < 3e-7; v clamped to [-126, 127])."""
    v = min(max(v, _EXP2_LO), _EXP2_HI)
    k = np.floor(v + np.float32(0.5))
    r = v - k  # exact
    p = ((((_P5 * r + _P4) * r + _P3) * r + _P2) * r + _P1) * r + _P0
    return p * np.int32((np.int32(k) + np.int32(127)) << 23).view(np.float32)


@njit(inline="always")
def _key(bits, flip):
    """fp16 bits -> an int16 in the values' order (a sign-magnitude number's negative half
    flipped; its own inverse), all bits flipped too where `flip` is -1 (a negative scale: the
    largest scaled score is the least score). A NaN sorts past +-inf (positive NaNs at the top:
    a row holding one is NaN throughout, as numpy's softmax)."""
    s = np.int16(bits)
    return np.int16(np.int16(s ^ ((s >> 15) & 0x7FFF)) ^ flip)


@njit(inline="always")
def _keys_larger(src, keys, tail, flip):
    """keys = the lane-wise maximum of keys and src's keys (`_key`), lanes b >= tail of each
    atom left alone (the last atom's padding: not scores)."""
    least = np.int16(-0x8000)
    for i in range(keys.size):
        u = np.uint64(i)
        k = _key(src[u], flip) if (u & np.uint64(7)) < np.uint64(tail) else least
        w = keys[u]
        keys[u] = k if k > w else w


@njit(inline="always")
def _row_keys(keys, n):
    """keys[8r:8r+8] = their maximum, rows r < n."""
    for r in range(n):
        x = keys[r * _ATOM]
        for b in range(1, _ATOM):
            y = keys[r * _ATOM + b]
            x = y if y > x else x
        keys[r * _ATOM:(r + 1) * _ATOM] = x


@njit(inline="always")
def _exp_summed(src, c, mx, t, sums, tail):
    """t = 2^(c s - mx) of the fp16 scores `src` (lane-wise), sums += t; lanes b >= tail of
    each atom (the last atom's padding) 0."""
    for i in range(t.size):
        u = np.uint64(i)
        e = _exp2(widen_value(src[u]) * c - mx[u])
        e = e if (u & np.uint64(7)) < np.uint64(tail) else np.float32(0.0)
        t[u] = e
        sums[u] += e


@njit(inline="always")
def _narrowed(x, inv, q):
    for i in range(q.size):
        u = np.uint64(i)
        q[u] = narrow_value(x[u] * inv[u])


@njit(inline="always")
def _reciprocals(v, n):
    """v[8r:8r+8] = 1 / their sum, rows r < n."""
    for r in range(n):
        x = v[r * _ATOM]
        for b in range(1, _ATOM):
            x = x + v[r * _ATOM + b]
        v[r * _ATOM:(r + 1) * _ATOM] = np.float32(1.0) / x


@njit(inline="always")
def _row_maxima(flat, stored, r0, r1, n, c):
    """mx[8 (r - r0) + b] <- the maximum of c s over query row r's keys (every lane b), rows
    [r0, r1) of the fp16 scores `flat` (bits of atoms [C1, stored, 8]). One pass a key group over
    its rows' atoms, which lie one after another: read in the order they are stored, the scores
    are streamed from memory (the per-group passes that follow then find them in the cache);
    group by group, 16 rows' atoms of one key group (256 bytes) every 6.4 KB missed the
    prefetcher: a 400x400 head took ~2x its warm time when cold."""
    units = (n + _ATOM - 1) // _ATOM  # key groups: one atom of each row
    span = (r1 - r0) * _ATOM
    tail = n - (units - 1) * _ATOM  # keys in the last atom
    flip = np.int16(0) if c >= 0 else np.int16(-1)
    keys = np.full(span, np.int16(-0x8000))
    for a in range(units):
        at = (a * stored + r0) * _ATOM
        _keys_larger(flat[at:at + span], keys, tail if a == units - 1 else _ATOM, flip)
    _row_keys(keys, r1 - r0)
    mx = np.empty(span, np.float32)
    for i in range(span):  # the key back to its fp16 bits, then scaled as every score is
        k = np.int16(keys[i] ^ flip)
        mx[i] = widen_value(np.uint16(np.int16(k ^ ((k >> 15) & 0x7FFF)))) * c
    return mx


@njit(inline="always")
def _group_exps(flat, stored, m0, live, n, c, t, mx, inv):
    """t[a kg 8 + 8 r + b] <- exp(scale s - the row's maximum) of query row m0 + r, key 8a + b,
    rows [m0, m0 + live) of the fp16 scores `flat` (bits of atoms [C1, stored, 8]), computed as
    2^(c s - mx), c = scale log2(e), mx their rows' maxima (`_row_maxima`); inv[8 r + b] <- 1 /
    the row's sum. Keys past n (the last atom's padding lanes) are 0 in t and out of the sum."""
    units = (n + _ATOM - 1) // _ATOM
    width = inv.size  # one key group of a kernel group's rows
    span = live * _ATOM
    tail = n - (units - 1) * _ATOM
    inv[:span] = 0
    for a in range(units):
        at = a * stored * _ATOM + m0 * _ATOM
        _exp_summed(flat[at:at + span], c, mx, t[a * width:a * width + span], inv[:span],
                    tail if a == units - 1 else _ATOM)
    _reciprocals(inv, live)


@njit(**_JIT)
def _groups_into_kernels(atoms, rows, n, c, kg, out, lo, hi):
    """Kernel groups [lo, hi) of P^T's fp16 weights `out` (flat bits, pack_weights' order: kernel
    groups of kg kernels of cp = n rounded up to the atom, each group's whole 32-channel tiles
    then its last shorter one) <- the softmax of scale times query rows [g kg, g kg + kg) of the
    fp16 scores atoms [C1, >= rows, 8] (bits, N = n keys), c = scale log2(e); kernels from `rows`
    on zero."""
    c1, stored, _ = atoms.shape
    flat = atoms.reshape(c1 * stored * _ATOM)  # C-contiguous (softmax_into_weights checks)
    units = (n + _ATOM - 1) // _ATOM
    cp = units * _ATOM
    width = kg * _ATOM
    t = np.empty(units * width, np.float32)
    inv = np.empty(width, np.float32)
    q = np.empty(units * width, np.uint16)
    r0 = min(lo * kg, rows)
    mx = _row_maxima(flat, stored, r0, max(min(hi * kg, rows), r0), n, c)
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
        _group_exps(flat, stored, m0, live, n, c, t, mx[(m0 - r0) * _ATOM:(m0 - r0) * _ATOM + span], inv)
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
def _groups_into_atoms(atoms, rows, n, c, kg, out, lo, hi):
    """Row groups [lo, hi) (kg query rows each) of P's fp16 atoms `out` [C1, stored, 8] (bits,
    the scores' own layout: the next product's A) <- the softmax of scale times those rows of
    the fp16 scores `atoms` (the same layout; `out` may be `atoms`: every row's maximum is taken
    before any row is written), c = scale log2(e); stored rows past `rows` zero."""
    c1, stored, _ = atoms.shape
    flat, into = atoms.reshape(c1 * stored * _ATOM), out.reshape(c1 * stored * _ATOM)
    units = (n + _ATOM - 1) // _ATOM
    width = kg * _ATOM
    t = np.empty(units * width, np.float32)
    inv = np.empty(width, np.float32)
    r0 = min(lo * kg, rows)  # (the maxima are taken before any row is written: `out` may be `atoms`)
    mx = _row_maxima(flat, stored, r0, max(min(hi * kg, rows), r0), n, c)
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
        _group_exps(flat, stored, m0, scored, n, c, t, mx[(m0 - r0) * _ATOM:(m0 - r0) * _ATOM + span], inv)
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
    c = np.float32(scale * _LOG2E)
    over_rows(lambda lo, hi: _groups_into_kernels(atoms, m, n, c, kg, out[:kernels * cp], lo, hi), groups, m * n)


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
    c = np.float32(scale * _LOG2E)
    over_rows(lambda lo, hi: _groups_into_atoms(atoms, m, n, c, kg, out, lo, hi), groups, m * n)
