"""fp16 segment edges (runtime/half.py, runtime/plan.py's BoTensor): the
compiled narrowing is numpy's cast, bit for bit, over every class of float32
(normals, the overflow and subnormal edges, ties, signed zeros, NaN payloads);
an fp16 GEMM operand's reader and writer give what the interpreter's
layout conversions give (runtime/execute.py), for row counts that leave
padded rows and widths that leave padded channels, in row- and column-major
and strided values."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import geometry
from rkc.ir.program import TensorInfo
from rkc.runtime import half
from rkc.runtime.execute import from_layout, to_layout
from rkc.runtime.plan import BoTensor


def _numpy_half(bits: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return bits.view(np.float32).astype(np.float16).view(np.uint16)


def _narrow(bits: np.ndarray) -> np.ndarray:
    out = np.empty(bits.size, np.uint16)
    half.narrow_all(bits, out)
    return out


EDGES = [
    (0x33000000 - 4096, 0x33000000 + 4096),  # zero and the least subnormal (2^-25 a tie to zero)
    (0x38800000 - 4096, 0x38800000 + 4096),  # the largest subnormals and the first normals
    (0x477FE000 - 4096, 0x47800000 + 4096),  # the largest fp16 and the overflow to inf
    (0x7F800000, 0x7F800000 + (1 << 16)),  # inf, then NaNs whose payload has no top bits (signalling)
    (0x7FC00000 - 16, 0x7FC00000 + 16),  # quiet NaNs
    (0, 4096),  # zero and float32 subnormals
]


@pytest.mark.parametrize("lo,hi,step", [(lo, hi, 1) for lo, hi in EDGES] + [(0x33000000, 0x38800000, 97)])
def test_narrowing_is_numpys_at_the_edges(lo, hi, step):
    bits = np.arange(lo, hi, step, dtype=np.uint32)  # the last: across every subnormal exponent
    for signed in (bits, bits | np.uint32(0x80000000)):
        np.testing.assert_array_equal(_narrow(signed), _numpy_half(signed))


def test_narrowing_is_numpys_on_a_sample():
    """4M random patterns (half.narrowed_like_numpy checks all 2^32 by hand)."""
    bits = np.random.default_rng(0).integers(0, 1 << 32, 1 << 22, dtype=np.uint64).astype(np.uint32)
    np.testing.assert_array_equal(_narrow(bits), _numpy_half(bits))
    ties = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(13)) | np.uint32(0x1000)  # exactly halfway
    ties = ties[(ties & np.uint32(0x7F800000)) != np.uint32(0x7F800000)]
    np.testing.assert_array_equal(_narrow(ties), _numpy_half(ties))


def _operand(m: int, k: int):
    info = TensorInfo("t", [m, k], "fp16", "native-gemm", "r", 0, geometry.nbytes([m, k], "native-gemm", 2))
    host = np.random.default_rng(m * k).integers(0, 256, info.nbytes, dtype=np.uint8)  # stale bytes
    return info, host


def _values(m: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(m + k)
    x = (rng.standard_normal((m, k)) * np.exp(rng.standard_normal((m, 1)) * 6)).astype(np.float32)
    x.reshape(-1)[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-8, 7e4, 65519.0]
    wide = np.zeros((m, k + 3), np.float32)
    wide[:, 1:k + 1] = x
    return {"C": x, "F": np.asfortranarray(x), "strided": wide[:, 1:k + 1]}


@pytest.mark.parametrize("m,k", [(1, 640), (5, 13), (16, 256), (37, 1000), (128, 2048)])
def test_fp16_operand_writer_and_reader_are_the_interpreters(m, k):
    info, host = _operand(m, k)
    bt = BoTensor(info, host)
    write, read = bt.writer(), bt.reader(np.float32)
    for name, x in _values(m, k).items():
        want = np.zeros(info.nbytes, np.uint8)
        with np.errstate(all="ignore"):
            to_layout(x, info, want)
        write(x)
        np.testing.assert_array_equal(host, want, err_msg=name)  # padding rows and channels zeroed too
        got = read()
        np.testing.assert_array_equal(got.view(np.uint32), from_layout(want, info).astype(np.float32).view(np.uint32))
        assert got.flags.f_contiguous  # the layout later steps were built for (column-major)


def test_fp16_operand_writer_leaves_other_values_to_numpy():
    """A float64 value, or one of the wrong size, takes numpy's assignment (its cast, or its error)."""
    info, host = _operand(4, 24)
    write = BoTensor(info, host).writer()
    x = np.random.default_rng(1).standard_normal((4, 24))
    want = np.zeros(info.nbytes, np.uint8)
    to_layout(x, info, want)
    write(x)
    np.testing.assert_array_equal(host, want)
    with pytest.raises(ValueError):
        write(np.zeros((4, 23), np.float32))
