"""Compiled (numba) depthwise 2-D convolution on fp16 NPU feature maps
[C1, H, W, C2] (ir/npu/layout.py), read and written in place: a depthwise
convolution the NPU refuses (a window over a map of fewer than 4 rows,
hardware question Q2: PP-OCR cls's 5x5 convolutions on 3- and 2-row maps) runs
here between two NPU segments, with no conversion around it
(compiler/program_steps.py's in_place_dtype, runtime/map_ops.py).

Each output value is float32: the bias, then the taps in row-major window
order, each the product of a float32 weight and the widened fp16 input, and
is rounded to fp16 once, as the float32 Conv between two Casts it replaces
(up to float32's summation order). Each tap is one vectorised pass over an
output row's 8 lanes (`_depthwise_lines`); output rows are shared by the host
threads (runtime/kernels/threads.py). `cache=True`: a machine compiles it once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rkc.runtime.half import lanes_to_rows, narrow_bits, rows_to_lanes, widen_value
from rkc.runtime.kernels.threads import over_rows

LANES = 8  # fp16 channels in a 16-byte atom: a constant trip count, so the lane loop vectorises


def lane_weights(weights: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A depthwise convolution's weights [C, 1, kh, kw] and bias [C] (or None) as the
    kernel reads them: [C1, kh, kw, C2] and [C1, C2] float32, the lanes past C zero
    (made once per step: runtime/map_ops.py keeps them)."""
    channels, kernel = weights.shape[0], weights.shape[2:]
    c1 = -(-channels // LANES)
    lanes = np.zeros((c1 * LANES, *kernel), np.float32)
    lanes[:channels] = weights[:, 0]
    b = np.zeros(c1 * LANES, np.float32)
    if bias is not None:
        b[:channels] = bias.reshape(-1)
    return np.ascontiguousarray(lanes.reshape(c1, LANES, *kernel).transpose(0, 2, 3, 1)), b.reshape(c1, LANES)


def depthwise_feature(fm: np.ndarray, weights: np.ndarray, bias: np.ndarray, strides, pads, dilations,
                      out: np.ndarray) -> None:
    """out[c1, y, x, l] = fp16(bias[c1, l] + sum over (i, j) of weights[c1, i, j, l] *
    fm[c1, y * sh - top + i * dh, x * sw - left + j * dw, l]), taps outside the map left
    out (zero padding); fm and out fp16 feature maps ([C1, H, W, C2] and [C1, Ho, Wo, C2],
    float16 or their uint16 bits), weights and bias as `lane_weights` gives them."""
    if fm.shape[3] != LANES or out.shape[3] != LANES or weights.shape[0] != fm.shape[0]:
        raise ValueError(f"fp16 feature maps of {weights.shape[0]} atoms of {LANES} channels expected, "
                         f"got {list(fm.shape)} -> {list(out.shape)}")
    src, dst = fm.view(np.uint16), out.view(np.uint16)
    sh, sw = (int(s) for s in strides)
    top, left = (int(p) for p in pads)
    dh, dw = (int(d) for d in dilations)
    vector_ops = dst.size * weights.shape[1] * weights.shape[2] // LANES  # the work: one per 8 products
    over_rows(lambda lo, hi: _depthwise_lines(src, weights, bias, dst, sh, sw, top, left, dh, dw, lo, hi),
              dst.shape[0] * dst.shape[1], vector_ops)


@njit(cache=True, nogil=True, fastmath=False)
def _depthwise_lines(src, w, b, dst, sh, sw, top, left, dh, dw, lo, hi):
    # One output row at a time. The input rows it reads are widened once into one float32 line per lane
    # (`wide`, [kh, C2, span], the zero padding written out), the row is summed in `acc` ([C2, span], the
    # first wo of each lane used) and each tap is one pass over all lanes at once, its weight spread along
    # each lane's span. Every inner loop indexes its arrays by the loop variable alone: numba's test for a
    # negative index on a computed one kept these loops from vectorising (5x slower).
    _, h, width, _ = src.shape
    kh, kw = w.shape[1], w.shape[2]
    ho, wo = dst.shape[1], dst.shape[2]
    span = max(left + width, (wo - 1) * sw + (kw - 1) * dw + 1)
    n = LANES * span
    wide = np.zeros(kh * n + span, np.float32)  # a tap's pass reads up to (kw - 1) * dw past its row
    acc = np.empty(n, np.float32)
    bits = acc.view(np.uint32)
    spread = np.empty(n, np.float32)
    rows_in = np.empty((LANES, width), np.uint16)
    rows_out = np.empty((LANES, wo), np.uint16)
    for line in range(lo, hi):
        a, y = line // ho, line % ho
        first, last = kh, 0  # the window rows inside the map
        for i in range(kh):
            row = y * sh - top + i * dh
            if 0 <= row < h:
                first, last = min(first, i), i + 1
                lanes_to_rows(src[a, row], rows_in)
                for lane in range(LANES):
                    at = (i * LANES + lane) * span + left
                    values, into = rows_in[lane], wide[at:at + width]
                    for col in range(width):
                        into[col] = widen_value(values[col])
        for lane in range(LANES):
            bias, into = b[a, lane], acc[lane * span:(lane + 1) * span]
            for x in range(span):
                into[x] = bias
        for i in range(first, last):
            for j in range(kw):
                for lane in range(LANES):
                    weight, into = w[a, i, j, lane], spread[lane * span:(lane + 1) * span]
                    for x in range(span):
                        into[x] = weight
                at = i * n + j * dw
                if sw == 1:
                    taps = wide[at:at + n]
                    for k in range(n):
                        acc[k] += spread[k] * taps[k]
                else:
                    for lane in range(LANES):
                        weight, taps, into = w[a, i, j, lane], wide[at + lane * span:], acc[lane * span:]
                        for x in range(wo):
                            into[x] += weight * taps[x * sw]
        for lane in range(LANES):
            values, into = bits[lane * span:lane * span + wo], rows_out[lane]
            for x in range(wo):
                into[x] = narrow_bits(values[x])
        rows_to_lanes(rows_out, dst[a, y])
