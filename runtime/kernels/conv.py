"""Convolution and pooling kernels over N-d spatial inputs ([N, C, *spatial]).

Convolution is im2col (numpy's sliding_window_view) followed by one matmul per
group; ConvTranspose adds one product per kernel offset into a strided slice of
the output, or, when its stride is its kernel, makes every tap in one product.
Float inputs accumulate in float32 like onnxruntime; integer inputs
(ConvInteger) accumulate exactly in float64 and return int32.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rkc.ir.npu.geometry import pads_for


def _ints(v, n: int, default: int) -> list[int]:
    return [default] * n if v is None else [int(x) for x in v]


def _windows(x: np.ndarray, kernel, strides, dilations) -> np.ndarray:
    """[N, C, *padded] -> [N, C, *out, *kernel] (a strided view)."""
    nd = len(kernel)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    win = sliding_window_view(x, eff, axis=tuple(range(2, 2 + nd)))
    index = (slice(None), slice(None), *[slice(None, None, s) for s in strides],
             *[slice(None, None, d) for d in dilations])
    return win[index]


def _conv(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, acc):
    nd = x.ndim - 2
    kernel = list(w.shape[2:]) if kernel_shape is None else [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    begin, end = pads_for(auto_pad, x.shape[2:], kernel, strides, dilations, pads)
    xp = np.pad(x.astype(acc, copy=False), [(0, 0), (0, 0), *zip(begin, end)])
    cols = _windows(xp, kernel, strides, dilations)  # [N, C, *out, *k]
    n, c = x.shape[:2]
    out_sp = cols.shape[2:2 + nd]
    m = w.shape[0]
    cg, mg = c // group, m // group
    cols = cols.reshape(n, group, cg, *out_sp, *kernel)
    # -> [N, G, *out, Cg * prod(k)]
    order = (0, 1, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    cols = cols.transpose(order).reshape(n, group, int(np.prod(out_sp, dtype=np.int64)), -1)
    # no copy of weights already in the accumulator's type (VGG-19's first fully connected
    # layer as a 7x7 convolution: 411 MB of float32 copied every run)
    wg = w.astype(acc, copy=False).reshape(group, mg, -1)  # [G, Mg, Cg * prod(k)]
    y = np.matmul(cols, wg.transpose(0, 2, 1)[None])  # [N, G, P, Mg]
    y = y.transpose(0, 1, 3, 2).reshape(n, m, *out_sp)
    if b is not None:
        y = y + b.astype(acc).reshape(1, m, *([1] * nd))
    return y


def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    return _conv(x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides, np.float32).astype(x.dtype)


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    xs = x.astype(np.float64) - (0 if x_zero_point is None else float(np.asarray(x_zero_point).reshape(-1)[0]))
    wz = 0 if w_zero_point is None else np.asarray(w_zero_point, np.float64).reshape(-1, *([1] * (w.ndim - 1)))
    ws = w.astype(np.float64) - wz
    return _conv(xs, ws, None, auto_pad, dilations, group, kernel_shape, pads, strides, np.float64).astype(np.int32)


def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    nd = x.ndim - 2
    kernel = list(w.shape[2:]) if kernel_shape is None else [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    out_pad = _ints(output_padding, nd, 0)
    in_sp = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (i - 1) + op + e for i, s, op, e in zip(in_sp, strides, out_pad, eff)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        want = ([int(v) for v in output_shape][-nd:] if output_shape is not None
                else [i * s for i, s in zip(in_sp, strides)])
        total = [f - o for f, o in zip(full, want)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        end = [t - bg for t, bg in zip(total, begin)]
    else:
        p = _ints(pads, 2 * nd, 0)
        begin, end = p[:nd], p[nd:]
    n, c = x.shape[:2]
    mg = w.shape[1]
    m = mg * group
    cg = c // group
    xg = x.astype(np.float32).reshape(n, group, cg, -1)
    wg = w.astype(np.float32).reshape(group, cg, mg, *kernel)
    if strides == kernel and all(d == 1 for d in dilations) and not any(out_pad):
        y = _interleaved(_tile_products(xg, wg, n, m, in_sp, kernel))
    else:
        y = _tapped_transpose(xg, wg, n, m, in_sp, kernel, strides, dilations, full)
    # negative padding (an output_shape larger than the full result) appends zeros
    if any(bg < 0 or e < 0 for bg, e in zip(begin, end)):
        y = np.pad(y, [(0, 0), (0, 0), *[(max(-bg, 0), max(-e, 0)) for bg, e in zip(begin, end)]])
    crop = tuple(slice(max(bg, 0), y.shape[2 + i] - max(e, 0)) for i, (bg, e) in enumerate(zip(begin, end)))
    y = np.ascontiguousarray(y[(slice(None), slice(None), *crop)])
    if b is not None:
        y += b.astype(np.float32).reshape(1, m, *([1] * nd))
    return y.astype(x.dtype, copy=False)


def conv_transpose_tiles(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                         output_padding=None, output_shape=None, pads=None, strides=None) -> np.ndarray | None:
    """A ConvTranspose whose stride is its kernel (a learned upsampling), with
    no padding, cropping or output shape: its output before the taps are
    interleaved, [N, M, *kernel, *input spatial] float32 with the bias added
    (output[n, m, i1 * k1 + t1, ...] = tiles[n, m, t1, ..., i1, ...]), so that a
    consumer can read it in place (runtime/feature_edges.py quantizes it into a
    feature map); None for any other ConvTranspose."""
    nd = x.ndim - 2
    kernel = list(w.shape[2:]) if kernel_shape is None else [int(k) for k in kernel_shape]
    if _ints(strides, nd, 1) != kernel or any(d != 1 for d in _ints(dilations, nd, 1)) \
            or any(_ints(output_padding, nd, 0)) or any(_ints(pads, 2 * nd, 0)) or output_shape is not None \
            or auto_pad not in ("NOTSET", "VALID") or list(w.shape[2:]) != kernel:
        return None
    n, c = x.shape[:2]
    m = w.shape[1] * group
    prod = _tile_products(x.astype(np.float32).reshape(n, group, c // group, -1),
                          w.astype(np.float32).reshape(group, c // group, w.shape[1], *kernel), n, m, x.shape[2:],
                          kernel)
    if b is not None:
        prod += b.astype(np.float32).reshape(1, m, *([1] * (2 * nd)))
    return prod


def _tile_products(xg, wg, n, m, in_sp, kernel):
    """Every output element of a stride = kernel ConvTranspose comes from one
    tap, so the taps are one BLAS product [G, Mg * taps, Cg] @ [N, G, Cg,
    positions] -> [N, M, *kernel, *in_sp] (PP-OCR det's 2x2/2 pair: 5.5 -> 2.2 ms
    with `_interleaved`, no zeroed output, no strided adds)."""
    group, cg, mg = wg.shape[:3]
    taps = int(np.prod(kernel))
    prod = np.matmul(wg.reshape(group, cg, mg * taps).transpose(0, 2, 1), xg)  # [N, G, Mg * taps, positions]
    return prod.reshape(n, m, *kernel, *in_sp)


def _interleaved(prod):
    """[N, M, *kernel, *in_sp] tap products -> the output [N, M, in_1 * k_1, ...]."""
    n, m = prod.shape[:2]
    nd = (prod.ndim - 2) // 2
    kernel, in_sp = prod.shape[2:2 + nd], prod.shape[2 + nd:]
    y = np.empty((n, m, *[i * k for i, k in zip(in_sp, kernel)]), np.float32)
    # y[n, m, i1, k1, i2, k2, ...] = prod[n, m, k1, k2, ..., i1, i2, ...], one tap at a time (its source
    # contiguous: one transposed copy of all taps was 3x slower)
    split = y.reshape(n, m, *[d for pair in zip(in_sp, kernel) for d in pair])
    for kidx in itertools.product(*[range(k) for k in kernel]):
        split[(slice(None), slice(None), *[a for k in kidx for a in (slice(None), k)])] = \
            prod[(slice(None), slice(None), *kidx)]
    return y


def _tapped_transpose(xg, wg, n, m, in_sp, kernel, strides, dilations, full):
    """Any ConvTranspose: one BLAS product per tap added into a strided slice of the output."""
    y = np.zeros((n, m, *full), np.float32)
    for kidx in itertools.product(*[range(k) for k in kernel]):
        wk = wg[(slice(None), slice(None), slice(None), *kidx)]  # [G, Cg, Mg]
        # one BLAS product per tap ([G, Mg, Cg] @ [N, G, Cg, positions]); einsum's loop was 20x slower
        contrib = np.matmul(wk.transpose(0, 2, 1), xg).reshape(n, m, *in_sp)
        sl = tuple(slice(k * d, k * d + s * (i - 1) + 1, s) for k, d, s, i in zip(kidx, dilations, strides, in_sp))
        y[(slice(None), slice(None), *sl)] += contrib
    return y


def _pool_geometry(spatial, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides):
    """(kernel, strides, dilations, begin pads, end pads, ceil mode's extra end padding) of a
    pool over a map of `spatial` sizes."""
    nd = len(spatial)
    kernel = [int(k) for k in kernel_shape]
    strides = _ints(strides, nd, 1)
    dilations = _ints(dilations, nd, 1)
    begin, end = pads_for(auto_pad, spatial, kernel, strides, dilations, pads)
    extra = []
    for i, k, s, d, bg, e in zip(spatial, kernel, strides, dilations, begin, end):
        span = i + bg + e - ((k - 1) * d + 1)
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= i + bg:  # the last window must start inside input or left pad
            out -= 1
        extra.append(max((out - 1) * s + (k - 1) * d + 1 - (i + bg + e), 0))
    return kernel, strides, dilations, begin, end, extra


def _pool_sizes(spatial, kernel, strides, dilations, begin, end, extra) -> list[int]:
    """The output's sizes of a pool (_pool_geometry's figures)."""
    return [(i + bg + e + x_ - ((k - 1) * d + 1)) // s + 1
            for i, k, s, d, bg, e, x_ in zip(spatial, kernel, strides, dilations, begin, end, extra)]


def max_pool_window(spatial, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
                    storage_order=0, strides=None) -> tuple:
    """(kernel, strides, dilations, begin pads, output sizes) of a 2-D MaxPool over a map of
    `spatial` sizes, as `max_pool` computes it (MaxPool's attributes; storage_order only
    orders the indices): for a caller that pools with pool_jit directly, its geometry
    worked out once. ValueError for a window that is not 2-D."""
    if len(spatial) != 2 or len(kernel_shape) != 2:
        raise ValueError(f"a {len(kernel_shape)}-D window over {len(spatial)}-D maps, not a 2-D pool")
    kernel, strides, dil, begin, end, extra = _pool_geometry(spatial, auto_pad, ceil_mode, dilations,
                                                             kernel_shape, pads, strides)
    return kernel, strides, dil, begin, _pool_sizes(spatial, kernel, strides, dil, begin, end, extra)


def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None, storage_order=0,
             strides=None, n_outputs=2):
    """MaxPool; its second output (the argmax indices) only when the step reads it
    (`n_outputs`, passed by run_kernel): most models never do, and it cost more than the pool."""
    kernel, strides, dil, begin, end, extra = _pool_geometry(x.shape[2:], auto_pad, ceil_mode, dilations,
                                                             kernel_shape, pads, strides)
    low = np.array(-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min, dtype=x.dtype)
    nd = len(kernel)
    if n_outputs < 2 and nd == 2:
        from rkc.runtime.kernels import pool_jit  # numba: loaded by programs that pool on the CPU

        if x.dtype in pool_jit.DTYPES:
            out_hw = _pool_sizes(x.shape[2:], kernel, strides, dil, begin, end, extra)
            return pool_jit.max_pool_2d(x, low, kernel, strides, dil, begin, out_hw)
    xp = np.pad(x, [(0, 0), (0, 0), *zip(begin, [e + x_ for e, x_ in zip(end, extra)])], constant_values=low)
    win = _windows(xp, kernel, strides, dil)
    y = win.max(axis=tuple(range(-nd, 0)))
    if n_outputs < 2:
        return y
    return y, _argmax_indices(x, win, kernel, strides, dil, begin, storage_order)


def _argmax_indices(x, win, kernel, strides, dilations, begin, storage_order) -> np.ndarray:
    """MaxPool's second output: the flat index of each maximum in the unpadded
    input ([N, C, *spatial], row-major, or column-major over H, W with storage_order=1)."""
    nd = len(kernel)
    out_sp = win.shape[2:2 + nd]
    flat = win.reshape(*win.shape[:2 + nd], -1)
    arg = flat.argmax(axis=-1)  # first maximum, like onnxruntime
    k_pos = np.unravel_index(arg, kernel)
    coords = []
    for a in range(nd):
        grid = np.arange(out_sp[a]).reshape([-1 if i == a else 1 for i in range(nd)]) * strides[a] - begin[a]
        coords.append(grid + k_pos[a] * dilations[a])
    spatial = x.shape[2:]
    if storage_order and nd == 2:
        inner = coords[1] * spatial[0] + coords[0]
    else:
        inner = np.ravel_multi_index(tuple(np.broadcast_arrays(*coords)), spatial, mode="clip")
    n, c = x.shape[:2]
    base = (np.arange(n).reshape(-1, 1) * c + np.arange(c).reshape(1, -1)) * int(np.prod(spatial))
    return (base.reshape(n, c, *[1] * nd) + inner).astype(np.int64)


def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                 pads=None, strides=None):
    kernel, strides, dil, begin, end, extra = _pool_geometry(x.shape[2:], auto_pad, ceil_mode, dilations,
                                                             kernel_shape, pads, strides)
    nd = len(kernel)
    if nd == 2 and x.dtype in (np.float32, np.float64):
        from rkc.runtime.kernels import pool_jit  # numba: loaded by programs that pool on the CPU

        out_hw = _pool_sizes(x.shape[2:], kernel, strides, dil, begin, end, extra)
        return pool_jit.average_pool_2d(x, kernel, strides, dil, begin, end, out_hw, bool(count_include_pad))
    widths = [(0, 0), (0, 0), *zip(begin, [e + x_ for e, x_ in zip(end, extra)])]
    xp = np.pad(x.astype(np.float64), widths)
    # which positions count towards the divisor: the input (and the explicit pads
    # with count_include_pad), never the ceil-mode overhang
    ones = np.ones((1, 1, *x.shape[2:]))
    if count_include_pad:
        counted = np.pad(ones, [(0, 0), (0, 0), *zip(begin, end)], constant_values=1)
        counted = np.pad(counted, [(0, 0), (0, 0), *[(0, e) for e in extra]])
    else:
        counted = np.pad(ones, widths)
    total = _windows(xp, kernel, strides, dil).sum(axis=tuple(range(-nd, 0)))
    count = _windows(counted, kernel, strides, dil).sum(axis=tuple(range(-nd, 0)))
    return (total / count).astype(x.dtype)


def global_average_pool(x):
    # float32 (float64 for float64 input): numpy sums a contiguous row pairwise, so the error stays at
    # rounding's (the float64 mean was 4x slower: PP-OCR det's SE blocks pool 96x120x120 maps)
    work = np.float64 if x.dtype == np.float64 else np.float32
    rows = np.ascontiguousarray(x, work).reshape(*x.shape[:2], -1)
    mean = rows.sum(axis=-1, dtype=work) / work(rows.shape[-1])
    return mean.reshape(*x.shape[:2], *([1] * (x.ndim - 2))).astype(x.dtype, copy=False)


def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


def lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    # float32 (float64 for float64 input): the window sums of squares in one compiled pass, the power in
    # place (Inception v1's 192x55x55 LRN: 8.0 ms in float64 numpy, 1.6 in float32 numpy, 1.2 now)
    from rkc.runtime.kernels import lrn_jit  # numba: loaded by programs with an LRN

    dtype, work = x.dtype, np.float64 if x.dtype == np.float64 else np.float32
    x = np.ascontiguousarray(x, work)
    acc = lrn_jit.window_sums(x, (size - 1) // 2, -(-(size - 1) // 2), alpha / size, bias)
    np.power(acc, work(-beta), out=acc)
    acc *= x
    return acc.astype(dtype, copy=False)


KERNELS = {
    "Conv": conv, "ConvInteger": conv_integer, "ConvTranspose": conv_transpose,
    "MaxPool": max_pool, "AveragePool": average_pool, "GlobalAveragePool": global_average_pool,
    "GlobalMaxPool": global_max_pool, "LRN": lrn,
}
