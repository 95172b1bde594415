"""Compiled (numba) conversions of a model's input image (a float32 map of a
few channels: RGB) into the first segment's feature map [C1, H, W, C2]
(ir/npu/layout.py), whose atom is 16 bytes in both precisions (16 int8 lanes,
8 fp16 lanes): a 3-channel image fills 3 lanes of each pixel's atom and the
rest are zero.

The general edges (runtime/kernels/quant_jit.py, runtime/half.py) compute all
C2 lane rows of a line and transpose them into the atoms byte by byte: for
3 channels of 16 that is 13 zero rows transposed, ~2-4x the pass's memory
time. Here one vectorised loop over a row of pixels computes each pixel's
channels' codes and stores its atom whole as flat 32- or 64-bit words (the
codes in the first, the rest zero): the pass reads the image once and writes
the map once (224x224x3 on one thread: int8 ~60 us, fp16 ~37, where copying the
same bytes takes ~30-43; 3x640x640 fp16 0.46 ms before, against a copy's 0.41).
The codes are the reference's: int8 by QuantizeLinear's float64 division,
rounding half to even, saturation (quant.py), computed as a float32 product
with the reciprocal and a row redone by the division where a product lies
close enough to a half-integer to round apart (`_product_code`); fp16 by
numpy's bits (runtime/half.py `narrow_bits`), computed by the vector rounding
and a row holding a NaN redone bit by bit.
tests/runtime/test_pixels_jit.py checks them against the general edges and
a float64 reference.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from rkc.runtime.half import narrow_bits, narrow_value
from rkc.runtime.kernels.quant_jit import quantize_row
from rkc.runtime.kernels.threads import over_rows

ATOM_BYTES = 16  # one feature atom, both precisions (C2 = 16 int8 / 8 fp16 lanes)
FLOAT32_NORMAL = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
FEW_CHANNELS = 4  # a map of at most this many channels is an image: this module's case


def is_image(channels: int, fm: np.ndarray) -> bool:
    """A map this module converts: few channels into one group of 16-byte atoms."""
    return channels <= FEW_CHANNELS and fm.shape[0] == 1 and fm.shape[3] * fm.itemsize == ATOM_BYTES \
        and fm.flags.c_contiguous


def quantize_image(x: np.ndarray, scale: float, zero_point: int, fm: np.ndarray) -> None:
    """fm[0, y, i, c] = saturate(rint(x[c, y, i] / scale) + zero_point) for x [C, H, W]
    float32 (C <= 4), int8 lanes past C zero."""
    words = fm.view(np.uint32).reshape(fm.shape[1], 4 * fm.shape[2])
    fast = FLOAT32_NORMAL[0] <= abs(1.0 / scale) <= FLOAT32_NORMAL[1]  # `_product_code`'s bound holds
    over_rows(lambda lo, hi: _quantize_rows(x, scale, zero_point, fast, words, lo, hi), fm.shape[1], fm.size)


def pixels_into_feature(pixels: np.ndarray, tables: np.ndarray, fm: np.ndarray) -> None:
    """fm[0, y, i, c] = tables[c, pixels[y, i, c]] for a uint8 image [H, W, C] (C <= 4):
    each channel's 256 codes (int8 bytes or fp16 bits, the normalisation and the
    conversion into the map done once per code by the reference kernels,
    runtime/image_edges.py), lanes past C zero. The host reads the image's
    own bytes (a quarter of a float32 image's) and writes the map once."""
    words = fm.view(np.uint64).reshape(fm.shape[1], fm.shape[2], 2)
    width = 8 * fm.itemsize
    over_rows(lambda lo, hi: _pixel_rows(pixels, tables, width, words, lo, hi), fm.shape[1], fm.size)


def is_rgb_blocks(fm: np.ndarray) -> bool:
    """A map of an RGB image's 2x2 blocks (compiler/passes/image_blocks.py: SpaceToDepth(2),
    12 channels) this module writes: two fp16 or one int8 group of 16-byte atoms."""
    return fm.shape[3] * fm.itemsize == ATOM_BYTES and fm.flags.c_contiguous and fm.shape[0] * fm.shape[3] == 16


_NO_AFFINE = (np.ones(16, np.float32), np.zeros(16, np.float32))  # (not read: the codes are looked up)
BLOCK_LANES = 12  # an RGB block's values: 2 rows x 2 pixels x 3 channels


def affine_lanes(scales: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel scales and offsets [3] as pixels_into_blocks takes them: one per lane of a
    block's 16 (SpaceToDepth's channel order: lane k holds channel k % 3; lanes past 12 zero)."""
    lanes = np.zeros((2, 16), np.float32)
    lanes[0, :BLOCK_LANES] = np.tile(scales.astype(np.float32), BLOCK_LANES // 3)
    lanes[1, :BLOCK_LANES] = np.tile(offsets.astype(np.float32), BLOCK_LANES // 3)
    return lanes[0], lanes[1]


def pixels_into_blocks(pixels: np.ndarray, tables: np.ndarray, fm: np.ndarray,
                       affine: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """fm = the feature map of SpaceToDepth(2) of the per-channel codes of a uint8 RGB
    image [H, W, 3]: block pixel (y, x), channel (py * 2 + px) * 3 + c holds the code of
    pixels[2y + py, 2x + px, c] (SpaceToDepth's channel order, runtime/kernels/shape.py),
    channels 12-15 zero. The code is tables[c, pixel] or, with `affine` = (scales,
    offsets) (float32, one per lane of a block: `affine_lanes`; fp16 maps only), the fp16
    bits of float32(pixel) * scale + offset, a block's 12 values converted as one vector
    (`_affine_block`) where a lookup a value is not: image_plan uses it only where it gives
    the tables' codes for every pixel value. Each atom is stored
    whole: the pass reads the image once and writes half (fp16) or a quarter (int8) of the
    plain map's bytes."""
    words = fm.view(np.uint64).reshape(fm.shape[0], fm.shape[1], fm.shape[2], 2)
    pixels = np.ascontiguousarray(pixels)  # (its rows flat: `_block_rows`)
    scales, offsets = affine if affine is not None else _NO_AFFINE
    over_rows(lambda lo, hi: _block_rows(pixels, tables, scales, offsets, affine is not None, words, lo, hi),
              fm.shape[1], fm.size)


def narrow_image(x: np.ndarray, fm: np.ndarray) -> None:
    """fm[0, y, i, c] = the fp16 bits of x[c, y, i] for x [C, H, W] float32 bits
    (uint32, C <= 4), fp16 lanes past C zero."""
    words = fm.view(np.uint64).reshape(fm.shape[1], 2 * fm.shape[2])
    over_rows(lambda lo, hi: _narrow_rows(x, x.view(np.float32), words, lo, hi), fm.shape[1], fm.size)


# `_product_code`'s margin: a float32 product this close to a half-integer, relative to its size (at
# most NEAR_LIMIT's), is redone (past NEAR_LIMIT every code saturates whichever way it rounds)
NEAR = np.float32(2.0 ** -22)
NEAR_LIMIT = np.float32(512.0)


@njit(cache=True, nogil=True, inline="always")
def _product_code(v, inverse, zp):
    """v's int8 code (its byte, as uint32) by the float32 product with the reciprocal,
    and whether it may differ from the reference's (float64 division: quant.py).
    The product is within |product| * 2^-23 of the quotient (the reciprocal's and the
    product's float32 roundings; the float64 quotient's own is 2^-53), so the two round
    alike unless a half-integer lies within |product| * NEAR of it (twice the bound;
    |p - r| <= 0.5 is the distance from the nearest integer, exact, and the sum's own
    rounding, <= 2^-26, is inside the slack for |p| >= 0.5, the least near a tie)."""
    p = v * inverse
    r = np.rint(p)
    near = abs(p - r) + min(abs(p), NEAR_LIMIT) * NEAR > np.float32(0.5)
    return np.uint32(np.int32(min(max(r + zp, np.float32(-128.0)), np.float32(127.0))) & 255), near


@njit(cache=True, nogil=True, inline="always")
def _product_codes(a, b, c, d, channels, inverse, zp, out):
    """out[4 * i] = the atom's first word of pixel i: the codes of a[i], b[i], c[i], d[i]
    (channels 0-3; those past `channels` not read) in its bytes, the atom's other three
    words zero. One vectorised pass over the row (a constant `channels` drops the rest);
    True if a code may differ from the reference's (the caller redoes the row)."""
    near = False
    for i in range(a.shape[0]):
        word, n = _product_code(a[i], inverse, zp)
        if channels > 1:
            q, m = _product_code(b[i], inverse, zp)
            word, n = word | (q << 8), n | m
        if channels > 2:
            q, m = _product_code(c[i], inverse, zp)
            word, n = word | (q << 16), n | m
        if channels > 3:
            q, m = _product_code(d[i], inverse, zp)
            word, n = word | (q << 24), n | m
        near |= n
        out[4 * i] = word  # flat stores: 2-D indexing (out[i, 0]) kept this loop scalar, 4x slower
        out[4 * i + 1] = 0
        out[4 * i + 2] = 0
        out[4 * i + 3] = 0
    return near


@njit(cache=True, nogil=True, fastmath=False)
def _quantize_rows(x, scale, zero_point, fast, words, lo, hi):
    """Rows [lo, hi): `_product_codes` where `fast`, then the reference's way (quant_jit.quantize_row,
    float64) for the rows it flags; words [H, 4 * W] uint32."""
    c, _, w = x.shape
    inverse, zp = np.float32(1.0 / scale), np.float32(zero_point)
    redo = np.ones(hi - lo, np.bool_)
    if fast:  # an RGB image's three channels as a constant: the usual case, ~20 % faster
        for y in range(lo, hi):
            a, b, d, e = x[0, y], x[min(1, c - 1), y], x[min(2, c - 1), y], x[min(3, c - 1), y]
            redo[y - lo] = _product_codes(a, b, d, e, 3, inverse, zp, words[y]) if c == 3 \
                else _product_codes(a, b, d, e, c, inverse, zp, words[y])
    # (a second loop: the redo inside the first cost that loop ~15 %)
    codes = np.zeros((4, w), np.int8)
    for y in range(lo, hi):
        if redo[y - lo]:
            for k in range(c):
                quantize_row(x[k, y], scale, 1.0 / scale, np.float64(zero_point), codes[k])
            _pack_row(codes.view(np.uint8), 8, words[y].view(np.uint64))


@njit(cache=True, nogil=True, inline="always")
def _narrowed(a, b, c, d, channels, out):
    """out[2 * i] = the atom's first word of pixel i: the fp16 bits of a[i], b[i], c[i],
    d[i] (channels 0-3, those past `channels` not read) by LLVM's rounding, the second word
    zero. One vectorised pass (as `_product_codes`); True if the row holds a NaN, whose
    bits numpy's cast keeps and the vector rounding does not (runtime/half.py)."""
    nan = False
    for i in range(a.shape[0]):
        v = a[i]
        word, n = np.uint64(narrow_value(v)), v != v
        if channels > 1:
            v = b[i]
            word, n = word | (np.uint64(narrow_value(v)) << np.uint64(16)), n | (v != v)
        if channels > 2:
            v = c[i]
            word, n = word | (np.uint64(narrow_value(v)) << np.uint64(32)), n | (v != v)
        if channels > 3:
            v = d[i]
            word, n = word | (np.uint64(narrow_value(v)) << np.uint64(48)), n | (v != v)
        nan |= n
        out[2 * i] = word
        out[2 * i + 1] = 0
    return nan


@njit(cache=True, nogil=True, fastmath=False)
def _narrow_rows(x, values, words, lo, hi):
    """Rows [lo, hi): `_narrowed`, then numpy's bits (runtime/half.py `narrow_bits`) for the
    rows holding a NaN; x the float32 bits (uint32) of `values`, words [H, 2 * W] uint64."""
    c, _, w = x.shape
    redo = np.empty(hi - lo, np.bool_)
    for y in range(lo, hi):
        a, b, d, e = values[0, y], values[min(1, c - 1), y], values[min(2, c - 1), y], values[min(3, c - 1), y]
        redo[y - lo] = _narrowed(a, b, d, e, 3, words[y]) if c == 3 else _narrowed(a, b, d, e, c, words[y])
    bits = np.zeros((4, w), np.uint16)
    for y in range(lo, hi):
        if redo[y - lo]:
            for k in range(c):
                src, dst = x[k, y], bits[k]
                for i in range(w):
                    dst[i] = narrow_bits(src[i])
            _pack_row(bits, 16, words[y])


@njit(cache=True, nogil=True, inline="always")
def _pack_row(lanes, width, out):
    """out[2 * i], out[2 * i + 1] = the atom of pixel i (uint64 words): lanes[0..3][i] in its
    first four lanes of `width` bits (lanes past the image's channels hold zeros), the rest zero."""
    a, b, c, d = lanes[0], lanes[1], lanes[2], lanes[3]
    s1, s2, s3 = np.uint64(width), np.uint64(2 * width), np.uint64(3 * width)
    for i in range(a.shape[0]):
        out[2 * i] = np.uint64(a[i]) | (np.uint64(b[i]) << s1) | (np.uint64(c[i]) << s2) | (np.uint64(d[i]) << s3)
        out[2 * i + 1] = 0


@njit(cache=True, nogil=True, fastmath=False)
def _pixel_rows(pixels, tables, width, words, lo, hi):
    _, w, c = pixels.shape
    s1, s2, s3 = np.uint64(width), np.uint64(2 * width), np.uint64(3 * width)
    t0, t1, t2, t3 = tables[0], tables[min(1, c - 1)], tables[min(2, c - 1)], tables[min(3, c - 1)]
    for y in range(lo, hi):  # pixel by pixel, one loop per channel count (a loop over the channels
        row, out = pixels[y], words[y]  # inside the pixel loop ran 3.5x slower): each atom written whole
        if c == 3:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]]) | (np.uint64(t1[row[i, 1]]) << s1) \
                    | (np.uint64(t2[row[i, 2]]) << s2)
                out[i, 1] = 0
        elif c == 4:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]]) | (np.uint64(t1[row[i, 1]]) << s1) \
                    | (np.uint64(t2[row[i, 2]]) << s2) | (np.uint64(t3[row[i, 3]]) << s3)
                out[i, 1] = 0
        elif c == 2:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]]) | (np.uint64(t1[row[i, 1]]) << s1)
                out[i, 1] = 0
        else:
            for i in range(w):
                out[i, 0] = np.uint64(t0[row[i, 0]])
                out[i, 1] = 0


@njit(cache=True, nogil=True, fastmath=False)
def _block_rows(pixels, tables, scales, offsets, affine, words, lo, hi):
    if not affine:
        for y in range(lo, hi):
            _looked_up_blocks(pixels[2 * y], pixels[2 * y + 1], tables, words, y)
        return
    h, w, c = pixels.shape
    rows = pixels.reshape(h, w * c)
    atoms = words.view(np.uint16).reshape(words.shape[0], words.shape[1], -1)  # [2, H/2, W/2 * 8]
    for y in range(lo, hi):
        r0, r1, first, second = rows[2 * y], rows[2 * y + 1], atoms[0, y], atoms[1, y]
        for x in range(first.shape[0] // 8):
            _affine_block(r0, r1, 6 * x, scales, offsets, first, second, 8 * x)


def _affine_block_ir(context, builder, signature, args):
    """first[d:d + 8], second[d:d + 8] = the fp16 bits of float32(v) * scales + offsets for v the
    block's 12 bytes (r0[s:s + 6] then r1[s:s + 6]), lanes 12-15 zero: two 6-byte loads, one
    shuffle, 16 lanes converted at once (fmul, fadd, fptrunc: each rounded as numba's scalar
    code rounds them, no contraction), two 16-byte stores. Portable IR: x86 and arm64 alike."""
    r0, r1, s, scales, offsets, first, second, d = args
    i8, i16, f32, i32 = ir.IntType(8), ir.IntType(16), ir.FloatType(), ir.IntType(32)

    def data(k):
        return context.make_array(signature.args[k])(context, builder, args[k]).data

    def at(k, index, vector):
        return builder.bitcast(builder.gep(data(k), [index]), vector.as_pointer())

    six, f16 = ir.VectorType(i8, 6), ir.VectorType(f32, 16)
    halves = [builder.load(at(k, s, six), align=1) for k in (0, 1)]
    lanes = builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(i32, 16), list(range(12)) + [0] * 4))
    origin = ir.Constant(s.type, 0)
    values = builder.fadd(builder.fmul(builder.uitofp(lanes, f16), builder.load(at(3, origin, f16), align=4)),
                          builder.load(at(4, origin, f16), align=4))
    bits = builder.bitcast(builder.fptrunc(values, ir.VectorType(ir.HalfType(), 16)), ir.VectorType(i16, 16))
    bits = builder.shuffle_vector(bits, ir.Constant(ir.VectorType(i16, 16), [0] * 16),
                                  ir.Constant(ir.VectorType(i32, 16), list(range(12)) + [16] * 4))
    v8 = ir.VectorType(i16, 8)
    for k, part in ((5, range(8)), (6, range(8, 16))):
        half8 = builder.shuffle_vector(bits, bits, ir.Constant(ir.VectorType(i32, 8), list(part)))
        builder.store(half8, at(k, d, v8), align=2)
    return context.get_dummy_value()


@intrinsic
def _affine_block(typingctx, r0, r1, s, scales, offsets, first, second, d):
    """One block of pixels_into_blocks' affine codes (`_affine_block_ir`); the caller keeps every
    index in its array (no checks)."""
    def flat(a, dtype):
        return isinstance(a, types.Array) and a.dtype == dtype and a.ndim == 1 and a.layout == "C"
    if not (flat(r0, types.uint8) and flat(r1, types.uint8) and flat(scales, types.float32)
            and flat(offsets, types.float32) and flat(first, types.uint16) and flat(second, types.uint16)
            and isinstance(s, types.Integer) and isinstance(d, types.Integer)):
        return None
    return types.void(r0, r1, types.intp, scales, offsets, first, second, types.intp), _affine_block_ir


@njit(cache=True, nogil=True, inline="always")
def _looked_up_blocks(r0, r1, tables, words, y):
    """Block row y from image rows r0, r1 [W, 3] through the tables, each lane's lookup
    written out (as _pixel_rows: a loop over lanes ran several times slower), one
    loop per precision."""
    t0, t1, t2 = tables[0], tables[1], tables[2]
    if tables.itemsize == 2:  # fp16: lanes 0-7 the first atom, 8-11 the second's first word
        first, second = words[0, y], words[1, y]
        for x in range(first.shape[0]):
            i = 2 * x
            first[x, 0] = np.uint64(t0[r0[i, 0]]) | (np.uint64(t1[r0[i, 1]]) << 16) \
                | (np.uint64(t2[r0[i, 2]]) << 32) | (np.uint64(t0[r0[i + 1, 0]]) << 48)
            first[x, 1] = np.uint64(t1[r0[i + 1, 1]]) | (np.uint64(t2[r0[i + 1, 2]]) << 16) \
                | (np.uint64(t0[r1[i, 0]]) << 32) | (np.uint64(t1[r1[i, 1]]) << 48)
            second[x, 0] = np.uint64(t2[r1[i, 2]]) | (np.uint64(t0[r1[i + 1, 0]]) << 16) \
                | (np.uint64(t1[r1[i + 1, 1]]) << 32) | (np.uint64(t2[r1[i + 1, 2]]) << 48)
            second[x, 1] = 0
    else:  # int8: the 12 lanes in one atom
        out = words[0, y]
        for x in range(out.shape[0]):
            i = 2 * x
            out[x, 0] = np.uint64(t0[r0[i, 0]]) | (np.uint64(t1[r0[i, 1]]) << 8) \
                | (np.uint64(t2[r0[i, 2]]) << 16) | (np.uint64(t0[r0[i + 1, 0]]) << 24) \
                | (np.uint64(t1[r0[i + 1, 1]]) << 32) | (np.uint64(t2[r0[i + 1, 2]]) << 40) \
                | (np.uint64(t0[r1[i, 0]]) << 48) | (np.uint64(t1[r1[i, 1]]) << 56)
            out[x, 1] = np.uint64(t2[r1[i, 2]]) | (np.uint64(t0[r1[i + 1, 0]]) << 8) \
                | (np.uint64(t1[r1[i + 1, 1]]) << 16) | (np.uint64(t2[r1[i + 1, 2]]) << 24)
