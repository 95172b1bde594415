"""The geometry an rkbin fixes and both sides read: how a logical tensor is
stored as an NPU feature map (the byte layouts themselves are ir/npu/layout.py),
and the padding of a convolution window. The compiler plans bytes and windows
with it; the runtime converts tensors at segment edges and runs CPU kernels with
the same numbers.

Layout names in TensorInfo.layout:
  "native"       [1, C, H, W]          -> feature C x H x W; a map of fewer than 4 rows
                 (FEW_ROWS_STORED; not [1, C, 1, 1], a channel gate's weights) is stored in 4-row surfaces whose rows past H are
                 zero, and the program keeps them zero (its memory plan never lends
                 those bytes to another tensor; compiler/module_builder.py): a
                 convolution reads the 4 rows a task needs (Q2) with its bottom
                 padding that many rows smaller (a zero row and a padded row give the
                 same sum), and writers of the map write its H rows only
  "native-gemm"  [M, K] or [1, M, K]   -> feature C=K, H=align(M, 4), W=1 (a GEMM
                 operand; rows past M are padding the NPU reads and writes:
                 single-column maps of fewer than 4 rows compute wrongly on silicon,
                 rocket-userspace include/rocket_matmul.h, hw-matmul.md 2.3);
                 also [1, C, 1, 1] (one value per channel), held as the row [1, C]
  "native-weights" [K, N] or [1, K, N] -> a GEMM's run-time B operand in the 1x1
                 weight layout (layout.pack_weights of B^T: N kernels of K
                 channels), which the CNA reads as weights (api.Gemm.b_buffer)
"""

from __future__ import annotations

import numpy as np

from rkc.ir.npu import layout

GEMM_ROW_ALIGN = 4  # GEMM rows are padded to 4: H < 4 single-column maps are broken on
# silicon (rocket-userspace include/rocket_matmul.h @ e0677862; hw-matmul.md 2.3)
FEW_ROWS_STORED = 4  # a native map of fewer rows is stored in surfaces of this many (Q2)


def feature_map(shape, kind: str) -> tuple[int, int, int, int]:
    """(channels, logical rows, stored rows, width) of the feature map."""
    if kind == "native":
        if len(shape) != 4 or shape[0] != 1:
            raise ValueError(f"a native feature map is [1, C, H, W], not {list(shape)}")
        h, w = int(shape[2]), int(shape[3])
        # one position per channel is the 1x1 depthwise weight layout (a channel gate):
        # read as weights, never as a window over rows
        return int(shape[1]), h, h if h * w == 1 else max(h, FEW_ROWS_STORED), w
    if kind == "native-gemm":
        if len(shape) == 4 and shape[0] == 1 and shape[2] == shape[3] == 1:
            m, k = 1, int(shape[1])
        elif len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1):
            raise ValueError(f"a GEMM operand is [M, K], [1, M, K] or [1, K, 1, 1], not {list(shape)}")
        else:
            m, k = int(shape[-2]), int(shape[-1])
        return k, m, layout.align(m, GEMM_ROW_ALIGN), 1
    raise ValueError(f"unknown NPU layout {kind!r}")


def zero_rows(shape, kind: str) -> bool:
    """The tensor is a native map stored with zero rows below it, which the program
    must keep zero (no other tensor may reuse those bytes)."""
    if kind != "native":
        return False
    _, h, rows, _ = feature_map(shape, kind)
    return rows > h


def _weights_kn(shape) -> tuple[int, int]:
    """(K, N) of a run-time GEMM B operand held as "native-weights"."""
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1):
        raise ValueError(f"a run-time GEMM B operand is [K, N] or [1, K, N], not {list(shape)}")
    return int(shape[-2]), int(shape[-1])


def nbytes(shape, kind: str, itemsize: int) -> int:
    if kind == "native-weights":
        k, n = _weights_kn(shape)
        return layout.weight_bytes(layout.align(n, layout.kernel_group_for(itemsize)), 1, 1, k, itemsize)
    c, _, rows, w = feature_map(shape, kind)
    return layout.feature_bytes(c, rows, w, itemsize)


def pack(value: np.ndarray, kind: str) -> np.ndarray:
    """Logical array -> native bytes (padding channels and rows are zero)."""
    if kind == "native-weights":
        k, n = _weights_kn(value.shape)
        kernels = np.zeros((layout.align(n, layout.kernel_group_for(value.dtype.itemsize)), 1, 1, k), value.dtype)
        kernels[:n, 0, 0] = value.reshape(k, n).T  # zero kernels up to whole groups, as the GEMM reads them
        return layout.pack_weights(kernels)
    c, h, rows, w = feature_map(value.shape, kind)
    chw = value.reshape(c, h, w) if kind == "native" else value.reshape(h, c).T.reshape(c, h, 1)
    if rows > h:
        chw = np.concatenate([chw, np.zeros((c, rows - h, w), chw.dtype)], axis=1)
    return layout.pack_feature(np.ascontiguousarray(chw))


def unpack(raw: np.ndarray, shape, kind: str, dtype: np.dtype) -> np.ndarray:
    """A new array: never a view of `raw` (a BO's memory, which the NPU rewrites
    once the CPU hands it back)."""
    if kind == "native-weights":
        k, n = _weights_kn(shape)
        flat = np.ascontiguousarray(raw[:nbytes(shape, kind, np.dtype(dtype).itemsize)]).view(dtype)
        kernels = layout.align(n, layout.kernel_group_for(np.dtype(dtype).itemsize))
        w = layout.unpack_weights(flat, kernels, 1, 1, k)[:n, 0, 0, :k]
        return np.array(w.T, copy=True).reshape(shape)
    c, h, rows, w = feature_map(shape, kind)
    view = layout.feature_view(raw, c, rows, w, dtype)
    chw = layout.unpack_feature(np.ascontiguousarray(view), c)[:, :h]
    out = chw.reshape(c, h, w) if kind == "native" else chw[:, :, 0].T
    return np.array(out, copy=True).reshape(shape)


# -- convolution windows (the compiler's shape rules and emitters, the CPU kernels) --------
def native_positions(shape, kind: str, nbytes: int) -> np.ndarray:
    """For each logical element of a 2-byte tensor of `shape` stored in `nbytes` of layout
    `kind` (row-major order), its element's place in those bytes: the layout's unpack of
    the element numbers, 16 bits at a time (as many as the numbers have)."""
    count = nbytes // 2
    numbers = np.arange(count, dtype=np.int64)
    out = np.zeros(int(np.prod(shape, dtype=np.int64)), np.int64)
    for shift in range(0, max(count - 1, 1).bit_length(), 16):
        part = unpack((numbers >> shift & 0xFFFF).astype(np.uint16).view(np.uint8), shape, kind, np.uint16)
        out |= part.astype(np.int64).reshape(-1) << shift
    return out


def pads_for(auto_pad: str, in_sizes, kernel, strides, dilations, pads) -> tuple[list[int], list[int]]:
    """(begin, end) paddings per spatial axis, after ONNX's auto_pad rules."""
    n = len(in_sizes)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i, k, s in zip(in_sizes, eff, strides):
            total = max((-(-i // s) - 1) * s + k - i, 0)
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return begin, end
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    p = [0] * (2 * n) if pads is None else [int(x) for x in pads]
    return p[:n], p[n:]
