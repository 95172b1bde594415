"""Compiled (numba) 2-D max pooling: the CPU op a CNN most often keeps (a
detector's SPPF, ResNet's stem pool, which stock rocket cannot finish on the
PPU). numpy's window reduction over a strided view cost ~50 ms for ResNet-50's
3x3/2 pool of a 64x112x112 map; this walks the windows directly (a stride-1
pool in two passes: along the rows, then down the columns), rows shared by the
host threads (runtime/llm/threads.py), and reads int8 and fp16 as well as float
(a max commutes with int8's monotone dequantization, so an int8 program pools
its integers). On an NPU feature map (runtime/map_ops.py) the channels of
an atom are the innermost loop: 16 int8 or 8 fp16 lanes at a time.

A maximum is exact, so the result is numpy's element for element (NaN
propagates as numpy's max does). runtime/kernels/conv.py's `max_pool` is the
one entry point; it calls this for 2-D inputs of the dtypes numba compiles.
`cache=True`: a machine compiles it once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, types
from numba.extending import overload

from rkc.runtime.kernels.threads import over_rows, threads_for
from rkc.runtime.llm.threads import over_ranges

DTYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32,
                                         np.int64))


@njit(cache=True, nogil=True, fastmath=False)
def _taps(o, stride, pad, k, dil, size):
    """The window taps [lo, hi) of output position o that fall inside the map."""
    start = o * stride - pad
    lo = 0 if start >= 0 else (-start + dil - 1) // dil
    hi = min(k, (size - 1 - start) // dil + 1) if size - 1 - start >= 0 else 0
    return start, lo, max(hi, lo)


def _key(v):
    """A value as it orders (fp16 bits as uint16: see _half_key; any other dtype as it is)."""


@overload(_key, inline="always")
def _key_impl(v):
    if isinstance(v, types.Integer) and not v.signed and v.bitwidth == 16:
        return lambda v: _half_key(v)
    return lambda v: v


def _value(key):
    """_key's inverse."""


@overload(_value, inline="always")
def _value_impl(key):
    if isinstance(key, types.Integer) and not key.signed and key.bitwidth == 16:
        return lambda key: _half_value(key)
    return lambda key: key


@njit(cache=True, nogil=True, inline="always")
def _half_key(bits):
    """fp16 bits -> a uint16 key in the values' order: a positive value's sign
    bit set, a negative value's bits all flipped; every NaN becomes the
    positive quiet NaN's key, above +inf's, so a window with a NaN pools to
    NaN as numpy's max does."""
    if (bits & 0x7FFF) > 0x7C00:
        return np.uint16(0xFE00)
    return np.uint16(bits ^ 0x8000) if bits < 0x8000 else np.uint16(~bits & 0xFFFF)


@njit(cache=True, nogil=True, inline="always")
def _half_value(key):
    return np.uint16(key ^ 0x8000) if key >= 0x8000 else np.uint16(~key & 0xFFFF)


@njit(cache=True, nogil=True, inline="always")
def _greater(v, cur):
    """v replaces cur: larger, or a NaN (which then stays, as in numpy's max; never for integers)."""
    return (v > cur or v != v) and cur == cur


@njit(cache=True, nogil=True, fastmath=False)
def _window_max(x, low, kh, kw, sy, sx, dy, dx, pt, pl, out, lo, hi):
    """One pass: out[p, oy, ox] = the maximum of each whole window, for output
    rows [lo, hi) of P * OH; lanes L innermost (keys, turned back into values)."""
    h, w, lanes = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    for job in range(lo, hi):
        p, oy = job // oh, job % oh
        y0, ky0, ky1 = _taps(oy, sy, pt, kh, dy, h)
        for ox in range(ow):
            x0, kx0, kx1 = _taps(ox, sx, pl, kw, dx, w)
            dst = out[p, oy, ox]
            for lane in range(lanes):
                dst[lane] = low
            for ky in range(ky0, ky1):
                row = x[p, y0 + ky * dy]
                for kx in range(kx0, kx1):
                    src = row[x0 + kx * dx]
                    for lane in range(lanes):
                        v, cur = _key(src[lane]), dst[lane]
                        dst[lane] = v if _greater(v, cur) else cur
            for lane in range(lanes):
                dst[lane] = _value(dst[lane])


@njit(cache=True, nogil=True, fastmath=False)
def _row_max(x, low, kw, sx, dx, pl, rows, lo, hi):
    """First pass: rows[p, y, ox] = the maximum over the window's columns of
    input row y, for rows [lo, hi) of P * H (as keys); lanes L innermost."""
    h, w, lanes = x.shape[1], x.shape[2], x.shape[3]
    ow = rows.shape[2]
    for job in range(lo, hi):
        p, y = job // h, job % h
        row = x[p, y]
        for ox in range(ow):
            x0, kx0, kx1 = _taps(ox, sx, pl, kw, dx, w)
            dst = rows[p, y, ox]
            for lane in range(lanes):
                dst[lane] = low
            for kx in range(kx0, kx1):
                src = row[x0 + kx * dx]
                for lane in range(lanes):
                    v, cur = _key(src[lane]), dst[lane]
                    dst[lane] = v if _greater(v, cur) else cur


@njit(cache=True, nogil=True, fastmath=False)
def _column_max(rows, low, kh, sy, dy, pt, out, lo, hi):
    """Second pass: out[p, oy, ox] = the maximum over the window's rows of the
    first pass, for output rows [lo, hi) of P * OH (keys turned back into values)."""
    h, ow, lanes = rows.shape[1], rows.shape[2], rows.shape[3]
    oh = out.shape[1]
    for job in range(lo, hi):
        p, oy = job // oh, job % oh
        y0, ky0, ky1 = _taps(oy, sy, pt, kh, dy, h)
        dst = out[p, oy]
        for ox in range(ow):
            for lane in range(lanes):
                dst[ox, lane] = low
        for ky in range(ky0, ky1):
            src = rows[p, y0 + ky * dy]
            for ox in range(ow):
                for lane in range(lanes):
                    v, cur = src[ox, lane], dst[ox, lane]
                    dst[ox, lane] = v if _greater(v, cur) else cur
        for ox in range(ow):
            for lane in range(lanes):
                dst[ox, lane] = _value(dst[ox, lane])


def _atom_key(v):
    """An atom lane as `_block_max` orders it: fp16 bits (uint16) as a signed 16-bit key
    (`_sign_key`); any other dtype as it is."""


@overload(_atom_key, inline="always")
def _atom_key_impl(v):
    if isinstance(v, types.Integer) and not v.signed and v.bitwidth == 16:
        return lambda v: _sign_key(v)
    return lambda v: v


def _atom_value(key, like):
    """`_atom_key`'s inverse, into the dtype of `like` (an element of the output)."""


@overload(_atom_value, inline="always")
def _atom_value_impl(key, like):
    if isinstance(like, types.Integer) and not like.signed and like.bitwidth == 16:
        return lambda key, like: _sign_value(key)
    return lambda key, like: key


# `_sign_key`'s shift: the 1023 negative NaNs' flipped keys, the least int16 values, wrap round to the top
NAN_SHIFT = 1023
NAN_KEYS_FROM = 0x7C00 - NAN_SHIFT + 1  # the least NaN key (+inf's key is one below)


@njit(cache=True, nogil=True, inline="always")
def _sign_key(bits):
    """fp16 bits -> an int16 key in the values' order without a branch or a compare: a
    sign-magnitude number's negative half flipped (s ^ 0x7FFF where s < 0: -inf at -31745,
    +inf at 0x7C00, the positive NaNs above it, the negative NaNs at the very bottom), then
    NAN_SHIFT subtracted, wrapping: the negative NaNs come out on top, so every NaN's key
    lies above +inf's and a window with a NaN pools to NaN as numpy's max does
    (`_half_key`'s order, as a signed compare LLVM vectorises). 4 vector operations a lane
    where mapping every NaN to one key by a compare took 7: a window-rows pass of three 896-lane
    rows 119 -> 64 ns, Inception v2's fp16 3x3/2 pools 0.89-0.92x (docs/notes/2026-12-08-cnn-pool-keys.md)."""
    s = np.int16(bits)
    return np.int16(np.int16(s ^ ((s >> 15) & 0x7FFF)) - NAN_SHIFT)


@njit(cache=True, nogil=True, inline="always")
def _sign_value(key):
    """`_sign_key`'s inverse; a NaN's key (from NAN_KEYS_FROM) the positive quiet NaN's bits, 0x7E00."""
    s = np.int16(key + NAN_SHIFT)
    s = np.int16(s ^ ((s >> 15) & 0x7FFF))
    return np.uint16(np.int16(s + (0x7E00 - s) * (key >= NAN_KEYS_FROM)) & 0xFFFF)


@njit(cache=True, nogil=True, inline="always")
def _max2(cur, v):
    """The larger, a NaN winning as in numpy's max (integers: max)."""
    return v if (v > cur or v != v) and cur == cur else cur


@njit(cache=True, nogil=True, inline="always")
def _rows_max(a, b, c, first, dst):
    """dst[i] = the maximum of the keys of a[i], b[i], c[i] (and dst[i] unless `first`): up to
    three window rows in one pass (a repeated row stands for a missing one: a maximum
    ignores repeats)."""
    if first:
        for i in range(dst.shape[0]):
            dst[i] = _max2(_max2(_atom_key(a[i]), _atom_key(b[i])), _atom_key(c[i]))
    else:
        for i in range(dst.shape[0]):
            dst[i] = _max2(dst[i], _max2(_max2(_atom_key(a[i]), _atom_key(b[i])), _atom_key(c[i])))


@njit(cache=True, nogil=True, fastmath=False)
def _plane_max(x, gx, h, low, b, kh, kw, dy, dx, pt, pl, out, go, oh, lo, hi):
    """A stride-1 pool of whole planes [lo, hi): x and out the rows of P maps (`_block_max`'s
    form: h and oh rows, plane p's row y at x[p * gx + y], out[p * go + y]; fp16 as bits, out
    of x's dtype), b elements a pixel, keys (`_atom_key`) of `low` where a window leaves the
    map. Each plane is keyed into a padded copy (pt, pl low pixels before the map, low ones
    after it to the last a window reaches), and both passes run over the whole plane as one flat
    line, three taps a pass: the map rows' maxima (taps dx b elements apart; the positions past a
    row's last window are computed and never read; the padding rows' stay low), then the
    columns' (taps dy rows apart). A row at a time (the kernel before `_block_max`), a small map's rows (YOLO's
    SPPF: 20 pixels of 8 lanes) paid the setup of five or six short loops each
    (docs/notes/2026-12-07-yolo-host-4.md)."""
    w, ow = x.shape[1] // b, out.shape[1] // b
    wp = max(pl + w, ow + (kw - 1) * dx)  # padded pixels a row
    hp = max(pt + h, oh + (kh - 1) * dy)  # padded rows
    row = wp * b
    padded = np.full(hp * row, low)  # its pad pixels stay low: each plane writes the map's pixels only
    across = np.full(hp * row, low)  # the padding rows' maxima: low, never written
    down = np.empty(oh * row, padded.dtype)
    first, n_across, n_down = pt * row, h * row - (kw - 1) * dx * b, oh * row
    for p in range(lo, hi):
        for y in range(h):
            src, dst = x[p * gx + y], padded[(pt + y) * row + pl * b:(pt + y) * row + (pl + w) * b]
            for i in range(dst.shape[0]):
                dst[i] = _atom_key(src[i])
        for g in range(0, kw, 3):
            a, c, e = first + g * dx * b, first + min(g + 1, kw - 1) * dx * b, first + min(g + 2, kw - 1) * dx * b
            _rows_max(padded[a:a + n_across], padded[c:c + n_across], padded[e:e + n_across], g == 0,
                      across[first:first + n_across])
        for g in range(0, kh, 3):
            a, c, e = g * dy * row, min(g + 1, kh - 1) * dy * row, min(g + 2, kh - 1) * dy * row
            _rows_max(across[a:a + n_down], across[c:c + n_down], across[e:e + n_down], g == 0, down)
        for oy in range(oh):
            src, dst = down[oy * row:oy * row + ow * b], out[p * go + oy]
            for j in range(dst.shape[0]):
                dst[j] = _atom_value(src[j], dst[j])


BLOCK_KEYS = 8192  # keys of a block of output rows' window-row maxima (`_block_max`: 16 KB of int16, in L1)


@njit(cache=True, nogil=True, fastmath=False)
def _block_max(x, gx, h, low, b, units, kh, kw, sy, sx, dy, dx, pt, pl, out, go, oh, lo, hi):
    """A pool at a stride, of pixels of whole 16-byte units (`units` a pixel; an NPU atom is one):
    x the rows (W * b elements, fp16 as bits) of P maps of h rows, map p's row y at x[p * gx + y],
    out the rows (OW * b, x's dtype) of P maps of oh rows, at out[p * go + oy] (`_map_rows`), b
    elements a pixel, for planes [lo, hi), by blocks of output rows: (1) per output row, its window
    rows' maximum as keys (`_rows_max`) into a block of padded rows (each sx * span pixels: pl low
    pixels, the map's, low ones to the end), (2) the block dealt into its sx phases as one line
    (padded pixel k * sx + r to phase r's k: the rows' phases follow each other, span pixels a
    row), (3) the taps over the block as one line (tap kx of output (oy, ox) is phase
    (kx * dx) % sx's pixel oy * span + ox + (kx * dx) // sx: a row's outputs never read past its
    own span; the positions from ow to span are computed and never read), (4) each row's keys
    back into values. Every loop is unit-stride and vectorises, reading up to three streams
    at once (`_rows_max`); two short loops an output row where the kernel before (one output
    row a job, its deal and taps a row at a time) ran five: fp16 3x3/2 over 56x56 and 28x28
    maps 0.84x / 0.73x of it, others 0.91-1.02x, every result byte the same
    (docs/notes/2026-12-07-cnn-host-rows-4.md; before that, docs/notes/2026-12-07-cnn-host-rows-2.md)."""
    row, orow = x.shape[1], out.shape[1]
    w, ow = row // b, orow // b
    width = max(pl + w, (ow - 1) * sx + (kw - 1) * dx + 1)
    span = -(-width // sx)  # pixels per phase a row
    wide = span * sx * b  # a padded row's keys
    block = max(1, min(oh, BLOCK_KEYS // wide))  # output rows a block
    padded = np.full(block * wide, low)  # its pad pixels stay low
    phases = padded if sx == 1 else np.full(block * wide, low)  # phase r at [r * block * span * b, ...)
    rows16, phases16 = padded.view(np.complex128), phases.view(np.complex128)
    acc = np.full(block * span * b, low)
    reach = (kw - 1) * dx // sx  # the last tap's pixels past its output's
    taps = np.empty(kw, np.int64)  # per column tap: its phase's element for output 0
    for kx in range(kw):
        u = kx * dx
        taps[kx] = ((u % sx) * block * span + u // sx) * b
    rows_at = np.empty(max(kh, 1), np.int64)
    for p in range(lo, hi):
        for oy0 in range(0, oh, block):
            n = min(block, oh - oy0)
            for k in range(n):
                y0, ky0, ky1 = _taps(oy0 + k, sy, pt, kh, dy, h)
                m = ky1 - ky0
                line = padded[k * wide + pl * b:k * wide + (pl + w) * b]
                if m == 0:
                    line[:] = low
                for j in range(m):
                    rows_at[j] = p * gx + y0 + (ky0 + j) * dy
                for g in range(0, m, 3):
                    _rows_max(x[rows_at[g]], x[rows_at[min(g + 1, m - 1)]], x[rows_at[min(g + 2, m - 1)]], g == 0,
                              line)
            count = n * span
            if sx > 1:
                for r in range(sx):
                    if units == 1:  # an NPU atom: one 16-byte move a pixel
                        src, to = rows16[r:], phases16[r * block * span:r * block * span + count]
                        for i in range(count):
                            to[i] = src[i * sx]
                    else:
                        src = rows16[r * units:]
                        to = phases16[r * block * span * units:(r * block * span + count) * units]
                        for i in range(count):
                            for u in range(units):
                                to[i * units + u] = src[i * sx * units + u]
            length = (count - reach) * b  # the block's outputs, and the positions between its rows
            for g in range(0, kw, 3):
                a, c, e = taps[g], taps[min(g + 1, kw - 1)], taps[min(g + 2, kw - 1)]
                _rows_max(phases[a:a + length], phases[c:c + length], phases[e:e + length], g == 0, acc[:length])
            for k in range(n):
                dst, keys = out[p * go + oy0 + k], acc[k * span * b:k * span * b + orow]
                for j in range(orow):
                    dst[j] = _atom_value(keys[j], dst[j])


def max_pool_2d(x: np.ndarray, low, kernel, strides, dilations, begin, out_hw) -> np.ndarray:
    """[N, C, H, W] -> [N, C, *out_hw]: each window's maximum, positions outside
    the map (padding, ceil-mode overhang) read as `low`. Any strides; the
    channels are the kernel's lanes and the result's innermost axis (a feature
    map's planes [C1, C2, H, W] are read in place and come out alike).
    Two passes where they compare less (a window's maximum is its rows'
    maxima's maximum): the columns of every input row, then the rows, kh + kw
    comparisons per output instead of kh * kw for a stride-1 pool (YOLO's 5x5
    SPPF pools: 10 instead of 25); one pass over whole windows otherwise (a
    3x3/2 pool compares as often either way, and one pass writes no rows).
    fp16 is pooled as uint16 keys that order as the values do (numba has no
    fp16), made as each value is read. Maps whose pixels are whole 16-byte units
    (an NPU feature map's planes: 16 int8 or 8 fp16 lanes) take `_block_max` (`_plane_max`
    at stride 1), whose loops all run the length of a row: the window kernels' lane loop per tap cost
    more in its setup than the comparisons (ResNet-50's int8 stem pool, 64x112x112
    3x3/2: 0.45 ms CPU before, 0.07-0.13 after, one thread)."""
    n, c = x.shape[:2]
    # channels innermost, the lanes of the kernel: a feature map's planes already are; a row-major map
    # is copied channels-last first (read through its plane strides, Inception's 192x55x55 float32
    # pool after its LRN took 0.86 ms, 0.61 with the copy)
    lanes = x.transpose(0, 2, 3, 1)
    if x.flags.c_contiguous and c > 1:
        lanes = np.ascontiguousarray(lanes)
    # whole 16-byte units: an NPU feature map's planes (atoms_pooler copies a map whose channel
    # groups lie apart together first)
    if c * x.itemsize % 16 == 0 and lanes[:1].flags.c_contiguous:
        out = np.empty((n, *out_hw, c), x.dtype)
        atoms_pooler(x.dtype, lanes.shape, out.shape, kernel, strides, dilations, begin, low)(lanes, out)
        return out.transpose(0, 3, 1, 2)
    half = x.dtype == np.float16
    if half:
        x, low = x.view(np.uint16), _half_key(np.asarray(low, np.float16).view(np.uint16)[()])
        lanes = lanes.view(np.uint16)
    (kh, kw), (sy, sx), (dy, dx), (pt, pl) = kernel, strides, dilations, begin
    low = x.dtype.type(low)
    out = np.empty((n, *out_hw, x.shape[1]), x.dtype)
    if kw * x.shape[2] + kh * out_hw[0] < kh * kw * out_hw[0]:  # comparisons per output column
        rows = np.empty((n, x.shape[2], out_hw[1], x.shape[1]), x.dtype)
        over_rows(lambda lo, hi: _row_max(lanes, low, kw, sx, dx, pl, rows, lo, hi), n * x.shape[2], x.size)
        over_rows(lambda lo, hi: _column_max(rows, low, kh, sy, dy, pt, out, lo, hi), n * out_hw[0], x.size)
    else:
        over_rows(lambda lo, hi: _window_max(lanes, low, kh, kw, sy, sx, dy, dx, pt, pl, out, lo, hi),
                  n * out_hw[0], x.size)
    out = out.transpose(0, 3, 1, 2)
    return out.view(np.float16) if half else out


def max_pool_atoms(fm: np.ndarray, kernel, strides, dilations, begin, out: np.ndarray) -> None:
    """out[p, oy, ox, :] = the maximum of each window of fm's pixels, for a feature map's
    atoms: fm [C1, H, W, C2] and out [C1, OH, OW, C2] of one dtype, C2 * itemsize a whole
    number of 16-byte units (an NPU map: 16 int8 or 8 fp16 lanes), `out` written in place (the
    next segment's input; a view of a map stored over zero rows has its rows past OH left
    alone). Positions outside the map (padding, ceil mode's overhang) never win: they read
    as the dtype's least value."""
    atoms_pooler(fm.dtype, fm.shape, out.shape, kernel, strides, dilations, begin)(fm, out)


def atoms_pooler(dtype, in_shape, out_shape, kernel, strides, dilations, begin, low=None) -> Callable:
    """`max_pool_atoms` for maps of one dtype and shapes, its geometry, padding value (`low`;
    the dtype's least by default) and thread count worked out once: a callable (fm, out) a
    CPU step keeps from its first run (the per-call work around the kernel was ~6 us of a
    20-50 us pool, load 2). fm and out may be the maps or the C-contiguous arrays they are
    stored in (over more rows: a map of few rows stored over zero rows), read and written in
    place, their rows past the maps' not touched."""
    dtype = np.dtype(dtype)
    if dtype not in DTYPES or in_shape[3] * dtype.itemsize % 16 or in_shape[0] != out_shape[0] \
            or in_shape[3] != out_shape[3]:
        raise ValueError("max_pool_atoms: channel groups C-contiguous in the input's dtype, pixels of whole "
                         "16-byte units")
    (kh, kw), (sy, sx), (dy, dx), (pt, pl) = kernel, strides, dilations, begin
    c1, h, w, c2 = in_shape
    half = dtype == np.float16
    codes_dtype = np.dtype(np.uint16) if half else dtype
    if low is None:
        low = np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf
    low = np.int16(_sign_key(np.asarray(low, np.float16).view(np.uint16)[()])) if half else dtype.type(low)  # a key
    planes = (sy, sx) == (1, 1)  # whole planes a pass (`_plane_max`); blocks of output rows otherwise
    units, jobs = c2 * dtype.itemsize // 16, c1
    # threads by the output's size: these passes cost ~0.1 ns an input element, so the input's
    # count overstated the work (the 64x112x112 int8 stem pool: 0.068 ms CPU on one thread, 0.094 on two)
    threads = threads_for(int(np.prod(out_shape)))

    def pool(fm: np.ndarray, out: np.ndarray) -> None:
        if fm.dtype != dtype or out.dtype != dtype or not _holds(fm.shape, in_shape) \
                or not _holds(out.shape, out_shape):
            raise ValueError("max_pool_atoms: maps of the pooler's dtype and shapes (or the arrays they are "
                             "stored in, over as many rows or more)")
        # each map as rows (`_map_rows`): a map stored over zero rows (PP-OCR cls's 200x2x96 fp16 map)
        # given as the array it is stored in is read and written in place; its view is copied into a
        # dense map and back (that pool 35 -> 22 us, load ~6: docs/notes/2026-12-07-cnn-host-rows-4.md)
        src, gx, _ = _map_rows(fm.view(codes_dtype))
        target = out.view(codes_dtype)
        dst, go, in_place = _map_rows(target, writes=True)

        def run(lo: int, hi: int) -> None:
            if planes:
                _plane_max(src, gx, h, low, c2, kh, kw, dy, dx, pt, pl, dst, go, out_shape[1], lo, hi)
            else:
                _block_max(src, gx, h, low, c2, units, kh, kw, sy, sx, dy, dx, pt, pl, dst, go, out_shape[1], lo, hi)
        if threads == 1:
            run(0, jobs)
        else:
            over_ranges(run, jobs, threads)
        if not in_place:  # pooled into a dense map: copied over
            target[...] = dst.reshape(target.shape)

    return pool


def _holds(shape: tuple, form: tuple) -> bool:
    """An array of `shape` is a map of `form` [C1, H, W, C2] or the array it is stored in
    (the same but over H rows or more)."""
    return len(shape) == 4 and shape[0] == form[0] and shape[1] >= form[1] and tuple(shape[2:]) == tuple(form[2:])


def _map_rows(a: np.ndarray, writes: bool = False) -> tuple[np.ndarray, int, bool]:
    """A map [C1, R, W, C2] as (rows, R, in place): [C1 * R, W * C2] rows, group p's row y at
    p * R + y; the array itself if it is C-contiguous, else a dense copy (a written one
    empty: the caller copies it back)."""
    c1, r, w, c2 = a.shape
    if a.flags.c_contiguous:
        return a.reshape(c1 * r, w * c2), r, True
    dense = np.empty(a.shape, a.dtype) if writes else np.ascontiguousarray(a)
    return dense.reshape(c1 * r, w * c2), r, False


@njit(cache=True, nogil=True, fastmath=False)
def _window_mean(x, kh, kw, sy, sx, dy, dx, pt, pl, divisor, out, lo, hi):
    """out[p, oy, ox] = the sum of each window's taps inside the map over divisor[oy, ox],
    for output rows [lo, hi) of P * OH; lanes L innermost, summed in x's float type."""
    h, w, lanes = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[1], out.shape[2]
    for job in range(lo, hi):
        p, oy = job // oh, job % oh
        y0, ky0, ky1 = _taps(oy, sy, pt, kh, dy, h)
        for ox in range(ow):
            x0, kx0, kx1 = _taps(ox, sx, pl, kw, dx, w)
            dst = out[p, oy, ox]
            for lane in range(lanes):
                dst[lane] = 0
            for ky in range(ky0, ky1):
                row = x[p, y0 + ky * dy]
                for kx in range(kx0, kx1):
                    src = row[x0 + kx * dx]
                    for lane in range(lanes):
                        dst[lane] += src[lane]
            scale = 1 / divisor[oy, ox]
            for lane in range(lanes):
                dst[lane] *= scale


def _counted(size, k, s, d, begin, end, out, include_pad):
    """Per output position of one axis: how many of its window's taps count towards the
    divisor: those inside the map, and those in the explicit padding with include_pad
    (never the ceil-mode overhang past it)."""
    lo, hi = (-begin, size + end) if include_pad else (0, size)
    taps = np.arange(out)[:, None] * s - begin + np.arange(k)[None, :] * d
    return ((taps >= lo) & (taps < hi)).sum(axis=1)


def average_pool_2d(x: np.ndarray, kernel, strides, dilations, begin, end, out_hw, include_pad) -> np.ndarray:
    """[N, C, H, W] float32 / float64 -> [N, C, *out_hw]: each window's mean over its
    counted positions (ONNX AveragePool; padding counts with include_pad). One pass over
    whole windows with the channels innermost (a row-major map is copied channels-last
    first, as max_pool_2d does); the windows' sums in x's type, divided once
    (ShuffleNet's 3x3/2 pools of 240x56x56: 1.6 ms in float64 numpy before)."""
    n, c = x.shape[:2]
    (kh, kw), (sy, sx), (dy, dx), (pt, pl) = kernel, strides, dilations, begin
    counts = [_counted(size, k, s, d, b, e, o, include_pad)
              for size, k, s, d, b, e, o in zip(x.shape[2:], kernel, strides, dilations, begin, end, out_hw)]
    divisor = np.maximum(np.outer(counts[0], counts[1]), 1).astype(x.dtype)
    lanes = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    out = np.empty((n, *out_hw, c), x.dtype)
    over_rows(lambda lo, hi: _window_mean(lanes, kh, kw, sy, sx, dy, dx, pt, pl, divisor, out, lo, hi),
              n * out_hw[0], x.size)
    # row-major NCHW, as the steps after it read (the edge quantizing a channels-last view into
    # its map took 0.5-0.65 ms for Inception v2's 28x28 pools, 0.15 after this copy)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))
