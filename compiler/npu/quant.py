"""Integer requantization as the DPU does it: a 15-bit multiplier and a right shift
that rounds half to even, then an offset, then saturation.

Facts (gregordinary/rockchip-npu-notes encodings/out-cvt-converter.md, measured on
RK3588): OUT_CVT computes sat(rne((v * SCALE) >> SHIFT) + OFFSET) on the integer
path; SCALE is a signed 16-bit multiplier (so 15 magnitude bits); CVT_ROUND=0 is
round-half-to-even; the BS multiplier rounds the same way.
"""

from __future__ import annotations

import math

import numpy as np

from rkc.ir.errors import UnsupportedError

MUL_BITS = 15  # the multiplier is signed 16-bit: 15 bits of magnitude
SHIFT_MAX = 63  # OUT_CVT_SHIFT: beyond this every product rounds to 0


def multiplier_pair(m: float, what: str = "scale") -> tuple[int, int]:
    """(mul, shift) with mul in [2^14, 2^15) and mul / 2^shift the closest such
    value to `m` (QNNPACK's derivation, keeping the carry Mesa drops)."""
    if not (m > 0 and math.isfinite(m)):
        raise UnsupportedError(f"{what} {m} is not a positive finite number")
    mant, exp = math.frexp(m)  # m = mant * 2^exp, mant in [0.5, 1)
    mul = round(mant * (1 << MUL_BITS))
    shift = MUL_BITS - exp
    if mul == 1 << MUL_BITS:  # rounding carried out of 15 bits
        mul >>= 1
        shift -= 1
    if shift < 0:
        raise UnsupportedError(f"{what} {m:.6g} is too large for the DPU (needs a left shift)")
    if shift > SHIFT_MAX:
        raise UnsupportedError(f"{what} {m:.3g} is too small for the DPU shift field")
    return mul, shift


def rne_shift(x: np.ndarray, shift: int) -> np.ndarray:
    """Arithmetic right shift of int64 values rounding half to even."""
    x = np.asarray(x, dtype=np.int64)
    if shift <= 0:
        return x << -shift if shift < 0 else x.copy()
    floor = x >> shift
    rem = x - (floor << shift)
    half = np.int64(1) << (shift - 1)
    up = (rem > half) | ((rem == half) & ((floor & 1) == 1))
    return floor + up


def saturate(x: np.ndarray, dtype: str) -> np.ndarray:
    info = np.iinfo({"int8": np.int8, "int16": np.int16, "int32": np.int32}[dtype])
    return np.clip(x, info.min, info.max)


def requantize(v: np.ndarray, mul: int, shift: int, offset: int, dtype: str = "int8") -> np.ndarray:
    """sat(rne(v * mul >> shift) + offset), the OUT_CVT integer path."""
    return saturate(rne_shift(np.asarray(v, np.int64) * mul, shift) + offset, dtype)
