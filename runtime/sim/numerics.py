"""Data types and the integer arithmetic the NPU blocks share.

Precision codes are the 3-bit fields of CNA_CONV_CON1, CORE_MISC_CFG and
DPU_DATA_FORMAT (TRM ch. 36; int16/bf16/int4/tf32 values HW-established by
gregordinary/rockchip-npu-notes encodings/precision-field.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from rkc.runtime import blas

from rkc.ir.npu.extents import PRECISION_BYTES


@dataclass(frozen=True)
class Precision:
    code: int
    name: str
    itemsize: int
    storage: np.dtype  # how memory holds one element
    is_float: bool
    bits: int = 0  # element width; 0: 8 x itemsize (int4 elements are nibbles in whole bytes)

    @property
    def element_bits(self) -> int:
        return self.bits or 8 * self.itemsize

    @property
    def c2(self) -> int:
        """Channels per 16-byte atom of the NC1HWC2 layout."""
        return 128 // self.element_bits

    @property
    def kernel_group(self) -> int:
        """Kernels per 1 KiB direct-convolution weight tile (32 int8, 16 fp16, 64 int4)."""
        return 256 // self.element_bits


_STORAGE = {0: ("int8", np.int8, False), 1: ("int16", np.int16, False), 2: ("fp16", np.float16, True),
            3: ("bf16", np.uint16, True), 4: ("int32", np.int32, False), 5: ("fp32", np.float32, True)}
PRECISIONS = {code: Precision(code, name, PRECISION_BYTES[code], np.dtype(storage), is_float)
              for code, (name, storage, is_float) in _STORAGE.items()}
# int4 (code 6, CNA/CORE/DPU input only): nibbles, unpacked to int8 values in [-8, 7]
PRECISIONS[6] = Precision(6, "int4", 1, np.dtype(np.int8), False, bits=4)
INT_RANGE = {0: (-128, 127), 1: (-32768, 32767), 4: (-(1 << 31), (1 << 31) - 1)}


# every fp16 bit pattern as float32: a table gather converts large weight arrays
# several times faster than numpy's float16 casts on this build (exact, NaNs kept)
_F16_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
_F16_TO_F32.flags.writeable = False


def f16_to_f32(raw: np.ndarray) -> np.ndarray:
    return _F16_TO_F32[np.asarray(raw).view(np.uint16)]


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even (NaN kept quiet)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def to_compute(raw: np.ndarray, prec: Precision, copy: bool = True) -> np.ndarray:
    """Memory elements -> the values the MAC array multiplies: float32 for float
    precisions, the integers themselves (int8/int16/int32, copied unless
    `copy` is False) otherwise; callers widen before arithmetic that could overflow."""
    if prec.code == 3:
        return bf16_to_f32(raw)
    if prec.code == 2:
        return f16_to_f32(raw)
    if prec.is_float:
        return raw.astype(np.float32)
    return np.array(raw, dtype=prec.storage, copy=copy)


def from_float(x: np.ndarray, prec: Precision) -> np.ndarray:
    """float32 values -> memory elements of a float precision."""
    if prec.code == 3:
        return f32_to_bf16(x)
    return np.asarray(x, np.float32).astype(prec.storage)


# The TRM's 1-bit round fields (OUT_CVT CVT_ROUND, EW_CVT_ROUND, CORE and CNA
# ROUND_TYPE): 0 'if the integer is odd, carry 1' = ties to even, 1 'carry 1 no
# matter what' = ties away from zero (measured on OUT_CVT bit 30, RK3588: rockchip-npu-
# notes encodings/out-cvt-converter.md @ 224b1390; the other fields by the same wording)
TIE_RULES = {0: "half_even", 1: "half_away"}


def shift_round(x: np.ndarray, shift: int, mode: str) -> np.ndarray:
    """x / 2**shift for int64 x. Modes: 'floor' (arithmetic shift), 'half_even'
    (round to nearest, ties to even), 'half_away' (ties away from zero), 'half_up'
    (ties towards +inf)."""
    x = np.asarray(x, np.int64)
    if shift <= 0:
        return x << -shift
    q = x >> shift
    if mode == "floor":
        return q
    rem = x - (q << shift)
    half = 1 << (shift - 1)
    up = rem > half
    if mode == "half_up":
        up |= rem == half
    elif mode == "half_away":
        up |= (rem == half) & (x >= 0)
    elif mode == "half_even":
        up |= (rem == half) & ((q & 1) == 1)
    else:
        raise ValueError(mode)
    return q + up


def saturate(x: np.ndarray, code: int) -> np.ndarray:
    lo, hi = INT_RANGE[code]
    return np.clip(x, lo, hi)


def exact_int_matmul(a: np.ndarray, b: np.ndarray, bound: int | None = None) -> np.ndarray:
    """a @ b for integer-valued arrays, exactly, through float BLAS.

    Every partial sum of integer products is an integer; float32 holds them
    exactly below 2**24 and float64 below 2**53, in any summation order. So the
    reduction is cut into chunks small enough for float32 (fast sgemm) when the
    operands are small (int8), else float64, and the chunk results are summed
    in int64. `bound` caps |a_ij * b_jk| when the caller knows it (e.g. from the
    element types), saving a pass over the data."""
    k = a.shape[-1]
    if k == 0 or a.size == 0 or b.size == 0:
        return np.zeros(a.shape[:-1] + b.shape[1:], np.int64)
    prod = max(bound if bound is not None else _absmax(a) * _absmax(b), 1)
    chunk32 = (1 << 24) // prod
    if chunk32 >= 128:
        dtype, chunk = np.float32, chunk32
    else:
        dtype, chunk = np.float64, max((1 << 53) // prod, 1)
    af = a.astype(dtype, copy=False)
    bf = b.astype(dtype, copy=False)
    with blas_threads_for(a.size * b.shape[-1], b.shape[-1], order_free=True):
        if chunk >= k:
            return (af @ bf).astype(np.int64)
        if dtype is np.float32:
            # each chunk result is an exact integer below 2**24; fewer than 2**29 of
            # them sum exactly in float64
            out = np.zeros(a.shape[:-1] + b.shape[1:], np.float64)
            for k0 in range(0, k, chunk):
                out += af[..., k0:k0 + chunk] @ bf[k0:k0 + chunk]
            return out.astype(np.int64)
        out = np.zeros(a.shape[:-1] + b.shape[1:], np.int64)
        for k0 in range(0, k, chunk):
            out += (af[..., k0:k0 + chunk] @ bf[k0:k0 + chunk]).astype(np.int64)
        return out


def _absmax(x: np.ndarray) -> int:
    return max(abs(int(x.min())), abs(int(x.max())))


# Below this many multiply-adds a product runs on one BLAS thread: waking the
# pool's other threads costs more than it saves, and on a busy machine a small
# sgemm can stall for milliseconds waiting for them.
SINGLE_THREAD_MACS = 16 << 20
WIDE_COLS = 64  # an exact product with fewer output columns stays on one thread


def blas_threads_for(macs: int, cols: int = 0, order_free: bool = False):
    """Context for one matrix product of `macs` multiply-adds producing `cols`
    columns per row.

    The thread count changes sgemm's summation order, so a float product's bits
    depend on it: float products keep this fixed rule (by size). An exact integer
    product (`order_free`) has the same bits on any number of threads, so it runs
    on one thread also when it is narrow (GEMV-like: bound by memory, where the
    threads' hand-offs cost more than they share) or when the machine has no idle
    core (BLAS threads spinning for a busy core): both measured several-fold
    slower on two threads on the 2-core development machine."""
    if macs >= SINGLE_THREAD_MACS and not (order_free and (cols < WIDE_COLS or _machine_busy())):
        return blas.threads()  # the default pool, named: not whatever the caller set
    return blas.one_thread()


def _machine_busy() -> bool:
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return False
