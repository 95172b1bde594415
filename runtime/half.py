"""fp16 <-> fp32 conversions between host arrays and NPU feature atoms, as
compiled (numba) loops with numpy's bits: numpy's own fp16 casts cost ~1.7 ns
an element (no vector conversion in its cast loops), and a prefill chunk
converts millions at each segment edge.

* widening: through `HALF_TO_FLOAT_BITS`, numpy's own conversion of every
  one of the 65536 fp16 values (exact by construction);
* narrowing: round to nearest even with numpy's edge cases (overflow to a
  signed infinity, subnormals, and a NaN keeps its sign and top payload bits,
  at least one of them set, as numpy's cast keeps a signalling NaN
  signalling). tests/test_half.py checks every fp32 pattern class and
  `narrowed_like_numpy` the whole 2^32 range.

The atoms are a GEMM operand's [C1, rows, C2] (ir/npu/layout.py); the host
side is a [K, M] buffer (rows innermost: the column-major [M, K] the plan's
readers hand on) or any [M, K] array.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = {"cache": True, "nogil": True}

# every fp16 bit pattern's float32 bits, as numpy's astype widens it (exact)
HALF_TO_FLOAT_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16) \
    .astype(np.float32).view(np.uint32)


@njit(inline="always", **_JIT)
def half_bits(f):
    """The fp16 bits of the float32 whose bits are `f` (uint32), as numpy rounds it."""
    sign = np.uint16((f >> np.uint32(16)) & np.uint32(0x8000))
    a = f & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):  # inf or NaN
        if a == np.uint32(0x7F800000):
            return sign | np.uint16(0x7C00)
        h = np.uint16(0x7C00) | np.uint16((a & np.uint32(0x7FFFFF)) >> np.uint32(13))
        return sign | (h if h != np.uint16(0x7C00) else np.uint16(0x7C01))  # still a NaN
    if a >= np.uint32(0x38800000):  # a normal fp16 or an overflow: the mantissa rounded to 10 bits
        r = a - np.uint32(0x38000000)  # the exponent rebiased (127 -> 15)
        r = (r + np.uint32(0x0FFF) + ((r >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        return sign | (np.uint16(r) if r < np.uint32(0x7C00) else np.uint16(0x7C00))
    if a < np.uint32(0x33000000):  # below 2^-25 (half the least subnormal, a tie to even): zero
        return sign
    # a subnormal: |x| / 2^-24 = sig * 2^-shift, rounded to the nearest even integer
    sig = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    shift = np.uint32(126) - (a >> np.uint32(23))  # 14..24
    q = sig >> shift
    rest = sig & ((np.uint32(1) << shift) - np.uint32(1))
    tie = np.uint32(1) << (shift - np.uint32(1))
    if rest > tie or (rest == tie and (q & np.uint32(1))):
        q += np.uint32(1)
    return sign | np.uint16(q)


@njit(**_JIT)
def widen_atoms(atoms, m, k, table, out):
    """out[j, r] = the float32 bits of atoms[j // C2, r, j % C2] for j < k, r < m:
    fp16 atoms [C1, rows, C2] (bits) into a [>= k, m] buffer of float32 bits."""
    c1, _, c2 = atoms.shape
    for a in range(c1):
        base = a * c2
        n = min(c2, k - base)
        for b in range(n):
            row = out[base + b]
            for r in range(m):
                row[r] = table[atoms[a, r, b]]


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
                        atoms[a, r, b] = half_bits(x[r, j])
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
                atoms[a, r, b] = half_bits(x[r, j]) if j < k else zero
        for r in range(m, rows):
            for b in range(c2):
                atoms[a, r, b] = zero


@njit(**_JIT)
def narrow_all(f, out):
    """out[i] = half_bits(f[i]) over flat arrays (the exhaustive check's)."""
    for i in range(f.size):
        out[i] = half_bits(f[i])


def narrowed_like_numpy(chunk_bits: int = 26) -> int:
    """Every one of the 2^32 float32 patterns narrowed by half_bits and by
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
