"""fp16 <-> fp32 conversions between host arrays and NPU feature atoms, as
compiled (numba) loops with numpy's bits: numpy's own fp16 casts cost ~1.7 ns
an element (no vector conversion in its cast loops), and a prefill chunk
converts millions at each segment edge.

* widening (`widen_bits`): LLVM's exact fpext (one vcvtph2ps lane with F16C,
  an fcvt on arm64), a NaN keeping its payload and signalling bit as numpy's
  does;
* narrowing (`narrow_bits`): LLVM's fptrunc (to nearest, ties to even,
  overflow to a signed infinity, subnormals), a NaN keeping its sign and top
  payload bits, at least one of them set, as numpy's cast keeps a signalling
  NaN signalling. tests/runtime/test_half_edges.py checks every fp32 pattern
  class and a sample, tests/llm/test_plan.py every fp16 pattern and its
  neighbours, and `narrowed_like_numpy` the whole 2^32 range by hand.
These two are the one fp16 conversion of the compiled host code (the fused
edges of runtime/llm, the plan's fp16 BO readers and writers, an ONNX model's
input and outputs at its feature maps: runtime/feature_edges.py); `widen_value`
is fpext alone and `narrow_value` fptrunc alone, for arithmetic on the values
(decode attention, the fused prefill edges: NaNs stay NaNs, payloads aside).

The atoms are a GEMM operand's [C1, rows, C2] (ir/npu/layout.py); the host
side is a [K, M] buffer (rows innermost: the column-major [M, K] the plan's
readers hand on) or any [M, K] array.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from rkc.runtime.kernels.threads import over_rows, threads_for

_JIT = {"cache": True, "nogil": True, "fastmath": False}


def _widened_bits_ir(builder, h16, lanes: int = 0, nan_free: bool = False):
    """widen_bits' IR on an i16 value (lanes 0) or a vector of `lanes` of them: the i32 bits
    (`nan_free`: fpext alone, for values the caller knows hold no NaN)."""
    def typed(t):
        return ir.VectorType(t, lanes) if lanes else t

    i32 = typed(ir.IntType(32))

    def const(v):
        return ir.Constant(i32, [v] * lanes if lanes else v)

    wide = builder.bitcast(builder.fpext(builder.bitcast(h16, typed(ir.HalfType())), typed(ir.FloatType())), i32)
    if nan_free:
        return wide
    h = builder.zext(h16, i32)
    is_nan = builder.icmp_unsigned(">", builder.and_(h, const(0x7FFF)), const(0x7C00))
    sign = builder.shl(builder.and_(h, const(0x8000)), const(16))
    frac = builder.shl(builder.and_(h, const(0x3FF)), const(13))
    nan = builder.or_(builder.or_(sign, const(0x7F800000)), frac)
    return builder.select(is_nan, nan, wide)


@intrinsic
def widen_bits(typingctx, x):
    """fp16 bits (uint16) -> float32 bits (uint32) as numpy's astype widens
    them: LLVM's exact fpext, except a NaN keeps its payload and its
    signalling bit (fpext would quiet it): sign, all-ones exponent, the
    fraction shifted up, as numpy's halfbits_to_floatbits builds it."""
    if x != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return _widened_bits_ir(builder, args[0])
    return types.uint32(types.uint16), codegen


@intrinsic
def widen_value(typingctx, x):
    """fp16 bits (uint16) -> the float32 value: LLVM's fpext alone (a NaN
    stays a NaN, quieted, its payload not kept), which vectorises inside an
    arithmetic loop (vcvtph2ps) where widen_bits' payload select and bit
    store do not: for kernels that compute with the value (decode attention)
    rather than hand its bits on."""
    if x != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def narrow_bits(typingctx, x):
    """float32 bits (uint32) -> fp16 bits (uint16) as numpy's astype rounds
    them: LLVM's fptrunc (to nearest, ties to even; overflow to inf), except
    a NaN keeps its signalling bit and the top of its payload (fptrunc would
    quiet it), never becoming inf, as numpy's floatbits_to_halfbits does."""
    if x != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        i32, i16 = ir.IntType(32), ir.IntType(16)
        f = builder.bitcast(args[0], ir.FloatType())
        half = builder.bitcast(builder.fptrunc(f, ir.HalfType()), i16)
        frac = builder.and_(args[0], ir.Constant(i32, 0x7FFFFF))
        is_nan = builder.icmp_unsigned(">", builder.and_(args[0], ir.Constant(i32, 0x7FFFFFFF)),
                                       ir.Constant(i32, 0x7F800000))
        top = builder.lshr(frac, ir.Constant(i32, 13))
        top = builder.select(builder.icmp_unsigned("==", top, ir.Constant(i32, 0)), ir.Constant(i32, 1), top)
        sign = builder.lshr(builder.and_(args[0], ir.Constant(i32, 0x80000000)), ir.Constant(i32, 16))
        nan = builder.trunc(builder.or_(builder.or_(sign, ir.Constant(i32, 0x7C00)), top), i16)
        return builder.select(is_nan, nan, half)
    return types.uint16(types.uint32), codegen


@intrinsic
def narrow_value(typingctx, x):
    """A float32 value -> fp16 bits (uint16): LLVM's fptrunc alone (to
    nearest, ties to even; a NaN stays a NaN, quieted), which vectorises
    (vcvtps2ph) where narrow_bits' payload select does not: for kernels that
    round values they computed (the fused prefill edges), not bits handed on."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@njit(**_JIT)
def widen_atoms(atoms, m, k, out):
    """out[j, r] = the float32 bits of atoms[j // C2, r, j % C2] for j < k, r < m:
    fp16 atoms [C1, rows, C2] (bits) into a [>= k, m] buffer of float32 bits."""
    c1, _, c2 = atoms.shape
    for a in range(c1):
        base = a * c2
        n = min(c2, k - base)
        for b in range(n):
            row = out[base + b]
            for r in range(m):
                row[r] = widen_bits(atoms[a, r, b])


@njit(**_JIT)
def narrow_into_atoms(x, atoms):
    """fp32 rows x [M, K] (bits, any strides) rounded to fp16 into atoms
    [C1, R, C2] (bits): channels past K and rows past M zeroed."""
    m, k = x.shape
    c1, rows, c2 = atoms.shape
    zero = np.uint16(0)
    if x.strides[0] < x.strides[1]:  # column-major: rows innermost, as x's memory runs
        for a in range(c1):
            for b in range(c2):
                j = a * c2 + b
                if j < k:
                    for r in range(m):
                        atoms[a, r, b] = narrow_bits(x[r, j])
                else:
                    for r in range(m):
                        atoms[a, r, b] = zero
            for r in range(m, rows):
                for b in range(c2):
                    atoms[a, r, b] = zero
        return
    for a in range(c1):
        for r in range(m):
            for b in range(c2):
                j = a * c2 + b
                atoms[a, r, b] = narrow_bits(x[r, j]) if j < k else zero
        for r in range(m, rows):
            for b in range(c2):
                atoms[a, r, b] = zero


def narrow_into_feature(x: np.ndarray, fm: np.ndarray) -> None:
    """fp32 maps x [C, H, W] (bits, any strides) rounded to fp16 into a feature
    map fm [C1, H, W, C2] (bits): channels past C zeroed; the (channel group,
    row) lines shared by the host threads (runtime/llm/threads.py); a map of one pixel
    (a classifier's [1, C, 1, 1] features) in one loop over its atoms' lanes, as
    `one_pixel_lanes`: its lines are one atom each, and each line's row buffer and
    loops cost ~0.1 us (ZFNet's 4096 features: ~55 us, the loop ~3)."""
    if x.shape[1:] == (1, 1) and fm.shape[1:3] == (1, 1):
        _narrow_pixel(x[:, 0, 0], fm[:, 0, 0])
        return
    over_rows(lambda lo, hi: _narrow_lines(x, fm, lo, hi), fm.shape[0] * fm.shape[1], fm.size)


@njit(**_JIT)
def _narrow_pixel(x, lanes):
    """lanes[j // C2, j % C2] = fp16 bits of x[j] (float32 bits [C]); lanes past C zero."""
    c1, c2 = lanes.shape
    c = x.shape[0]
    for a in range(c1):
        for b in range(c2):
            j = a * c2 + b
            lanes[a, b] = narrow_bits(x[j]) if j < c else np.uint16(0)


def widen_feature(fm: np.ndarray, out: np.ndarray) -> None:
    """out[j] = the float32 bits of fm's channel j: fp16 feature map fm [C1, H, W,
    C2] (bits) into out [C, H, W] (uint32, C <= C1 * C2, C-contiguous), lines shared as above."""
    lanes = one_pixel_lanes(fm, out)
    if lanes is not None:
        _widen_pixel(lanes, out.reshape(-1))
        return
    if not out.flags.c_contiguous:
        raise ValueError("the rows of an fp16 map's channels go into a C-contiguous array")
    fm = np.ascontiguousarray(fm)  # a copy only if it is not: the line kernels view atoms as words
    over_rows(lambda lo, hi: _widen_lines(fm, out, lo, hi), fm.shape[0] * fm.shape[1], fm.size)


def unpack_feature_bits(fm: np.ndarray, out: np.ndarray) -> None:
    """out[j] = fm's channel j as it is: a feature map fm [C1, H, W, C2] into out [C, H, W]
    of the same 2-byte dtype (C <= C1 * C2, C-contiguous), lines shared as above: fp16 outputs handed
    over without widening."""
    lanes = one_pixel_lanes(fm, out)
    if lanes is not None:
        _copy_pixel(lanes, out.reshape(-1))
        return
    if not out.flags.c_contiguous:
        raise ValueError("the rows of an fp16 map's channels go into a C-contiguous array")
    fm = np.ascontiguousarray(fm)  # a copy only if it is not: the line kernels view atoms as words
    over_rows(lambda lo, hi: _unpack_lines(fm, out, lo, hi), fm.shape[0] * fm.shape[1], fm.size)


def feature_rows_kernel(fm_shape: tuple[int, ...], out_shape: tuple[int, ...], kept: bool):
    """unpack_feature_bits (kept) or widen_feature, fn(fm, out), for C-contiguous maps of these
    shapes, bound once: the line kernel itself where one thread takes the whole map and it is
    more than one pixel (the wrappers' checks and thread choice, made here, cost ~3-4 us a call
    of a detector's output steps, each ~5-50 us), else the wrapper."""
    wrapper, lines = (unpack_feature_bits, _unpack_lines) if kept else (widen_feature, _widen_lines)
    if tuple(out_shape[1:]) == (1, 1) or tuple(fm_shape[1:3]) == (1, 1) \
            or threads_for(int(np.prod(fm_shape))) != 1 or len(fm_shape) != 4:
        return wrapper
    rows = int(fm_shape[0]) * int(fm_shape[1])
    return lambda fm, out: lines(fm, out, 0, rows)


def one_pixel_lanes(fm: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    """A feature map fm [C1, 1, 1, C2] of one pixel (a classifier's [1, C, 1, 1] logits) as
    its atoms' lanes [C1, C2] (lane b of atom a is channel a * C2 + b; a view, the atoms
    spaced out where a GEMM's rows are stored padded), for a contiguous out [C, 1, 1]; None
    for any other map. The line kernels pay ~150 ns a line, and such a map is C / C2 lines
    of one atom: 1000 fp16 logits widened took 19 us, numpy's cast of the lanes 5-6 (load
    10), one loop over them ~1-2 (load 3)."""
    if out.shape[1:] != (1, 1) or fm.shape[1:3] != (1, 1) or not out.flags.c_contiguous:
        return None
    return fm[:, 0, 0]


@njit(**_JIT)
def _widen_pixel(lanes, out):
    c2 = lanes.shape[1]
    for j in range(out.shape[0]):
        out[j] = widen_bits(lanes[j // c2, j % c2])


@njit(**_JIT)
def _copy_pixel(lanes, out):
    c2 = lanes.shape[1]
    for j in range(out.shape[0]):
        out[j] = lanes[j // c2, j % c2]


@njit(**_JIT)
def _unpack_lines(fm, out, lo, hi):
    c, h, w = out.shape
    c2 = fm.shape[3]
    rows = np.empty((c2, w), np.uint16)
    flat = out.reshape(out.size)  # C-contiguous (unpack_feature_bits checks)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        if c2 == 8 and n == 8:  # a whole group of eight fp16 channels: straight into the output's rows
            _lanes8_rows(fm[a, y], flat, (a * c2 * h + y) * w, h * w)
            continue
        lanes_to_rows(fm[a, y], rows)
        for b in range(n):
            dst, src = out[a * c2 + b, y], rows[b]
            for i in range(w):
                dst[i] = src[i]


# A line of 8-lane fp16 atoms into eight rows is an 8x8 transpose of each eight atoms: written as
# LLVM shuffles (_eight_atoms_ir), three rounds of interleaving, which x86 lowers to unpack
# instructions and arm64 to zips. 80 channels of 80x80, one thread (load ~6): 96 us with each
# lane's statement written out for LLVM to vectorise (its interleaved-group lowering), 35 with the
# shuffles, a copy of the same bytes 30-35.
def _interleaved(builder, a, b, width: int, high: bool):
    """The lanes of two <8 x i16> vectors taken `width` at a time, a's then b's, from their low
    (lanes 0-3) or high (4-7) halves."""
    start = 4 if high else 0
    mask = [s + o + k for s in range(start, start + 4, width) for o in (0, 8) for k in range(width)]
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), 8), mask))


def _eight_atoms_ir(context, builder, signature, args, widen: bool):
    """dst[d + b * stride + j] = src[s + 8 j + b] for b, j < 8 (widened: the float32 bits)."""
    src, s, dst, d, stride = args
    v16 = ir.VectorType(ir.IntType(16), 8)
    src_data = context.make_array(signature.args[0])(context, builder, src).data
    dst_data = context.make_array(signature.args[2])(context, builder, dst).data
    atoms = [builder.load(builder.bitcast(builder.gep(src_data, [builder.add(s, ir.Constant(s.type, 8 * j))]),
                                          v16.as_pointer()), align=2) for j in range(8)]
    pairs = [_interleaved(builder, atoms[j], atoms[j + 1], 1, high) for j in range(0, 8, 2) for high in (False, True)]
    quads = [_interleaved(builder, pairs[k + o], pairs[k + o + 2], 2, high)
             for k in (0, 1) for o in (0, 4) for high in (False, True)]
    lanes = [_interleaved(builder, quads[k + o], quads[k + o + 2], 4, high)
             for k in (0, 4) for o in (0, 1) for high in (False, True)]
    element = ir.IntType(32) if widen else ir.IntType(16)

    def store(convert):
        for b, lane in enumerate(lanes):
            at = builder.add(d, builder.mul(stride, ir.Constant(stride.type, b)))
            builder.store(convert(lane), builder.bitcast(builder.gep(dst_data, [at]), ir.VectorType(element, 8).as_pointer()),
                          align=element.width // 8)

    if not widen:
        store(lambda lane: lane)
        return context.get_dummy_value()
    # NaNs are rare: one test of the eight atoms, widen_bits' payload select only where there is one
    # (the select on every lane took 120 against 48-57 us for 80 channels of 80x80, load ~5)
    mask, top = ir.Constant(v16, [0x7FFF] * 8), ir.Constant(v16, [0x7C00] * 8)
    nans = [builder.icmp_signed(">", builder.and_(atom, mask), top) for atom in atoms]
    while len(nans) > 1:
        nans = [builder.or_(nans[k], nans[k + 1]) for k in range(0, len(nans), 2)]
    some = builder.icmp_unsigned("!=", builder.bitcast(nans[0], ir.IntType(8)), ir.Constant(ir.IntType(8), 0))
    with builder.if_else(some, likely=False) as (with_nan, without):
        with with_nan:
            store(lambda lane: _widened_bits_ir(builder, lane, 8))
        with without:
            store(lambda lane: _widened_bits_ir(builder, lane, 8, nan_free=True))
    return context.get_dummy_value()


def _eight_atoms_signature(src, s, dst, d, stride, dst_dtype):
    flat = (isinstance(src, types.Array) and src.dtype == types.uint16 and src.ndim == 1 and src.layout == "C"
            and isinstance(dst, types.Array) and dst.dtype == dst_dtype and dst.ndim == 1 and dst.layout == "C")
    if not flat or not all(isinstance(v, types.Integer) for v in (s, d, stride)):
        return None
    return types.void(src, types.intp, dst, types.intp, types.intp)


@intrinsic
def eight_atoms(typingctx, src, s, dst, d, stride):
    """dst[d + b * stride + j] = src[s + 8 j + b], b, j < 8: eight fp16 atoms (bits, flat C arrays)
    as eight rows (also runtime/kernels/gather_jit.move_blocks). The caller keeps every index in
    its array (no checks)."""
    return _eight_atoms_signature(src, s, dst, d, stride, types.uint16), \
        lambda context, builder, signature, args: _eight_atoms_ir(context, builder, signature, args, False)


@intrinsic
def _eight_atoms_widened(typingctx, src, s, dst, d, stride):
    """eight_atoms into float32 bits (uint32 dst), each lane as widen_bits widens it."""
    return _eight_atoms_signature(src, s, dst, d, stride, types.uint32), \
        lambda context, builder, signature, args: _eight_atoms_ir(context, builder, signature, args, True)


@njit(**_JIT)
def _lanes8_rows(atoms, out, at, stride):
    """out[at + b * stride + i] = atoms[i, b] for a C-contiguous line atoms [W, 8] (fp16 bits)."""
    w = atoms.shape[0]
    a = atoms.reshape(atoms.size)
    body = w - w % 8
    for i in range(0, body, 8):
        eight_atoms(a, 8 * i, out, at + i, stride)
    for i in range(body, w):
        for b in range(8):
            out[at + b * stride + i] = a[8 * i + b]


@njit(**_JIT)
def _widen8_rows(atoms, out, at, stride):
    """out[at + b * stride + i] = the float32 bits of atoms[i, b] (fp16 bits), atoms [W, 8] C-contiguous."""
    w = atoms.shape[0]
    a = atoms.reshape(atoms.size)
    body = w - w % 8
    for i in range(0, body, 8):
        _eight_atoms_widened(a, 8 * i, out, at + i, stride)
    for i in range(body, w):
        for b in range(8):
            out[at + b * stride + i] = widen_bits(a[8 * i + b])


@njit(**_JIT)
def lanes_to_rows(atoms, rows):
    """rows[b, i] = atoms[i, b]: a feature line's [W, C2] atoms as C2 rows of W,
    so that a loop over one channel's values vectorises."""
    w, c2 = atoms.shape
    for i in range(w):
        for b in range(c2):
            rows[b, i] = atoms[i, b]


@njit(**_JIT)
def rows_to_lanes(rows, atoms):
    """atoms[i, b] = rows[b, i], lanes_to_rows' inverse."""
    w, c2 = atoms.shape
    for i in range(w):
        for b in range(c2):
            atoms[i, b] = rows[b, i]


@njit(**_JIT)
def _narrow_lines(x, fm, lo, hi):
    c, h, w = x.shape
    c2 = fm.shape[3]
    zero = np.uint16(0)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)  # the channels this atom holds; the rest zero
        rows = np.empty((c2, w), np.uint16)  # narrowed a row at a time: the loop vectorises
        for b in range(n):
            src, dst = x[a * c2 + b, y], rows[b]
            for i in range(w):
                dst[i] = narrow_bits(src[i])
        for b in range(n, c2):
            rows[b] = zero
        rows_to_lanes(rows, fm[a, y])


@njit(**_JIT)
def _widen_lines(fm, out, lo, hi):
    c, h, w = out.shape
    c2 = fm.shape[3]
    rows = np.empty((c2, w), np.uint16)  # the atoms' lanes as rows: the widening vectorises
    flat = out.reshape(out.size)  # C-contiguous (widen_feature checks)
    for line in range(lo, hi):
        a, y = line // h, line % h
        n = min(c2, c - a * c2)
        atoms = fm[a, y]
        if c2 == 8 and n == 8:  # a whole group of eight channels: widened straight into the output's rows
            _widen8_rows(atoms, flat, (a * c2 * h + y) * w, h * w)
            continue
        if 2 * n <= c2:  # mostly padding lanes (a one-channel map): read the channels' lanes only
            for b in range(n):
                dst = out[a * c2 + b, y]
                for i in range(w):
                    dst[i] = widen_bits(atoms[i, b])
            continue
        lanes_to_rows(atoms, rows)
        for b in range(n):
            src, dst = rows[b], out[a * c2 + b, y]
            for i in range(w):
                dst[i] = widen_bits(src[i])


@njit(**_JIT)
def narrow_all(f, out):
    """out[i] = narrow_bits(f[i]) over flat arrays (the exhaustive check's)."""
    for i in range(f.size):
        out[i] = narrow_bits(f[i])


def narrowed_like_numpy(chunk_bits: int = 26) -> int:
    """Every one of the 2^32 float32 patterns narrowed by narrow_bits and by
    numpy's cast; returns how many differ (a check run by hand, ~1 minute:
    tests/test_half.py covers the edges and a sample)."""
    bad, step = 0, 1 << chunk_bits
    out = np.empty(step, np.uint16)
    with np.errstate(all="ignore"):
        for lo in range(0, 1 << 32, step):
            f = np.arange(lo, lo + step, dtype=np.uint64).astype(np.uint32)
            narrow_all(f, out)
            bad += int(np.count_nonzero(out != f.view(np.float32).astype(np.float16).view(np.uint16)))
    return bad
