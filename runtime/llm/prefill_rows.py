"""Compiled (numba) kernels of prefill's int8 stretches in the int32 atoms'
own order (row-major, 4 channels a row), for the stretches whose out edge
is a rotation with a block-mixing factor (Qwen2.5's and Gemma 4's int8
residual and FFN stretches): slabs of rows go from the atoms to the
factor's input with no transposition in or out, and `hartley_mix` runs a
Hartley factor of coprime order in prime-factor form. prefill_fused.py's
residual_tiles and ffn_tiles send those stretches here; its [K, LANES]
tiles take every other edge pair.

Float32 within float32 tolerance of a float64 reference (issue 37;
tests/llm/test_prefill_fused.py and test_prefill_ffn.py state the
tolerances), not the per-step kernels' bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.llm.prefill_kernels import _F32_JIT, LANES, _magnitude_peak, activation

_INT32_C2 = 4  # channels of an int32 atom (16 bytes)


_RESIDUAL_SLAB = 16  # rows a slab: [K / 4, 64] float32 (96 KB at K = 1536, in L2)


@njit(**_F32_JIT)
def _inv_rms(sums, nr, k, eps, inv):
    """inv[m] = 1 / sqrt(mean square + eps) of rows m < nr from their four
    float64 partial sums of squares sums[4 m..4 m + 3] (as _normalise's)."""
    for m in range(nr):
        s = (sums[4 * m] + sums[4 * m + 1]) + (sums[4 * m + 2] + sums[4 * m + 3])
        inv[m] = np.float32(1.0 / np.sqrt(np.float64(np.float32(s / k) + eps)))


@njit(**_F32_JIT)
def _h4(x0, x1, x2, x3, w0, w1, w2, w3):
    """A row's 4 channels of an atom times their weights (the last norm's and
    the rotation's signs), then the rotation's two butterfly stages within
    the atom (channel distance 1, 2), which act on other channels than the
    stages across atoms and so may come first. Scalars in and out: passed
    the atom's row (an array view) to store into, the call was not inlined
    and the in edge's pass cost 2.7x."""
    y0, y1, y2, y3 = x0 * w0, x1 * w1, x2 * w2, x3 * w3
    b0, b1 = y0 + y1, y0 - y1
    b2, b3 = y2 + y3, y2 - y3
    return b0 + b2, b1 + b3, b0 - b2, b1 - b3


@njit(**_F32_JIT)
def _atom_tail(x0, x1, x2, x3, h4, ws, j, s0, s1, s2, s3):
    """The end of a row pass over one atom (_rows_in_edge, _rows_norm_add):
    its 4 values as stored (through _h4 with ws[j..j + 3] when `h4`) and the
    row's four float64 partial sums of squares with the values added.
    Scalars in and out, a plain compiled call that LLVM inlines: numba's
    inline="always" (its IR's inlining) made the Qwen 128 x 1536 pass 2.2x
    (0.90 against 0.41 ms), and a helper given the atom's row view to store
    into was not inlined (h49e: 2.7x)."""
    s0 += np.float64(x0) * np.float64(x0)
    s1 += np.float64(x1) * np.float64(x1)
    s2 += np.float64(x2) * np.float64(x2)
    s3 += np.float64(x3) * np.float64(x3)
    if h4:
        y0, y1, y2, y3 = _h4(x0, x1, x2, x3, ws[j], ws[j + 1], ws[j + 2], ws[j + 3])
        return y0, y1, y2, y3, s0, s1, s2, s3
    return x0, x1, x2, x3, s0, s1, s2, s3


@njit(**_F32_JIT)
def _rows_in_edge(src, extra, rs, ch, bias, res, body_scale, add, keep_x, x_out, keep_total, total_out, h4, ws,
                  m0, nr, buf, sums):
    """Rows m0..m0+nr-1 of int32 atoms src [C1, R, 4] (plus `extra`'s, a second
    K partial, when it has rows: exact in float64, rounded once) dequantized,
    x = acc (rs[row] ch[j]) + bias[j] [kept in x_out]; with `add`, x = (x +
    res) body_scale [kept in total_out]; into buf [K / 4, nr x 4] (the
    atoms' order; through _h4 when `h4`), and four float64 partial sums of
    squares a row into sums[4 m..]. Row by row: the residual's and the kept
    rows are contiguous runs (C order), and a row's sums stay in registers
    (accumulated through the scratch array, whose aliasing LLVM cannot rule
    out, the pass cost 1.5x). _rows_norm_add is its twin for Gemma's first
    norm (the same tail, _atom_tail): one function with a flag choosing the
    source was not unswitched by LLVM (the passes cost 2x, the same bits)."""
    k = res.shape[1]
    partial = extra.shape[1] > 0
    for m in range(nr):
        row, q = m0 + m, m * _INT32_C2
        r = rs[row]
        xr = res[row]
        xo = x_out[row] if keep_x else xr
        kr = total_out[row] if keep_total else xr
        s0 = s1 = s2 = s3 = 0.0
        for a in range(k // _INT32_C2):
            j, at = a * _INT32_C2, src[a, row]
            if partial:
                ex = extra[a, row]
                v0 = np.float32(np.float64(at[0]) + np.float64(ex[0]))
                v1 = np.float32(np.float64(at[1]) + np.float64(ex[1]))
                v2 = np.float32(np.float64(at[2]) + np.float64(ex[2]))
                v3 = np.float32(np.float64(at[3]) + np.float64(ex[3]))
            else:
                v0, v1, v2, v3 = np.float32(at[0]), np.float32(at[1]), np.float32(at[2]), np.float32(at[3])
            x0 = v0 * (r * ch[j]) + bias[j]
            x1 = v1 * (r * ch[j + 1]) + bias[j + 1]
            x2 = v2 * (r * ch[j + 2]) + bias[j + 2]
            x3 = v3 * (r * ch[j + 3]) + bias[j + 3]
            if keep_x:
                xo[j], xo[j + 1], xo[j + 2], xo[j + 3] = x0, x1, x2, x3
            if add:
                x0, x1 = (x0 + xr[j]) * body_scale, (x1 + xr[j + 1]) * body_scale
                x2, x3 = (x2 + xr[j + 2]) * body_scale, (x3 + xr[j + 3]) * body_scale
            if keep_total:
                kr[j], kr[j + 1], kr[j + 2], kr[j + 3] = x0, x1, x2, x3
            t = buf[a]
            t[q], t[q + 1], t[q + 2], t[q + 3], s0, s1, s2, s3 = _atom_tail(x0, x1, x2, x3, h4, ws, j, s0, s1, s2, s3)
        sums[q], sums[q + 1], sums[q + 2], sums[q + 3] = s0, s1, s2, s3


@njit(**_F32_JIT)
def _rows_norm_add(buf, inv, w, res, body_scale, keep_n, n_out, keep_total, total_out, h4, ws, m0, nr, sums):
    """Gemma's first norm and the Add on a slab in buf (the atoms' order): n =
    (x inv[m]) w, total = (n + res) body_scale into buf (through _h4 when `h4`),
    each kept one stored, the total's partial sums of squares into sums
    (_rows_in_edge's way)."""
    k = res.shape[1]
    for m in range(nr):
        row, q, s = m0 + m, m * _INT32_C2, inv[m]
        xr = res[row]
        no = n_out[row] if keep_n else xr
        kr = total_out[row] if keep_total else xr
        s0 = s1 = s2 = s3 = 0.0
        for a in range(k // _INT32_C2):
            j, t = a * _INT32_C2, buf[a]
            n0, n1 = (t[q] * s) * w[j], (t[q + 1] * s) * w[j + 1]
            n2, n3 = (t[q + 2] * s) * w[j + 2], (t[q + 3] * s) * w[j + 3]
            if keep_n:
                no[j], no[j + 1], no[j + 2], no[j + 3] = n0, n1, n2, n3
            x0, x1 = (n0 + xr[j]) * body_scale, (n1 + xr[j + 1]) * body_scale
            x2, x3 = (n2 + xr[j + 2]) * body_scale, (n3 + xr[j + 3]) * body_scale
            if keep_total:
                kr[j], kr[j + 1], kr[j + 2], kr[j + 3] = x0, x1, x2, x3
            t[q], t[q + 1], t[q + 2], t[q + 3], s0, s1, s2, s3 = _atom_tail(x0, x1, x2, x3, h4, ws, j, s0, s1, s2, s3)
        sums[q], sums[q + 1], sums[q + 2], sums[q + 3] = s0, s1, s2, s3


@njit(**_F32_JIT)
def _rows_norm_kept(buf, inv, w, signs, n_out, m0, nr, k):
    """The last norm with its values kept (n2 = (total inv[m]) w stored),
    then through _h4 (times the signs, the stages within an atom): the
    rows' scale is in buf after this, not left to the store."""
    for m in range(nr):
        row, q, s = m0 + m, m * _INT32_C2, inv[m]
        no = n_out[row]
        for a in range(k // _INT32_C2):
            j, t = a * _INT32_C2, buf[a]
            n0, n1 = (t[q] * s) * w[j], (t[q + 1] * s) * w[j + 1]
            n2, n3 = (t[q + 2] * s) * w[j + 2], (t[q + 3] * s) * w[j + 3]
            no[j], no[j + 1], no[j + 2], no[j + 3] = n0, n1, n2, n3
            t[q], t[q + 1], t[q + 2], t[q + 3] = _h4(n0, n1, n2, n3, signs[j], signs[j + 1], signs[j + 2], signs[j + 3])
        inv[m] = np.float32(1.0)


@njit(**_F32_JIT)
def _atom_butterflies(buf, atoms, per, n):
    """The rotation's butterfly stages across atoms (channel distance >= 4)
    within each block of `per` atoms, on buf's atom rows [:n] (vector
    operations over whole rows), two stages a pass (as butterfly_stages)."""
    for a0 in range(0, atoms, per):
        h = 1
        while 2 * h < per:
            for i0 in range(a0, a0 + per, 4 * h):
                for q in range(i0, i0 + h):
                    p0, p1, p2, p3 = buf[q, :n], buf[q + h, :n], buf[q + 2 * h, :n], buf[q + 3 * h, :n]
                    for i in range(n):
                        x0, x1, x2, x3 = p0[i], p1[i], p2[i], p3[i]
                        b0, b1 = x0 + x1, x0 - x1
                        b2, b3 = x2 + x3, x2 - x3
                        p0[i] = b0 + b2
                        p2[i] = b0 - b2
                        p1[i] = b1 + b3
                        p3[i] = b1 - b3
            h *= 4
        if h < per:
            for q in range(a0, a0 + h):
                p0, p1 = buf[q, :n], buf[q + h, :n]
                for i in range(n):
                    x0, x1 = p0[i], p1[i]
                    p0[i] = x0 + x1
                    p1[i] = x0 - x1


@njit(**_F32_JIT)
def _residual_rotated_slab(src, extra, rs, ch, bias, first_norm, w1, e1, res, body_scale, last_norm, w2, ws, e2,
                           keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out,
                           signs, block, hnorm, m0, nr, buf, sums, inv, rotated):
    """residual_tiles' stretch for rows m0..m0+nr-1 from int32 atoms to a
    factor's rotated rows, in the atoms' own order: buf [K / 4, nr x 4] holds
    each atom's rows as they lie in the BO (row-major, 4 channels a row). The
    in edge and the Add go row by row (_rows_in_edge); the last norm's
    weights and the rotation's signs (ws = w2 x signs) and the two butterfly
    stages within an atom ride on the last pass's stores (_h4), and the
    norm's per-row scale, which commutes with the rotation, on the output's
    (with hnorm); the stages across atoms are vector operations on whole
    atom rows. Kept n2 (no model's int8 prefill keeps it) takes a pass of
    its own (_rows_norm_kept)."""
    k = res.shape[1]
    c2 = _INT32_C2
    atoms, n = k // c2, nr * c2
    h4 = not keep_n2
    if first_norm:  # x [kept]; n1 = RMSNorm(x, w1) [kept]; total = (n1 + res) scale [kept]
        _rows_in_edge(src, extra, rs, ch, bias, res, body_scale, False, keep_x, x_out, False, total_out, False, ws,
                      m0, nr, buf, sums)
        _inv_rms(sums, nr, k, e1, inv)
        _rows_norm_add(buf, inv, w1, res, body_scale, keep_n1, n1_out, keep_total, total_out, h4, ws, m0, nr, sums)
    else:  # x [kept]; total = (x + res) scale [kept]
        _rows_in_edge(src, extra, rs, ch, bias, res, body_scale, True, keep_x, x_out, keep_total, total_out, h4,
                      ws, m0, nr, buf, sums)
    if last_norm:
        _inv_rms(sums, nr, k, e2, inv)
    else:
        inv[:nr] = np.float32(1.0)
    if keep_n2:
        _rows_norm_kept(buf, inv, w2, signs, n2_out, m0, nr, k)
    per = block // c2  # atoms a block
    _atom_butterflies(buf, atoms, per, n)
    for a0 in range(0, atoms, per):  # each row's runs out, times its norm's scale and hnorm
        dst = rotated[a0 // per]
        for m in range(nr):
            o, q, s = (m0 + m) * block, m * c2, inv[m] * hnorm
            run = dst[o:o + block]
            for a in range(per):
                t, d = buf[a0 + a], a * c2
                run[d], run[d + 1], run[d + 2], run[d + 3] = t[q] * s, t[q + 1] * s, t[q + 2] * s, t[q + 3] * s


@njit(**_F32_JIT)
def _residual_rotated_rows(src, extra, rs, ch, bias, has_bias, first_norm, w1, e1, res, body_scale, last_norm,
                           w2, e2, keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out,
                           signs, block, hnorm, rotated, lo, hi):
    """residual_tiles' int32-in, rotated-out stretch over rows lo..hi-1, by
    slabs of _RESIDUAL_SLAB rows (_residual_rotated_slab)."""
    k = res.shape[1]
    src = np.ascontiguousarray(src)  # (the BO's atoms are: no copy)
    slab = min(_RESIDUAL_SLAB, max(hi - lo, 1))
    buf = np.empty((k // _INT32_C2, slab * _INT32_C2), np.float32)
    sums = np.empty(slab * _INT32_C2, np.float64)
    inv = np.empty(slab, np.float32)
    b = bias if has_bias else np.zeros(k, np.float32)
    ws = w2 * signs if last_norm else signs  # a sign's product is exact
    for m0 in range(lo, hi, slab):
        _residual_rotated_slab(src, extra, rs, ch, b, first_norm, w1, e1, res, body_scale, last_norm, w2, ws, e2,
                               keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out,
                               signs, block, hnorm, m0, min(slab, hi - m0), buf, sums, inv, rotated)


_SLAB_VALUES = 1 << 16  # rows x block of a rotated FFN slab: [block / 4, rows x 4] float32, 256 KB (an A76's
# L2 is 512 KB); 64 KB measured slower at block 512-1024 (slabs of 16-32 rows: short atom runs)


@njit(**_F32_JIT)
def _atom_scales(rs, ch, bias, has_bias, signs, signed, m0, nr, j, scale, offset):
    """One int32 atom's dequantization for rows m0..m0+nr-1 in the atom's own
    order (row-major, 4 channels a row): scale[i] = rs[m] * ch[j + b] (times
    the rotation's sign when `signed`), offset[i] = the bias (or 0; signed too)."""
    for m in range(nr):
        r = rs[m0 + m]
        for b in range(_INT32_C2):
            i = m * _INT32_C2 + b
            s, o = r * ch[j + b], bias[j + b] if has_bias else np.float32(0.0)
            scale[i] = s * signs[j + b] if signed else s  # a sign's product is exact: (x s + o) sign's bits
            offset[i] = o * signs[j + b] if signed else o


@njit(**_F32_JIT)
def _ffn_rotated_slab(gate, gate_rs, gate_ch, gate_bias, gate_has_bias, up, up_rs, up_ch, up_bias, up_has_bias,
                      act, c0, m0, nr, signs, block, hnorm, buf, dst_b):
    """ffn_tiles' rotated out edge for int32 gate and up, channels c0..c0+block-1
    of rows m0..m0+nr-1, in the atoms' own order: buf [block / 4, nr x 4] holds
    each atom's rows as they lie in the BO (row-major, 4 channels a row), so the
    in edges and act(gate) * up * signs are one contiguous vector loop an atom
    (no transposition), the butterflies across atoms (channel distance >= 4)
    are vector operations on whole atom rows, and the two within an atom (1,
    2) run as each row's 4 values go to dst_b[m * block + j] (times hnorm)."""
    atoms = block // _INT32_C2
    n = nr * _INT32_C2
    gs, go = np.empty(n, np.float32), np.empty(n, np.float32)
    us, uo = np.empty(n, np.float32), np.empty(n, np.float32)
    a0 = c0 // _INT32_C2
    for a in range(atoms):
        j = c0 + a * _INT32_C2
        _atom_scales(gate_rs, gate_ch, gate_bias, gate_has_bias, signs, False, m0, nr, j, gs, go)
        _atom_scales(up_rs, up_ch, up_bias, up_has_bias, signs, True, m0, nr, j, us, uo)
        g = gate[a0 + a, m0:m0 + nr].reshape(n)  # [nr, 4] int32, contiguous
        u = up[a0 + a, m0:m0 + nr].reshape(n)
        t = buf[a, :n]
        for i in range(n):
            t[i] = activation(np.float32(g[i]) * gs[i] + go[i], act) * (np.float32(u[i]) * us[i] + uo[i])
    _atom_butterflies(buf, atoms, atoms, n)  # the stages across atoms (channel distance >= 4)
    for m in range(nr):
        o, q = (m0 + m) * block, m * _INT32_C2
        for a in range(atoms):
            x0, x1, x2, x3 = buf[a, q], buf[a, q + 1], buf[a, q + 2], buf[a, q + 3]
            b0, b1 = x0 + x1, x0 - x1
            b2, b3 = x2 + x3, x2 - x3
            d = o + a * _INT32_C2
            dst_b[d] = (b0 + b2) * hnorm
            dst_b[d + 1] = (b1 + b3) * hnorm
            dst_b[d + 2] = (b0 - b2) * hnorm
            dst_b[d + 3] = (b1 - b3) * hnorm


@njit(**_F32_JIT)
def _ffn_rotated_rows(gate, gate_rs, gate_ch, gate_bias, gate_has_bias, up, up_rs, up_ch, up_bias, up_has_bias,
                      act, k, signs, block, hnorm, rotated, lo, hi):
    """ffn_tiles' int32-in, rotated-out stretch over rows lo..hi-1: each
    rotation block (outside: its atoms and its rotated rows are contiguous
    runs) by slabs of rows (inside) whose buffer stays within _SLAB_VALUES."""
    gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)  # (the BO's atoms are: no copy)
    slab = max(LANES, _SLAB_VALUES // block // LANES * LANES)
    buf = np.empty((block // _INT32_C2, min(slab, hi - lo) * _INT32_C2), np.float32)
    for c0 in range(0, k, block):
        for m0 in range(lo, hi, slab):
            _ffn_rotated_slab(gate, gate_rs, gate_ch, gate_bias, gate_has_bias, up, up_rs, up_ch, up_bias,
                              up_has_bias, act, c0, m0, min(slab, hi - m0), signs, block, hnorm, buf,
                              rotated[c0 // block])


_MIX_COLUMNS = 1024  # columns of a factor's passes at once: [m, 1024] float32 scratch, 140 KB at m = 35 (L2)


@njit(**_F32_JIT)
def _mix_pass(src, rows, h, s0, w, dst, drows, d0):
    """dst[drows[k], d0:d0 + w] = sum_n h[k, n] src[rows[n], s0:s0 + w] (rows of C-order 2-d arrays: each run
    a contiguous 1-d view taken as a slice first, so each multiply-add pass is one vector loop: indexed
    src[r, s0 + j], a possibly negative index (numba wraps those) kept it scalar, 2.5x the time)."""
    for k in range(h.shape[0]):
        d = dst[drows[k], d0:d0 + w]
        c, s = h[k, 0], src[rows[0], s0:s0 + w]
        for j in range(w):
            d[j] = c * s[j]
        n = 1
        while n + 1 < h.shape[1]:  # two inputs a pass: half the accumulator's loads and stores
            c, s, c1, s1 = h[k, n], src[rows[n], s0:s0 + w], h[k, n + 1], src[rows[n + 1], s0:s0 + w]
            for j in range(w):
                d[j] += c * s[j] + c1 * s1[j]
            n += 2
        if n < h.shape[1]:
            c, s = h[k, n], src[rows[n], s0:s0 + w]
            for j in range(w):
                d[j] += c * s[j]


@njit(**_F32_JIT)
def _run_peaks(run, c0, block, row0, peak):
    """peak[m - row0] = max(itself, the largest magnitude's bits of row m's values in `run`), `run`
    holding columns c0.. of a row of blocks (row m: columns m block..(m + 1) block - 1), read right
    after the pass that wrote it (in L1); nothing when peak is empty."""
    if peak.shape[0] == 0:
        return
    bits, w, j = run.view(np.uint32), run.shape[0], 0
    while j < w:
        m = (c0 + j) // block
        e = min(w, (m + 1) * block - c0)
        peak[m - row0] = _magnitude_peak(bits[j:e], peak[m - row0])
        j = e


@njit(**_F32_JIT)
def factor_mix(x, out, factor, h1, h2, pin, pout, lo, hi, block, row0, peak):
    """out[:, lo:hi] = factor @ x[:, lo:hi] (x and out C order, [m, columns]):
    in prime-factor form when h1 has rows (hartley_mix), else the factor's
    product, two inputs a pass; with a non-empty `peak`, the largest
    magnitude's bits of each row of blocks (columns m block..: row m,
    peak[m - row0]) taken from the last pass's output while in L1
    (_run_peaks), not by another pass over `out`."""
    if h1.shape[0] > 0:
        hartley_mix(x, out, h1, h2, pin, pout, lo, hi, block, row0, peak)
        return
    m = factor.shape[0]
    rows = np.arange(m)
    for c0 in range(lo, hi, _MIX_COLUMNS):
        w = min(_MIX_COLUMNS, hi - c0)
        _mix_pass(x, rows, factor, c0, w, out, rows, c0)
        for r in range(m):
            _run_peaks(out[r, c0:c0 + w], c0, block, row0, peak)


@njit(**_F32_JIT)
def hartley_mix(x, out, h1, h2, pin, pout, lo, hi, block, row0, peak):
    """out[:, lo:hi] = H_m x[:, lo:hi] for the order-m Hartley factor in its
    prime-factor form (hadamard.hartley_split: m = m1 m2 coprime, h1 and h2
    their orthonormal Hartley matrices, pin and pout the index maps): H_m1
    along n1, H_m2 along n2, then the four-term cas identity; m1 + m2
    multiply-adds a value where numpy's product takes m (x and out C order,
    [m, columns]); the peaks as factor_mix's."""
    m1, m2 = h1.shape[0], h2.shape[0]
    t = np.empty((m1 * m2, _MIX_COLUMNS), np.float32)  # row k1 m2 + n2: H_m1 applied
    u = np.empty((m1 * m2, _MIX_COLUMNS), np.float32)  # row k1 m2 + k2: then H_m2
    half = np.float32(0.5)
    stride = np.arange(m1) * m2
    for c0 in range(lo, hi, _MIX_COLUMNS):
        w = min(_MIX_COLUMNS, hi - c0)
        for n2 in range(m2):
            _mix_pass(x, pin[:, n2], h1, c0, w, t, stride + n2, 0)
        for k1 in range(m1):
            r = np.arange(m2) + k1 * m2
            _mix_pass(t, r, h2, 0, w, u, r, 0)
        for k1 in range(m1):
            r1 = (m1 - k1) % m1
            for k2 in range(m2):
                r2 = (m2 - k2) % m2
                a, b, e, f = u[k1 * m2 + k2], u[r1 * m2 + k2], u[k1 * m2 + r2], u[r1 * m2 + r2]
                o = out[pout[k1, k2], c0:c0 + w]
                for j in range(w):
                    o[j] = half * ((a[j] + b[j]) + (e[j] - f[j]))
                _run_peaks(o, c0, block, row0, peak)
