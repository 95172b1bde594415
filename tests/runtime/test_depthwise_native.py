"""The depthwise convolution on fp16 NPU feature maps (runtime/kernels/depthwise_jit.py)
against a float64 reference written window by window, over a sweep of channel counts
(atoms part-filled), map sizes (fewer than 4 rows: why it runs on the CPU), windows,
strides, dilations and pads: each output within one fp16 step of the reference (it is
a float32 sum rounded to fp16 once), the atoms' padding lanes zero."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rkc.ir.npu import layout
from rkc.runtime.kernels import depthwise_jit


def _reference(x, w, b, strides, dilations, pads, out_hw):
    """x [C, H, W], w [C, 1, kh, kw], b [C] -> [C, Ho, Wo] float64, zero padding."""
    c, h, width = x.shape
    kh, kw = w.shape[2:]
    y = np.empty((c, *out_hw))
    for oy, ox in itertools.product(range(out_hw[0]), range(out_hw[1])):
        acc = b.astype(np.float64).copy()
        for i, j in itertools.product(range(kh), range(kw)):
            row, col = oy * strides[0] - pads[0] + i * dilations[0], ox * strides[1] - pads[1] + j * dilations[1]
            if 0 <= row < h and 0 <= col < width:
                acc += w[:, 0, i, j].astype(np.float64) * x[:, row, col].astype(np.float64)
        y[:, oy, ox] = acc
    return y


def _feature(x: np.ndarray) -> np.ndarray:
    """[C, H, W] float16 -> its fp16 feature map [C1, H, W, 8] (ir/npu/layout.py; padding lanes zero)."""
    return layout.pack_feature(x)


CASES = [(88, 3, 96, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # PP-OCR cls's 5x5 on 3 rows
         (104, 3, 96, (5, 5), (2, 1), (1, 1), (2, 2, 2, 2)),  # ... strided down to 2 rows
         (200, 2, 24, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
         (13, 1, 17, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # part-filled atoms, one row
         (21, 3, 11, (3, 5), (1, 2), (1, 2), (0, 3, 1, 1)),
         (8, 6, 9, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),
         (5, 2, 7, (3, 3), (1, 1), (2, 1), (2, 1, 2, 1))]


@pytest.mark.parametrize("c, h, w, kernel, strides, dilations, pads", CASES)
def test_depthwise_on_feature_maps_matches_float64(c, h, w, kernel, strides, dilations, pads):
    rng = np.random.default_rng(c * 1000 + h * 10 + w)
    x = rng.standard_normal((c, h, w)).astype(np.float16)
    weights = (rng.standard_normal((c, 1, *kernel)) / np.prod(kernel)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    out_hw = [(n + pads[a] + pads[a + 2] - (k - 1) * d - 1) // s + 1
              for a, (n, k, s, d) in enumerate(zip((h, w), kernel, strides, dilations))]
    fm_out = np.full((-(-c // 8), *out_hw, 8), np.float16(7))  # stale values: every lane must be written
    lanes = depthwise_jit.lane_weights(weights, bias)
    depthwise_jit.depthwise_feature(_feature(x), *lanes, strides, pads[:2], dilations, fm_out)
    want = _reference(x, weights, bias, strides, dilations, pads, out_hw)
    got = layout.unpack_feature(fm_out, c).astype(np.float64)
    step = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)  # one fp16 step at the result
    assert np.all(np.abs(got - want) <= step), np.max(np.abs(got - want) / step)
    assert not np.any(fm_out[-1, :, :, c - 8 * (fm_out.shape[0] - 1):])  # the padding lanes
