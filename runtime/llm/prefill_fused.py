"""Compiled (numba) kernels of prefill's fused stretches
(runtime/llm/fused_rows.py) over [K, LANES] tiles: the residual stretch (in
edge: an fp16 NPU output widened, or int32 accumulators dequantized, read
straight from the BO's atoms; [RMSNorm], the residual Add, RMSNorm; out
edge: narrowed to fp16, or rotated and quantized to int8, written straight
into the next segment's atoms) and the gated FFN's (act(gate) * up between
the same edges), one tile of `LANES` rows at a time, the tile staying in
the core's cache from the first step to the last; the edges on their own
(a stretch no fuser took whole); and the int8 codes of rotated rows. An
int32 in edge to a block-mixing factor's rotation goes by slabs of rows in
the atoms' own order instead (runtime/llm/prefill_rows.py).

The values are float32 computations within float32 tolerance of the
per-step path (issue 37; tests/llm/test_prefill_fused.py states the
tolerances). A rotation with a block-mixing factor leaves its rotated rows
for `mix_into_atoms`: the factor's product and the codes, after the tiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import narrow_value, widen_value
from rkc.runtime.llm.prefill_kernels import (_F32_JIT, _JIT, LANES, _butterflies, _hadamard_stages, _load_tile,
                                             _magnitude_peak, _signed_tile, activation, butterfly_stages,
                                             int8_code, int8_scale, rotated_row_scale, scaled_amax)
from rkc.runtime.llm.prefill_rows import _INT32_C2, _ffn_rotated_rows, _residual_rotated_rows, factor_mix

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
    if kind == IN_HALF:  # lanes past r are left as they are (the callers zero them where read)
        _widen_rows(atoms, k, m0, m0 + r, buf, 0)
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


@njit(**_JIT)
def residual_by_rows(in_kind, src, out_kind, block):
    """Whether residual_tiles takes the stretch row by row in the atoms' order
    (prefill_rows._residual_rotated_rows: int32 atoms in, a factor's rotated rows out);
    its residual and kept values are best C order then (rows contiguous),
    the tiles' F order (a tile's lanes contiguous)."""
    return (in_kind == IN_DEQUANT and out_kind == OUT_ROTATED and src.shape[2] == _INT32_C2
            and block % _INT32_C2 == 0)


@njit(**_JIT)
def in_edge_tiles(in_kind, src, extra, row_scale, ch, bias, has_bias, out_t, tile_lo, tile_hi):
    """A many-row in edge on its own (a stretch no fuser took whole): the NPU
    output `src`'s atoms (fp16 widened, or int32 dequantized, `_load_in`'s
    float32 arithmetic) into column-major rows, given as out_t [K, M] (their
    transpose, C order: a tile's lanes contiguous, as the per-step path's
    column-major output), tiles tile_lo..tile_hi-1."""
    k, rows = out_t.shape
    if in_kind == IN_HALF:
        r0 = tile_lo * LANES
        _widen_rows(src, k, r0, min(rows, tile_hi * LANES), out_t, r0)
        return
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        _load_in(in_kind, src, extra, row_scale, ch, bias, has_bias, m0, r, k, out_t[:, m0:m0 + r])


@njit(inline="always")
def _widen_rows(atoms, k, r0, r1, out, c0):
    """out[j, c0 + t] = channel j of fp16 atoms [C1, R, C2] (bits), row r0 +
    t, widened, for rows r0..r1-1: each atom's rows (one contiguous run of
    (r1 - r0) x C2 halves) widened in one vector pass into a float32 block,
    whose C2 columns are then copied into out's rows as runs (out: a tile
    [K, LANES], c0 = 0, or a whole edge's transpose [K, M], c0 = r0; both C
    order). Per tile of LANES rows into a strided view of the edge's
    transpose (numba could not vectorise it) it cost 1.65x (Gemma 3 270M's
    q, 128 x 1024: 137 -> 83 us, one thread). Inlined into its callers
    (numba's inline): as a call, residual_tiles' fp16 tiles cost 1.2x."""
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
            run, col = out[base + b, c0:c0 + n], tmp[:, b]
            for t in range(n):
                run[t] = col[t]


@njit(**_JIT)
def out_edge_tiles(x, out_kind, dst, signs, block, hnorm, scale, rotated, tile_lo, tile_hi):
    """A many-row out edge on its own: rows x [M, K] into the next segment's
    atoms as residual_tiles' out edge writes them (fp16; rotated and
    quantized; or rotated by blocks for a factor's product), tiles
    tile_lo..tile_hi-1; the padding rows zeroed by the call ending at the last tile.
    Rotated rows contiguous in memory go row by row (_rows_to_blocks,
    _rows_into_atoms); others (an NPU output's column-major rows) and fp16
    by [K, LANES] tiles (a contiguous load)."""
    rows, k = x.shape
    tiles = (rows + LANES - 1) // LANES
    if out_kind != OUT_HALF and x.strides[1] == x.itemsize:
        lo, hi = tile_lo * LANES, min(rows, tile_hi * LANES)
        if out_kind == OUT_ROTATED:
            _rows_to_blocks(x, signs, block, hnorm, rotated, lo, hi)
        else:
            _rows_into_atoms(x, signs, block, hnorm, dst, scale, lo, hi)
    else:
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
            _out_edge(buf, buf.view(np.uint32), m0, r, k, out_kind, dst, signs, signed, block, hnorm, scale,
                      rotated, amax)
    if out_kind != OUT_ROTATED and tile_hi == tiles:
        zero_rows(dst, rows)


@njit(**_JIT)
def _rows_to_blocks(x, signs, block, hnorm, rotated, lo, hi):
    """out_edge_tiles' rotation into a factor's blocks for rows lo..hi-1 of
    x [M, K] whose rows are contiguous, row by row: jit.hadamard_rows' stages
    (self-sorting, each a contiguous loop that vectorises, the row in L1), then
    each block's run into rotated[b, m * block:(m + 1) * block]. The same
    operations as the [K, LANES] tiles (the same bits), 0.65x their time over
    128 x 1536 (0.39 against 0.60 ms, one thread; h51f's note)."""
    k = x.shape[1]
    work = np.empty((2, k), np.float32)
    out = np.empty((1, k), np.float32)
    row = out[0]
    for m in range(lo, hi):
        _hadamard_stages(x[m:m + 1], signs, block, hnorm, out, work)
        for b in range(k // block):
            run, src = rotated[b, m * block:(m + 1) * block], row[b * block:(b + 1) * block]
            for j in range(block):
                run[j] = src[j]


@njit(**_JIT)
def _rows_into_atoms(x, signs, block, hnorm, dst, scale, lo, hi):
    """out_edge_tiles' rotation (no factor) and int8 codes for rows lo..hi-1
    of x [M, K] whose rows are contiguous, row by row (rotated_row_scale: the
    row kernels' bits), each row's codes by one contiguous pass into a
    [LANES, C1 x C2] tile, whose runs go into dst [C1, R, C2] atom by atom
    (LANES rows of an atom contiguous; channels past K zeroed), as
    half_rows_into_atoms."""
    k = x.shape[1]
    c1, _, c2 = dst.shape
    work = np.empty((2, k), np.float32)
    out = np.empty((1, k), np.float32)
    row = out[0]
    peak = np.zeros(1, np.uint32)
    tile = np.zeros((LANES, c1 * c2), np.int8)  # channels past K stay 0
    for m0 in range(lo, hi, LANES):
        r = min(LANES, hi - m0)
        for lane in range(r):
            s = rotated_row_scale(x, m0 + lane, signs, block, hnorm, out, work, peak)
            scale[m0 + lane] = s
            codes = tile[lane]
            for i in range(k):
                codes[i] = int8_code(row[i] / s)
        _tile_into_atoms(tile, dst, m0, r)


@njit(**_JIT)
def _tile_into_atoms(tile, dst, m0, r):
    """A [LANES, C1 x C2] tile's first r rows into atoms dst [C1, R, C2] at
    rows m0..m0+r-1: each atom's rows are contiguous runs of C2 channels."""
    c1, _, c2 = dst.shape
    for a in range(c1):
        block = dst[a]
        for lane in range(r):
            d, run = block[m0 + lane], tile[lane, a * c2:(a + 1) * c2]
            for b in range(c2):
                d[b] = run[b]


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
        _tile_into_atoms(tile, dst, m0, r)
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
                d[b] = int8_code(t[b])
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


@njit(**_JIT)
def quantize_blocks_into_atoms(x, block, q, scale, lo, hi):
    """quantize_into_atoms of rows lo..hi-1 of [M, K] given by blocks, x [K /
    block, M x block] (row m's block b: x[b, m * block:(m + 1) * block]);
    the padding rows zeroed by the call whose range ends at M. Two passes in
    x's memory order (a row's blocks lie M x block apart: row by row, every
    block is a fresh page), the first keeping each row's largest magnitude
    (_magnitude_peak: a NaN kept), the second the codes (_block_codes)."""
    blocks = x.shape[0]
    bits = x.view(np.uint32)
    peak = np.zeros(hi - lo, np.uint32)
    for b in range(blocks):
        for m in range(lo, hi):
            peak[m - lo] = _magnitude_peak(bits[b, m * block:(m + 1) * block], peak[m - lo])
    _block_codes(x, block, q, scale, peak, lo, hi)


@njit(**_JIT)
def _block_codes(x, block, q, scale, peak, lo, hi):
    """The codes of rows lo..hi-1 of x by blocks (quantize_blocks_into_atoms')
    given each row's largest magnitude's bits peak[m - lo]: scale[m] = peak /
    127 (1 for a zero row), the codes one atom (C2 channels, contiguous on
    both sides) at a time when a block is a whole number of atoms (block and
    C2 powers of two, block >= C2); the padding rows zeroed by the call
    whose range ends at M."""
    blocks = x.shape[0]
    rows = x.shape[1] // block
    c1, _, c2 = q.shape
    k = blocks * block
    amaxes = peak.view(np.float32)
    for m in range(lo, hi):
        amax = amaxes[m - lo]
        scale[m] = int8_scale(amax)
    if block % c2 == 0:
        for b in range(blocks):
            for m in range(lo, hi):
                s, base = scale[m], m * block
                for j0 in range(0, block, c2):
                    # an atom's run and its source as 1-d views: the loop vectorises (4 vdivps a run of 32,
                    # indexed 3-d it stayed mostly scalar: 0.59 against 0.35 ms over 128 x 8960)
                    qa, xs = q[(b * block + j0) // c2, m], x[b, base + j0:base + j0 + c2]
                    for c in range(c2):
                        qa[c] = int8_code(xs[c] / s)
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
                        q[a, m, c] = int8_code(x[i // block, m * block + i % block] / s)
                    else:
                        q[a, m, c] = 0
    if hi == rows:
        zero_rows(q, rows)


_MIX_SLAB = LANES  # rows of a factor's product then codes at once: 573 KB of mixed rows at K = 8960 (an L2)


@njit(**_F32_JIT)
def mix_into_atoms(x, mixed, factor, h1, h2, pin, pout, block, q, scale, lo, hi):
    """Rows lo..hi-1 of rotated rows by blocks x [K / block, M x block] (an
    out edge's, for a rotation with a block-mixing factor): the factor's
    product into `mixed` (prefill_rows.factor_mix: in prime-factor form
    when h1 has rows) by slabs of _MIX_SLAB rows, each row's largest
    magnitude taken as the product's last pass writes it, then the slab's
    int8 codes into the atoms q and its scales (_block_codes) while its
    mixed rows are in cache. One compiled call a range of rows (disjoint
    ranges may run at once on other threads); the padding rows zeroed by
    the call whose range ends at M."""
    for s in range(lo, hi, _MIX_SLAB):
        e = min(hi, s + _MIX_SLAB)
        peak = np.zeros(e - s, np.uint32)
        factor_mix(x, mixed, factor, h1, h2, pin, pout, s * block, e * block, block, s, peak)
        _block_codes(mixed, block, q, scale, peak, s, e)


@njit(**_JIT)
def quantize_into_atoms(x, q, scale):
    """jit.quantize_rows of x [M, K] (C order) with the codes written into
    int8 atoms q [C1, R, C2] (channels past K and rows past M zeroed)."""
    rows, k = x.shape
    c1, _, c2 = q.shape
    full = k // c2
    for m in range(rows):
        # the largest magnitude by its bits (_magnitude_peak, a NaN kept): the float select with its NaN
        # test stayed scalar, ~2.5 of a 2048-wide decode row's 5 us
        peak = np.empty(1, np.uint32)
        peak[0] = _magnitude_peak(x[m].view(np.uint32), np.uint32(0))
        s = int8_scale(peak.view(np.float32)[0])
        scale[m] = s
        for a in range(full):  # whole atoms: no test per channel, so the loop vectorises
            for b in range(c2):
                q[a, m, b] = int8_code(x[m, a * c2 + b] / s)
        for a in range(full, c1):
            for b in range(c2):
                j = a * c2 + b
                q[a, m, b] = int8_code(x[m, j] / s) if j < k else 0
    zero_rows(q, rows)


# -- the gated FFN's stretch of many rows: float32, threaded over tiles -----------------------------------
# Unlike the stretches above, these kernels are not held to the per-step kernels' bits (issue 37): each
# value is a float32 computation within a few float32 ulps of a float64 reference
# (tests/llm/test_prefill_ffn.py states the tolerances), and the tiles are shared among numba's threads.

_CHUNK = 256  # channels of an fp16 FFN stretch taken at once: [256, LANES] float32, 16 KB a buffer (L1)


@njit(**_F32_JIT)
def _act_mul(g, u, act, signs, signed):
    """g = act(g) * u (times the rotation's signs when `signed`), one pass
    over the tile [K, LANES]: the activation (prefill_kernels.activation) inlined,
    each row's LANES lanes one vector loop."""
    for i in range(g.shape[0]):
        si = signs[i] if signed else np.float32(1.0)
        for lane in range(LANES):
            g[i, lane] = activation(g[i, lane], act) * (u[i, lane] * si)


@njit(**_F32_JIT)
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
    and Gemma 4's int8 FFN) skip the tiles: prefill_rows._ffn_rotated_rows
    keeps the atoms' own order (no transposition in or out)."""
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


