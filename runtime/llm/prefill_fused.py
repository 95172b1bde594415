"""Compiled (numba) kernels of prefill's fused residual stretch
(runtime/llm/fused_rows.py): in edge (an fp16 NPU output widened, or int32
accumulators dequantized, read straight from the BO's atoms), [RMSNorm],
the residual Add, RMSNorm, out edge (narrowed to fp16, or rotated and
quantized to int8, written straight into the next segment's atoms), one
tile of `LANES` rows at a time, the tile staying in the core's cache from
the first step to the last; an int32 in edge to a block-mixing factor's
rotation goes by slabs of rows in the atoms' own order instead
(`_residual_rotated_rows`).

The values are float32 computations within float32 tolerance of the
per-step path (issue 37; tests/llm/test_prefill_fused.py states the
tolerances). A rotation with a block-mixing factor leaves its rotated rows
for the caller's numpy product (BLAS's sums) and
`quantize_blocks_into_atoms` takes them from there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import narrow_value, widen_value
from rkc.runtime.llm.prefill_kernels import (LANES, _butterflies, _load_tile, _signed_tile, butterfly_stages, exp_f32,
                                             scaled_amax)

_JIT = {"cache": True, "nogil": True}

IN_HALF, IN_DEQUANT = 0, 1
OUT_HALF, OUT_QUANT, OUT_ROTATED = 0, 1, 2  # fp16 atoms; int8 atoms (+ scale); rotated rows for a factor


@njit(**_JIT)
def _normalise(buf, k, w, eps, sums):
    """buf = rms_norm of each lane, float32 values over a float64 sum of
    squares (`sums`: LANES float64 scratch): within float32 rounding of a
    float64 reference, each pass one vector loop over the lanes (indexed
    buf[i, lane]: a row view per i costs more than the row's arithmetic).
    The lane loops run to sums' length, not the constant LANES: LLVM unrolls
    a constant 16-trip loop and its SLP pass, unable to prove the scratch
    rows and the tile apart, left the scale pass scalar; a run-time trip
    count goes to the loop vectoriser, which tests the overlap at run time
    (0.55-0.65x the time, the same bits)."""
    lanes = sums.shape[0]
    for lane in range(lanes):
        sums[lane] = 0.0
    for i in range(k):
        for lane in range(lanes):
            v = np.float64(buf[i, lane])
            sums[lane] += v * v
    inv = np.empty(lanes, np.float32)
    for lane in range(lanes):
        inv[lane] = np.float32(1.0 / np.sqrt(np.float64(np.float32(sums[lane] / k) + eps)))
    for i in range(k):  # every lane (a full vector; lanes past r are never read)
        wi = w[i]
        for lane in range(lanes):
            buf[i, lane] = (buf[i, lane] * inv[lane]) * wi


@njit(**_JIT)
def _store(buf, m0, r, k, out):
    """out[m0 + lane, i] = buf[i, lane], in out's memory order (a
    column-major out takes each channel's lanes as one contiguous run).
    A column-major array is read and written here and in _scaled_body
    through its transpose's row slices (out.T[i, m0:m0 + r], indexed by the
    lane): indexed out[m0 + lane, i], a possibly negative index (numba
    wraps those) kept the loop scalar, ~0.85 ns a value; as runs the store
    and the residual's Add take ~0.4 (Gemma 3 270M's 128 x 640 stretch,
    one thread, old and new alternating: 331 -> 251 us)."""
    if out.strides[0] < out.strides[1]:  # out.T's rows: runs indexed by the loop's counter (below)
        out_t = out.T
        for i in range(k):
            row, run = buf[i], out_t[i, m0:m0 + r]
            for lane in range(r):
                run[lane] = row[lane]
        return
    for lane in range(r):
        for i in range(k):
            out[m0 + lane, i] = buf[i, lane]


@njit(**_JIT)
def _load_in(kind, atoms, extra, row_scale, ch, bias, has_bias, m0, r, k, buf):
    """buf[j, lane] = the in edge's value of row m0 + lane, channel j, float32:
    fp16 atoms widened, or int32 accumulators (plus `extra`'s, a second K
    partial, when it has rows) times the row's and the channel's scale (+ bias)."""
    c1, _, c2 = atoms.shape
    if kind == IN_HALF:  # each atom's [r, C2] block widened into a [LANES, C2] tile, then transposed into buf
        lanes = buf.shape[1]  # LANES (a tile), or r (a caller's view of its rows)
        tmp = np.zeros((LANES, c2), np.float32)
        flat = tmp.ravel()
        for a in range(c1):
            base = a * c2
            block = atoms[a, m0:m0 + r].ravel()  # the atom's r rows: one contiguous run (_widen_rows)
            for t in range(r * c2):
                flat[t] = widen_value(np.uint16(block[t]))
            for b in range(min(c2, k - base)):
                row = buf[base + b]
                for lane in range(lanes):
                    row[lane] = tmp[lane, b]
        return
    partial = extra.shape[1] > 0
    rs = np.empty(LANES, np.float32)
    for lane in range(r):
        rs[lane] = row_scale[m0 + lane]
    if not partial and r == LANES:  # one int32 each (exact in float32 up to 2^24, as the int64 path rounds)
        for a in range(c1):
            base = a * c2
            for b in range(min(c2, k - base)):
                j = base + b
                cs = ch[j]
                bj = bias[j] if has_bias else np.float32(0.0)
                for lane in range(LANES):
                    buf[j, lane] = np.float32(atoms[a, m0 + lane, b]) * (rs[lane] * cs) + bj
        return
    for a in range(c1):
        base = a * c2
        for b in range(min(c2, k - base)):
            j = base + b
            cs = ch[j]
            bj = bias[j] if has_bias else np.float32(0.0)
            for lane in range(r):
                acc = np.int64(atoms[a, m0 + lane, b])
                if partial:
                    acc += np.int64(extra[a, m0 + lane, b])
                buf[j, lane] = np.float32(acc) * (rs[lane] * cs) + bj


@njit(**_JIT)
def _residual_body(buf, m0, r, k, first_norm, w1, e1, res, w2, e2, keep_x, keep_n1, keep_total, keep_n2,
                   x_out, n1_out, total_out, n2_out, sums):
    """A residual stretch's body on one loaded tile `buf` [K, LANES] (rows
    m0..m0+r-1): [n1 = RMSNorm(x, w1)], total = n1 + res, n2 = RMSNorm(total,
    w2), in place; each value kept is stored [M, K]. Shared by the int8/fp16
    and the int4 (int4_prefill) stretches, which differ only in their edges."""
    _scaled_body(buf, m0, r, k, first_norm, w1, e1, res, np.float32(1.0), False, True, w2, e2,
                 keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out, sums)


@njit(**_JIT)
def _scaled_body(buf, m0, r, k, first_norm, w1, e1, res, scale, has_scale, last_norm, w2, e2,
                 keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out, sums):
    """_residual_body with Gemma 4's parts: total = (n1 + res) [x scale] in
    one pass (the unscaled sum is never stored: the matcher declines a
    stretch that reads it), then [n2 = RMSNorm(total, w2)] (`last_norm`;
    without it the tile ends as total, which the out edge reads)."""
    if keep_x:
        _store(buf, m0, r, k, x_out)
    if first_norm:
        _normalise(buf, k, w1, e1, sums)
        if keep_n1:
            _store(buf, m0, r, k, n1_out)
    res_t = res.T  # its rows' runs (see _store)
    for i in range(k):
        row, run = buf[i], res_t[i, m0:m0 + r]
        if has_scale:
            for lane in range(r):
                row[lane] = (row[lane] + run[lane]) * scale
        else:
            for lane in range(r):
                row[lane] = row[lane] + run[lane]
    if keep_total:
        _store(buf, m0, r, k, total_out)
    if last_norm:
        _normalise(buf, k, w2, e2, sums)
        if keep_n2:
            _store(buf, m0, r, k, n2_out)


@njit(**_JIT)
def residual_tiles(in_kind, src, extra, row_scale, ch, bias, has_bias,
                   first_norm, w1, e1, res, body_scale, has_scale, last_norm, w2, e2,
                   keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out,
                   out_kind, dst, signs, block, hnorm, scale, rotated, tile_lo, tile_hi):
    """The residual stretch over rows [M, K] (M = res's rows) of an NPU
    output `src` [C1, R, C2] (fp16 bits, widened, or int32 dequantized, with
    `extra`'s accumulators added when it has rows: a second K partial): x;
    n1 = RMSNorm(x, w1) (`first_norm`, else n1 is x); total = n1 + res
    (times `body_scale` when `has_scale`: Gemma 4's layer output scale);
    n2 = RMSNorm(total, w2) (`last_norm`, else n2 is total); each kept one
    stored [M, K]. Then n2 into the next segment's atoms `dst` [C1', R', C2'] (fp16 bits),
    or rotated (signs, butterflies of `block`, times `hnorm`) and quantized
    to int8 with one scale per row (`scale`), or rotated into `rotated`
    [K / block, M x block] (a factor's product follows, then
    quantize_blocks_into_atoms). The atoms' rows
    past M and channels past K are zeroed (by the call whose range ends at
    the last tile). Tiles of LANES rows, tile_lo..tile_hi-1: disjoint
    ranges may run at once on other threads (runtime/llm/threads.py); the in
    edge's arithmetic is float32 (`_load_in`, not the per-step bits)."""
    rows, k = res.shape
    tiles = (rows + LANES - 1) // LANES
    if residual_by_rows(in_kind, src, out_kind, block):  # the atoms' own order (_residual_rotated_rows)
        unit = body_scale if has_scale else np.float32(1.0)
        _residual_rotated_rows(src, extra, row_scale, ch, bias, has_bias, first_norm, w1, e1, res, unit, last_norm,
                               w2, e2, keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out,
                               signs, block, hnorm, rotated, tile_lo * LANES, min(rows, tile_hi * LANES))
        return
    buf = np.empty((k, LANES), np.float32)
    bits = buf.view(np.uint32)
    sums = np.empty(LANES, np.float64)
    amax = np.empty(LANES, np.float32)
    # the rotation's signs in the last norm's weights when n2 is not kept (a sign's product is exact: the
    # same values, one pass over the tile fewer)
    signed = out_kind != OUT_HALF and last_norm and not keep_n2
    w_last = w2 * signs if signed else w2
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        for i in range(k):  # lanes past r: zeros (their sums are never used)
            for lane in range(r, LANES):
                buf[i, lane] = np.float32(0.0)
        _load_in(in_kind, src, extra, row_scale, ch, bias, has_bias, m0, r, k, buf)
        _scaled_body(buf, m0, r, k, first_norm, w1, e1, res, body_scale, has_scale, last_norm, w_last, e2,
                     keep_x, keep_n1, keep_total, keep_n2, x_out, n1_out, total_out, n2_out, sums)
        _out_edge(buf, bits, m0, r, k, out_kind, dst, signs, signed, block, hnorm, scale, rotated, amax)
    if out_kind != OUT_ROTATED and tile_hi == tiles:
        zero_rows(dst, rows)


# -- the residual stretch from int32 atoms to a factor's rotated rows, in the atoms' own order ---------------
# (Qwen2.5's and Gemma 4's int8 stretches at n_embd 1536 = C12 (x) H128.) The tiles above transpose twice:
# the atoms' [rows, 4] runs into [K, LANES] (a strided gather, ~1.1 ns a value) and the rotated tile back
# into rows by blocks (a scalar strided store), over a [1536, 16] tile (96 KB) past L1 in every pass.

_RESIDUAL_SLAB = 16  # rows a slab: [K / 4, 64] float32 (96 KB at K = 1536, in L2)


@njit(**_JIT)
def residual_by_rows(in_kind, src, out_kind, block):
    """Whether residual_tiles takes the stretch row by row in the atoms' order
    (_residual_rotated_rows: int32 atoms in, a factor's rotated rows out);
    its residual and kept values are best C order then (rows contiguous),
    the tiles' F order (a tile's lanes contiguous)."""
    return (in_kind == IN_DEQUANT and out_kind == OUT_ROTATED and src.shape[2] == _INT32_C2
            and block % _INT32_C2 == 0)


@njit(**_JIT)
def _inv_rms(sums, nr, k, eps, inv):
    """inv[m] = 1 / sqrt(mean square + eps) of rows m < nr from their four
    float64 partial sums of squares sums[4 m..4 m + 3] (as _normalise's)."""
    for m in range(nr):
        s = (sums[4 * m] + sums[4 * m + 1]) + (sums[4 * m + 2] + sums[4 * m + 3])
        inv[m] = np.float32(1.0 / np.sqrt(np.float64(np.float32(s / k) + eps)))


@njit(**_JIT)
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


@njit(**_JIT)
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
    norm: one function with a flag choosing the source was not unswitched
    by LLVM (the passes cost 2x, the same bits)."""
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
            if h4:
                t[q], t[q + 1], t[q + 2], t[q + 3] = _h4(x0, x1, x2, x3, ws[j], ws[j + 1], ws[j + 2], ws[j + 3])
            else:
                t[q], t[q + 1], t[q + 2], t[q + 3] = x0, x1, x2, x3
            s0 += np.float64(x0) * np.float64(x0)
            s1 += np.float64(x1) * np.float64(x1)
            s2 += np.float64(x2) * np.float64(x2)
            s3 += np.float64(x3) * np.float64(x3)
        sums[q], sums[q + 1], sums[q + 2], sums[q + 3] = s0, s1, s2, s3


@njit(**_JIT)
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
            if h4:
                t[q], t[q + 1], t[q + 2], t[q + 3] = _h4(x0, x1, x2, x3, ws[j], ws[j + 1], ws[j + 2], ws[j + 3])
            else:
                t[q], t[q + 1], t[q + 2], t[q + 3] = x0, x1, x2, x3
            s0 += np.float64(x0) * np.float64(x0)
            s1 += np.float64(x1) * np.float64(x1)
            s2 += np.float64(x2) * np.float64(x2)
            s3 += np.float64(x3) * np.float64(x3)
        sums[q], sums[q + 1], sums[q + 2], sums[q + 3] = s0, s1, s2, s3


@njit(**_JIT)
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


@njit(**_JIT)
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


@njit(**_JIT)
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


@njit(**_JIT)
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


@njit(**_JIT)
def in_edge_tiles(in_kind, src, extra, row_scale, ch, bias, has_bias, out_t, tile_lo, tile_hi):
    """A many-row in edge on its own (a stretch no fuser took whole): the NPU
    output `src`'s atoms (fp16 widened, or int32 dequantized, `_load_in`'s
    float32 arithmetic) into column-major rows, given as out_t [K, M] (their
    transpose, C order: a tile's lanes contiguous, as the per-step path's
    column-major output), tiles tile_lo..tile_hi-1."""
    k, rows = out_t.shape
    if in_kind == IN_HALF:
        _widen_rows(src, k, tile_lo * LANES, min(rows, tile_hi * LANES), out_t)
        return
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        _load_in(in_kind, src, extra, row_scale, ch, bias, has_bias, m0, r, k, out_t[:, m0:m0 + r])


@njit(**_JIT)
def _widen_rows(atoms, k, r0, r1, out_t):
    """out_t[j, r0:r1] = channel j of fp16 atoms [C1, R, C2] (bits), rows
    r0..r1-1, widened: each atom's rows (one contiguous run of (r1 - r0) x C2
    halves) widened in one vector pass into a float32 block, whose C2
    columns are then copied into out_t's rows as runs. Per tile of LANES
    rows (_load_in's way: runs of C2 halves, and a strided view of out_t
    numba could not vectorise) it cost 1.65x (Gemma 3 270M's q, 128 x 1024:
    137 -> 83 us, one thread)."""
    c1, _, c2 = atoms.shape
    n = r1 - r0
    tmp = np.empty((n, c2), np.float32)
    flat = tmp.ravel()
    for a in range(c1):
        base = a * c2
        block = atoms[a, r0:r1].ravel()
        for t in range(n * c2):
            flat[t] = widen_value(np.uint16(block[t]))
        for b in range(min(c2, k - base)):
            run = out_t[base + b, r0:r1]
            for t in range(n):
                run[t] = tmp[t, b]


@njit(**_JIT)
def out_edge_tiles(x, out_kind, dst, signs, block, hnorm, scale, rotated, tile_lo, tile_hi):
    """A many-row out edge on its own: rows x [M, K] into the next segment's
    atoms as residual_tiles' out edge writes them (fp16; rotated and
    quantized; or rotated by blocks for a factor's product), tiles
    tile_lo..tile_hi-1; the padding rows zeroed by the call ending at the last tile."""
    rows, k = x.shape
    tiles = (rows + LANES - 1) // LANES
    buf = np.empty((k, LANES), np.float32)
    amax = np.empty(LANES, np.float32)
    signed = out_kind != OUT_HALF  # the rotation's signs taken in the transposing load
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        if signed:
            _signed_tile(x, signs, m0, r, buf)
        else:
            _load_tile(x, m0, r, buf)
        _out_edge(buf, buf.view(np.uint32), m0, r, k, out_kind, dst, signs, signed, block, hnorm, scale, rotated,
                  amax)
    if out_kind != OUT_ROTATED and tile_hi == tiles:
        zero_rows(dst, rows)


@njit(**_JIT)
def half_rows_into_atoms(x, dst, tile_lo, tile_hi):
    """Rows of x [M, K] (float32, C order) narrowed to fp16 (fptrunc: numpy's
    values, a NaN's payload not kept) into the next segment's atoms dst
    [C1, R, C2] (bits), tiles tile_lo..tile_hi-1 of LANES rows: each row
    narrowed into a [LANES, C1 x C2] tile in one contiguous vector pass, then
    the tile's C2-channel runs copied atom by atom (LANES rows of one atom
    contiguous in dst). Channels past K zeroed; the atoms' rows past M
    zeroed by the call whose range ends at the last tile. 0.5-0.7x the
    plan's bit-exact writer (half.narrow_into_atoms: a scalar select per
    value) over Gemma 3 270M's 128 x 1024 attention output."""
    rows, k = x.shape
    c1, _, c2 = dst.shape
    tile = np.zeros((LANES, c1 * c2), np.uint16)  # channels past K stay 0
    for t in range(tile_lo, tile_hi):
        m0 = t * LANES
        r = min(LANES, rows - m0)
        for lane in range(r):
            src, half = x[m0 + lane], tile[lane]
            for i in range(k):
                half[i] = narrow_value(src[i])
        for a in range(c1):
            block = dst[a]
            for lane in range(r):
                d, run = block[m0 + lane], tile[lane, a * c2:(a + 1) * c2]
                for b in range(c2):
                    d[b] = run[b]
    if tile_hi == (rows + LANES - 1) // LANES:
        zero_rows(dst, rows)


@njit(**_JIT)
def _rotate_tile(buf, m0, r, k, signs, signed, block, hnorm, to_blocks, rotated):
    """A tile's rows buf [K, LANES] rotated in place: the signs (unless
    `signed`: in buf already), the butterflies of `block`; with `to_blocks`,
    then times hnorm by blocks into rotated[b, m * block + j] (the factor's
    product follows, one GEMM over every row) and True; else False."""
    if not signed:
        for i in range(k):
            for lane in range(LANES):
                buf[i, lane] = buf[i, lane] * signs[i]
    _butterflies(buf, block)
    if not to_blocks:
        return False
    for b in range(k // block):  # the block's tile rows and each row's run as views: indexing buf and rotated
        src, dst_b = buf[b * block:(b + 1) * block], rotated[b]  # 2-d in the loop cost out_edge_tiles 1.3x (128 x 1536)
        for lane in range(r):
            run = dst_b[(m0 + lane) * block:(m0 + lane + 1) * block]
            for j in range(block):
                run[j] = src[j, lane] * hnorm
    return True


@njit(**_JIT)
def _tile_scales(buf, hnorm, amax, limit, scale, m0, r):
    """Each row's scale max|x * hnorm| / limit (1 for a zero row or one holding
    a NaN), stored in scale[m0 + lane] for the r rows, returned for all lanes."""
    scaled_amax(buf, hnorm, amax)
    s = np.empty(LANES, np.float32)
    for lane in range(LANES):
        s[lane] = amax[lane] / limit if amax[lane] > 0 else np.float32(1.0)
    for lane in range(r):
        scale[m0 + lane] = s[lane]
    return s


@njit(**_JIT)
def _quantize_tile(buf, m0, r, k, dst, hnorm, scale, amax):
    """A rotated tile's rows buf [K, LANES] (times hnorm) quantized to int8
    with one scale per row (stored in scale[m0..]) into the atoms dst."""
    s = _tile_scales(buf, hnorm, amax, np.float32(127.0), scale, m0, r)
    # atom by atom: its channels' x / s into a [LANES, C2] tile (vector loops over the lanes), then each row's
    # codes written as one contiguous run (a [K, LANES] int8 tile copied into the atoms byte by byte cost ~2x)
    c1, _, c2 = dst.shape
    ratio = np.empty((LANES, c2), np.float32)
    for a in range(c1):
        n = min(c2, k - a * c2)
        for b in range(n):
            col = buf[a * c2 + b]
            for lane in range(s.shape[0]):  # a run-time length: the loop vectoriser's (see _normalise)
                ratio[lane, b] = col[lane] / s[lane]
        for lane in range(r):
            d, t = dst[a, m0 + lane], ratio[lane]
            for b in range(n):
                d[b] = np.int8(min(max(np.rint(t[b]), np.float32(-127.0)), np.float32(127.0)))
            for b in range(max(n, 0), c2):  # channels past K: zeros
                d[b] = 0


@njit(**_JIT)
def _out_edge(buf, bits, m0, r, k, out_kind, dst, signs, signed, block, hnorm, scale, rotated, amax):
    """A tile's rows buf [K, LANES] (bits: its uint32 view) into the next
    segment's atoms dst (fp16 narrowed, or rotated and quantized with their
    scales), or rotated into `rotated` [K / block, M x block] by blocks (for
    a factor's product, one GEMM over every row). `signed`: the rotation's
    signs are in buf already (the caller's last pass multiplied them in)."""
    if out_kind == OUT_HALF:  # each atom's channels narrowed into a [LANES, C2] tile, then its rows copied
        c1, _, c2 = dst.shape
        tmp = np.zeros((LANES, c2), np.uint16)  # channels past K: zeros
        for a in range(c1):
            for b in range(min(c2, k - a * c2)):
                col = buf[a * c2 + b]
                for lane in range(LANES):
                    tmp[lane, b] = narrow_value(col[lane])
            block = dst[a]
            for lane in range(r):
                d, t = block[m0 + lane], tmp[lane]
                for b in range(c2):
                    d[b] = t[b]
        return
    if _rotate_tile(buf, m0, r, k, signs, signed, block, hnorm, out_kind == OUT_ROTATED, rotated):
        return
    _quantize_tile(buf, m0, r, k, dst, hnorm, scale, amax)


@njit(**_JIT)
def zero_rows(dst, rows):
    """The atoms' rows from `rows` on (a GEMM operand's padding rows) zeroed."""
    c1, stored, c2 = dst.shape
    for a in range(c1):
        for m in range(rows, stored):
            for b in range(c2):
                dst[a, m, b] = 0


_MAGNITUDE = np.uint32(0x7FFFFFFF)  # a float32's bits without the sign


@njit(**_JIT)
def _magnitude_peak(run, peak):
    """max(peak, the largest |value| of `run` as float32 bits without the sign):
    an unsigned maximum orders non-negative floats as the floats (+inf the
    largest), and a NaN's bits lie above +inf's, so a NaN stays the maximum
    (jit.quantize_rows' amax). An integer reduction vectorises; the float
    select with its NaN test (the previous form) stayed scalar: ~80 % of the
    codes' time (1.06 of 1.33 ms over 128 x 8960)."""
    for i in range(run.shape[0]):
        v = run[i] & _MAGNITUDE
        peak = v if v > peak else peak
    return peak


@njit(**_JIT)
def quantize_blocks_into_atoms(x, block, q, scale, lo, hi):
    """quantize_into_atoms of rows lo..hi-1 of [M, K] given by blocks, x [K /
    block, M x block] (row m's block b: x[b, m * block:(m + 1) * block]);
    the padding rows zeroed by the call whose range ends at M. Two passes in
    x's memory order (a row's blocks lie M x block apart: row by row, every
    block is a fresh page), the first keeping each row's largest magnitude
    (_magnitude_peak: a NaN kept), the second writing the codes one atom (C2 channels,
    contiguous on both sides) at a time when a block is a whole number of
    atoms (block and C2 powers of two, block >= C2)."""
    blocks = x.shape[0]
    rows = x.shape[1] // block
    c1, _, c2 = q.shape
    k = blocks * block
    bits = x.view(np.uint32)
    peak = np.zeros(hi - lo, np.uint32)
    for b in range(blocks):
        for m in range(lo, hi):
            peak[m - lo] = _magnitude_peak(bits[b, m * block:(m + 1) * block], peak[m - lo])
    amaxes = peak.view(np.float32)
    for m in range(lo, hi):
        amax = amaxes[m - lo]
        scale[m] = amax / np.float32(127.0) if amax > 0 else np.float32(1.0)
    if block % c2 == 0:
        for b in range(blocks):
            for m in range(lo, hi):
                s, base = scale[m], m * block
                for j0 in range(0, block, c2):
                    # an atom's run and its source as 1-d views: the loop vectorises (4 vdivps a run of 32,
                    # indexed 3-d it stayed mostly scalar: 0.59 against 0.35 ms over 128 x 8960)
                    qa, xs = q[(b * block + j0) // c2, m], x[b, base + j0:base + j0 + c2]
                    for c in range(c2):
                        t = np.rint(xs[c] / s)
                        qa[c] = np.int8(min(max(t, np.float32(-127.0)), np.float32(127.0)))
        for a in range(k // c2, c1):  # atoms past K
            for m in range(lo, hi):
                for c in range(c2):
                    q[a, m, c] = 0
    else:
        for m in range(lo, hi):
            s = scale[m]
            for a in range(c1):
                for c in range(c2):
                    i = a * c2 + c
                    if i < k:
                        t = np.rint(x[i // block, m * block + i % block] / s)
                        q[a, m, c] = np.int8(min(max(t, np.float32(-127.0)), np.float32(127.0)))
                    else:
                        q[a, m, c] = 0
    if hi == rows:
        zero_rows(q, rows)


@njit(**_JIT)
def quantize_into_atoms(x, q, scale):
    """jit.quantize_rows of x [M, K] (C order) with the codes written into
    int8 atoms q [C1, R, C2] (channels past K and rows past M zeroed)."""
    rows, k = x.shape
    c1, _, c2 = q.shape
    for m in range(rows):
        amax = np.float32(0.0)
        for i in range(k):
            a = abs(x[m, i])
            if a > amax or a != a:
                amax = a
        s = amax / np.float32(127.0) if amax > 0 else np.float32(1.0)
        scale[m] = s
        for a in range(c1):
            for b in range(c2):
                j = a * c2 + b
                if j < k:
                    t = np.rint(x[m, j] / s)
                    q[a, m, b] = np.int8(min(max(t, np.float32(-127.0)), np.float32(127.0)))
                else:
                    q[a, m, b] = 0
    zero_rows(q, rows)


# -- the gated FFN's stretch of many rows: float32, threaded over tiles -----------------------------------
# Unlike the stretches above, these kernels are not held to the per-step kernels' bits (issue 37): each
# value is a float32 computation within a few float32 ulps of a float64 reference
# (tests/llm/test_prefill_ffn.py states the tolerances), and the tiles are shared among numba's threads.

ACT_SILU, ACT_GELU_TANH = 0, 1
_GELU_C = np.float32(0.7978845608028654)  # sqrt(2 / pi)
_GELU_K = np.float32(0.044715)
_FFN_JIT = {**_JIT, "error_model": "numpy"}  # divisions without a zero check (Python's error model): they vectorise
_CHUNK = 256  # channels of an fp16 FFN stretch taken at once: [256, LANES] float32, 16 KB a buffer (L1)


@njit(**_FFN_JIT)
def _act_mul(g, u, act, signs, signed):
    """g = act(g) * u (times the rotation's signs when `signed`), one pass
    over the tile [K, LANES]: exp (exp_f32, exp_into's arithmetic) inlined,
    each row's LANES lanes one vector loop."""
    for i in range(g.shape[0]):
        si = signs[i] if signed else np.float32(1.0)
        for lane in range(LANES):
            x = g[i, lane]
            if act == ACT_SILU:  # x / (1 + exp(-x))
                t = -x
            else:  # 0.5 x (1 + tanh(y)) = x / (1 + exp(-2y)), y = C (x + K x^3)
                t = np.float32(-2.0) * _GELU_C * (x + _GELU_K * x * x * x)
            g[i, lane] = x / (np.float32(1.0) + exp_f32(t)) * (u[i, lane] * si)


_INT32_C2 = 4  # channels of an int32 atom (16 bytes)
_SLAB_VALUES = 1 << 16  # rows x block of a rotated FFN slab: [block / 4, rows x 4] float32, 256 KB (an A76's
# L2 is 512 KB); 64 KB measured slower at block 512-1024 (slabs of 16-32 rows: short atom runs)


@njit(**_FFN_JIT)
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


@njit(**_FFN_JIT)
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
            x = np.float32(g[i]) * gs[i] + go[i]
            if act == ACT_SILU:  # x / (1 + exp(-x))
                e = -x
            else:  # 0.5 x (1 + tanh(y)) = x / (1 + exp(-2y)), y = C (x + K x^3)
                e = np.float32(-2.0) * _GELU_C * (x + _GELU_K * x * x * x)
            t[i] = x / (np.float32(1.0) + exp_f32(e)) * (np.float32(u[i]) * us[i] + uo[i])
    h = 1  # in atoms: channel distance 4 h
    while 2 * h < atoms:  # two stages a pass, as butterfly_stages
        for i0 in range(0, atoms, 4 * h):
            for j in range(i0, i0 + h):
                p0, p1, p2, p3 = buf[j, :n], buf[j + h, :n], buf[j + 2 * h, :n], buf[j + 3 * h, :n]
                for i in range(n):
                    x0, x1, x2, x3 = p0[i], p1[i], p2[i], p3[i]
                    b0, b1 = x0 + x1, x0 - x1
                    b2, b3 = x2 + x3, x2 - x3
                    p0[i] = b0 + b2
                    p2[i] = b0 - b2
                    p1[i] = b1 + b3
                    p3[i] = b1 - b3
        h *= 4
    if h < atoms:
        for j in range(h):
            p0, p1 = buf[j, :n], buf[j + h, :n]
            for i in range(n):
                x0, x1 = p0[i], p1[i]
                p0[i] = x0 + x1
                p1[i] = x0 - x1
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


@njit(**_FFN_JIT)
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


@njit(**_FFN_JIT)
def ffn_tiles(in_kind, gate_src, gate_extra, gate_rs, gate_ch, gate_bias, gate_has_bias,
              up_src, up_extra, up_rs, up_ch, up_bias, up_has_bias, act, rows, k,
              out_kind, dst, signs, block, hnorm, scale, rotated, tile_lo, tile_hi):
    """The gated FFN's stretch over rows [rows, K]: gate and up read from
    their NPU outputs' atoms (fp16 widened, or int32 dequantized: `_load_in`), act(gate)
    * up (act: SiLU x / (1 + exp(-x)), or GELU's tanh form), then into the
    next segment's atoms as residual_tiles' out edge writes them (fp16; int8
    rotated and quantized, one scale per row; or rotated rows for a factor's
    product). Tiles of LANES rows, tile_lo..tile_hi-1 (as residual_tiles).
    A tile goes through by chunks of channels, each from the atoms to its
    output while in L1 (gate and up of a whole tile are 573 KB each at K =
    8960, past an A76's 512 KB L2): a rotation block for a factor's product,
    _CHUNK channels for fp16; int8 codes without a factor take whole rows
    (a row's scale comes before its codes). Chunks outside, tiles inside: a
    chunk's atoms are one contiguous run over all rows (a tile's 16 rows of
    an int32 atom are 256 bytes, 2 KB apart at R = 128: a page every two
    atoms, which the prefetcher does not follow), and so are its rotated
    rows (rotated[b]). int32 in edges to a factor's rotated rows (Qwen2.5's
    and Gemma 4's int8 FFN) skip the tiles: _ffn_rotated_rows keeps the
    atoms' own order (no transposition in or out)."""
    tiles = (rows + LANES - 1) // LANES
    gc2, uc2, oc2 = gate_src.shape[2], up_src.shape[2], dst.shape[2]
    if (in_kind == IN_DEQUANT and out_kind == OUT_ROTATED and gc2 == _INT32_C2 and uc2 == _INT32_C2
            and gate_extra.shape[1] == 0 and up_extra.shape[1] == 0 and block % (4 * _INT32_C2) == 0):
        _ffn_rotated_rows(gate_src, gate_rs, gate_ch, gate_bias, gate_has_bias, up_src, up_rs, up_ch, up_bias,
                          up_has_bias, act, k, signs, block, hnorm, rotated, tile_lo * LANES,
                          min(rows, tile_hi * LANES))
        return
    chunk = block if out_kind == OUT_ROTATED else (_CHUNK if out_kind == OUT_HALF else k)
    if chunk % gc2 or chunk % uc2 or (out_kind == OUT_HALF and chunk % oc2):
        chunk = k  # a chunk must start on an atom of each edge
    g = np.empty((min(chunk, k), LANES), np.float32)
    u = np.empty((min(chunk, k), LANES), np.float32)
    amax = np.empty(LANES, np.float32)
    signed = out_kind != OUT_HALF
    # whole rows of int8 codes: the in edges, the activation and the rotation's butterflies within `low`
    # channels go by chunks of `low` while those are in L1 ([K, LANES] float32 is 128 KB at K = 2048), the
    # butterflies across them over the whole tile after
    low = min(block, _CHUNK) if out_kind == OUT_QUANT else k
    if low % gc2 or low % uc2:
        low = k
    for c0 in range(0, k, chunk):
        n = min(chunk, k - c0)
        gn, un = g[:n], u[:n]
        for tile in range(tile_lo, tile_hi):
            m0 = tile * LANES
            r = min(LANES, rows - m0)
            for s0 in range(0, n, low):
                sn, c = min(low, n - s0), c0 + s0
                gs, us = gn[s0:s0 + sn], un[s0:s0 + sn]
                ga, ua = slice(c // gc2, -(-(c + sn) // gc2)), slice(c // uc2, -(-(c + sn) // uc2))
                _load_in(in_kind, gate_src[ga], gate_extra[ga], gate_rs, gate_ch[c:], gate_bias[c:], gate_has_bias,
                         m0, r, sn, gs)
                _load_in(in_kind, up_src[ua], up_extra[ua], up_rs, up_ch[c:], up_bias[c:], up_has_bias, m0, r, sn, us)
                if r < LANES:  # lanes past the rows: zeros (never stored)
                    for i in range(sn):
                        for lane in range(r, LANES):
                            gs[i, lane] = np.float32(0.0)
                            us[i, lane] = np.float32(0.0)
                _act_mul(gs, us, act, signs[c:], signed)
                if low < n:
                    _butterflies(gs, low)
            if low < n:  # the butterflies across the chunks, then the codes
                butterfly_stages(gn, block, low)
                _quantize_tile(gn, m0, r, n, dst, hnorm, scale, amax)
            elif out_kind == OUT_ROTATED:  # this block rotated into the factor's input
                _rotate_tile(gn, m0, r, n, signs, True, block, hnorm, True, rotated[c0 // block:])
            else:  # into its atoms; the last chunk's call zeroes the atoms past K
                a1 = dst.shape[0] if c0 + n == k else (c0 + n) // oc2
                _out_edge(gn, gn.view(np.uint32), m0, r, n, out_kind, dst[c0 // oc2:a1], signs[c0:], signed,
                          block, hnorm, scale, rotated, amax)
    if out_kind != OUT_ROTATED and tile_hi == tiles:
        zero_rows(dst, rows)


_MIX_COLUMNS = 1024  # columns of hartley_mix's passes at once: [m, 1024] float32 scratch, 140 KB at m = 35 (L2)


@njit(**_FFN_JIT)
def _mix_pass(src, rows, h, s0, w, dst, drows):
    """dst[drows[k], :w] = sum_n h[k, n] src[rows[n], s0:s0 + w] (rows of C-order 2-d arrays: each run
    a contiguous 1-d view taken as a slice first, so each multiply-add pass is one vector loop: indexed
    src[r, s0 + j], a possibly negative index (numba wraps those) kept it scalar, 2.5x the time)."""
    for k in range(h.shape[0]):
        d = dst[drows[k]]
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


@njit(**_FFN_JIT)
def hartley_mix(x, out, h1, h2, pin, pout, lo, hi):
    """out[:, lo:hi] = H_m x[:, lo:hi] for the order-m Hartley factor in its
    prime-factor form (hadamard.hartley_split: m = m1 m2 coprime, h1 and h2
    their orthonormal Hartley matrices, pin and pout the index maps): H_m1
    along n1, H_m2 along n2, then the four-term cas identity; m1 + m2
    multiply-adds a value where numpy's product takes m (x and out C order,
    [m, columns])."""
    m1, m2 = h1.shape[0], h2.shape[0]
    t = np.empty((m1 * m2, _MIX_COLUMNS), np.float32)  # row k1 m2 + n2: H_m1 applied
    u = np.empty((m1 * m2, _MIX_COLUMNS), np.float32)  # row k1 m2 + k2: then H_m2
    half = np.float32(0.5)
    stride = np.arange(m1) * m2
    for c0 in range(lo, hi, _MIX_COLUMNS):
        w = min(_MIX_COLUMNS, hi - c0)
        for n2 in range(m2):
            _mix_pass(x, pin[:, n2], h1, c0, w, t, stride + n2)
        for k1 in range(m1):
            r = np.arange(m2) + k1 * m2
            _mix_pass(t, r, h2, 0, w, u, r)
        for k1 in range(m1):
            r1 = (m1 - k1) % m1
            for k2 in range(m2):
                r2 = (m2 - k2) % m2
                a, b, e, f = u[k1 * m2 + k2], u[r1 * m2 + k2], u[k1 * m2 + r2], u[r1 * m2 + r2]
                o = out[pout[k1, k2], c0:c0 + w]
                for j in range(w):
                    o[j] = half * ((a[j] + b[j]) + (e[j] - f[j]))
