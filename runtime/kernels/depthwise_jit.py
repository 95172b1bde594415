"""Compiled (numba) depthwise 2-D convolution on fp16 NPU feature maps
[C1, H, W, C2] (ir/npu/layout.py), read and written in place: a depthwise
convolution the NPU refuses (a window over a map of fewer than 4 rows,
hardware question Q2: PP-OCR cls's 5x5 convolutions on 3- and 2-row maps) runs
here between two NPU segments, with no conversion around it
(compiler/program_steps.py's in_place_dtype, runtime/feature_edges.py).

Each output value is float32: the bias, then the taps in row-major window
order, each the product of a float32 weight and the widened fp16 input, and
is rounded to fp16 once, as the float32 Conv between two Casts it replaces
(up to float32's summation order). The C2 lanes of an atom are the innermost
loop (8 fp16 channels at a time); output rows are shared by the host threads
(runtime/kernels/threads.py). `cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import narrow_bits, widen_value
from rkc.runtime.kernels.threads import over_rows

LANES = 8  # fp16 channels in a 16-byte atom: a constant trip count, so the lane loop vectorises


def depthwise_feature(fm: np.ndarray, weights: np.ndarray, bias: np.ndarray | None, strides, pads, dilations,
                      out: np.ndarray) -> None:
    """out[c1, y, x, l] = fp16(bias[c] + sum over (i, j) of weights[c, 0, i, j] *
    fm[c1, y * sh - top + i * dh, x * sw - left + j * dw, l]) for channel c = c1 * C2 + l,
    taps outside the map left out (zero padding); fm and out fp16 feature maps
    ([C1, H, W, C2] and [C1, Ho, Wo, C2], float16 or their uint16 bits), weights
    [C, 1, kh, kw]; the lanes past C get zero weights and bias."""
    c1, _, _, c2 = fm.shape
    if c2 != LANES or out.shape[3] != LANES:
        raise ValueError(f"fp16 feature maps hold {LANES} channels an atom, not {c2}")
    channels = weights.shape[0]
    lanes = np.zeros((c1 * c2, *weights.shape[2:]), np.float32)
    lanes[:channels] = weights[:, 0]
    w = np.ascontiguousarray(lanes.reshape(c1, c2, *weights.shape[2:]).transpose(0, 2, 3, 1))  # [C1, kh, kw, C2]
    b = np.zeros(c1 * c2, np.float32)
    if bias is not None:
        b[:channels] = bias.reshape(-1)
    b = b.reshape(c1, c2)
    src, dst = fm.view(np.uint16), out.view(np.uint16)
    sh, sw = (int(s) for s in strides)
    top, left = (int(p) for p in pads)
    dh, dw = (int(d) for d in dilations)
    over_rows(lambda lo, hi: _depthwise_lines(src, w, b, dst, sh, sw, top, left, dh, dw, lo, hi),
              dst.shape[0] * dst.shape[1], dst.size * w.shape[1] * w.shape[2])


@njit(cache=True, nogil=True)
def _depthwise_lines(src, w, b, dst, sh, sw, top, left, dh, dw, lo, hi):
    _, h, width, _ = src.shape
    kh, kw = w.shape[1], w.shape[2]
    ho, wo = dst.shape[1], dst.shape[2]
    # the input rows one output row reads, widened once into one plane per lane with the zero padding
    # written out: the tap loops then run along the output row, vectorised, with no bounds tests
    span = max(left + width, (wo - 1) * sw + (kw - 1) * dw + 1)
    wide = np.zeros((LANES, kh, span), np.float32)
    acc = np.empty((LANES, wo), np.float32)
    bits = acc.view(np.uint32)
    for line in range(lo, hi):
        a, y = line // ho, line % ho
        first, last = kh, 0  # the taps whose row is inside the map
        for i in range(kh):
            row = y * sh - top + i * dh
            if 0 <= row < h:
                first, last = min(first, i), i + 1
                for col in range(width):
                    for lane in range(LANES):
                        wide[lane, i, left + col] = widen_value(src[a, row, col, lane])
        for lane in range(LANES):
            plane, out, bias = wide[lane], acc[lane], b[a, lane]
            for x in range(wo):
                out[x] = bias
            for i in range(first, last):
                taps = plane[i]
                for j in range(kw):
                    weight, base = w[a, i, j, lane], j * dw
                    if sw == 1:
                        for x in range(wo):
                            out[x] += weight * taps[x + base]
                    else:
                        for x in range(wo):
                            out[x] += weight * taps[x * sw + base]
        for x in range(wo):
            for lane in range(LANES):
                dst[a, y, x, lane] = narrow_bits(bits[lane, x])
