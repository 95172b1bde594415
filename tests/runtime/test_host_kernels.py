"""Host kernels that compute in float32 (runtime/kernels: Softmax, LRN,
ConvTranspose) against float64 references written from the ONNX definitions,
over shape sweeps, within float32 tolerances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rkc.runtime.kernels import run_kernel


def _one(op, inputs, attrs):
    (y,) = run_kernel(op, inputs, attrs, n_outputs=1)
    return y


@pytest.mark.parametrize("shape, axis", [((1, 2, 40, 40), -1), ((3, 17), 0), ((2, 5, 7), 1), ((1, 1000), 1),
                                         ((4, 3, 9, 2), 2), ((2, 3, 400), -1), ((5, 17), 1), ((7, 1), -1),
                                         ((3, 16), 1), ((1, 2, 400, 400), 3)])
def test_softmax_matches_float64(shape, axis):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 6).astype(np.float32)
    xd = x.astype(np.float64)
    e = np.exp(xd - xd.max(axis=axis, keepdims=True))
    want = e / e.sum(axis=axis, keepdims=True)
    got = _one("Softmax", [x], {"axis": axis})
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _lrn_reference(x, size, alpha, beta, bias):
    xd, c = x.astype(np.float64), x.shape[1]
    y = np.empty_like(xd)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + -(-(size - 1) // 2))
        square_sum = (xd[:, lo:hi + 1] ** 2).sum(axis=1)
        y[:, ch] = xd[:, ch] / (bias + alpha / size * square_sum) ** beta
    return y


@pytest.mark.parametrize("shape", [(1, 12, 5, 7), (2, 3, 4, 4), (1, 1, 3, 3), (1, 20, 2, 9)])
@pytest.mark.parametrize("size, alpha, beta, bias", [(5, 1e-4, 0.75, 1.0), (3, 2e-3, 0.5, 2.0), (4, 1e-2, 1.0, 1.5),
                                                     (1, 1e-3, 0.75, 1.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_lrn_matches_float64(shape, size, alpha, beta, bias, dtype):
    x = (np.random.default_rng(sum(shape) + size).standard_normal(shape) * 20).astype(dtype)
    got = _one("LRN", [x], {"size": size, "alpha": alpha, "beta": beta, "bias": bias})
    assert got.dtype == dtype and got.shape == x.shape
    want = _lrn_reference(x, size, alpha, beta, bias)
    tol = 2e-6 if dtype == np.float32 else 1e-3
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())


def _conv_transpose_reference(x, w, b, strides, pads, dilations, group, output_padding):
    """ONNX ConvTranspose element by element in float64 (2-D)."""
    n, c, ih, iw = x.shape
    mg, kh, kw = w.shape[1:]
    (sy, sx), (dy, dx), (opy, opx) = strides, dilations, output_padding
    full = np.zeros((n, mg * group, sy * (ih - 1) + opy + (kh - 1) * dy + 1, sx * (iw - 1) + opx + (kw - 1) * dx + 1))
    cg = c // group
    for g, ky, kx in itertools.product(range(group), range(kh), range(kw)):
        wk = w[g * cg:(g + 1) * cg, :, ky, kx].astype(np.float64)  # [Cg, Mg]
        contrib = np.einsum("ncyx,cm->nmyx", x[:, g * cg:(g + 1) * cg].astype(np.float64), wk)
        full[:, g * mg:(g + 1) * mg, ky * dy:ky * dy + sy * (ih - 1) + 1:sy, kx * dx:kx * dx + sx * (iw - 1) + 1:sx] \
            += contrib
    pt, pl, pb, pr = pads
    y = full[:, :, pt:full.shape[2] - pb, pl:full.shape[3] - pr]
    return y + (0 if b is None else b.astype(np.float64).reshape(1, -1, 1, 1))


CT_CASES = [  # (x shape, out channels per group, kernel, strides, pads, dilations, group, output_padding)
    ((1, 24, 6, 5), 24, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1, (0, 0)),  # PP-OCR det's learned upsampling
    ((2, 6, 4, 3), 1, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1, (0, 0)),
    ((1, 4, 3, 5), 3, (3, 2), (3, 2), (1, 0, 0, 1), (1, 1), 1, (0, 0)),  # strided = kernel, cropped
    ((1, 6, 4, 4), 2, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 3, (0, 0)),  # grouped
    ((1, 3, 5, 5), 4, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, (1, 1)),  # overlapping taps
    ((1, 2, 4, 4), 2, (2, 2), (2, 2), (0, 0, 0, 0), (2, 2), 1, (0, 0)),  # dilated
    ((1, 2, 4, 4), 2, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1, (1, 0)),  # output padding
]


@pytest.mark.parametrize("shape, mg, kernel, strides, pads, dilations, group, out_pad", CT_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose_matches_float64(shape, mg, kernel, strides, pads, dilations, group, out_pad, bias):
    rng = np.random.default_rng(sum(shape) + sum(kernel) + group)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], mg, *kernel)).astype(np.float32)
    b = rng.standard_normal(mg * group).astype(np.float32) if bias else None
    attrs = {"strides": list(strides), "pads": list(pads), "dilations": list(dilations), "group": group,
             "output_padding": list(out_pad)}
    got = _one("ConvTranspose", [x, w, b], attrs)
    want = _conv_transpose_reference(x, w, b, strides, pads, dilations, group, out_pad)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("shape", [(1, 96, 120, 120), (2, 3, 5, 7), (1, 4, 9), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_average_pool_matches_float64(shape, dtype):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 3 + 1).astype(dtype)
    got = _one("GlobalAveragePool", [x], {})
    assert got.dtype == dtype and got.shape == (*shape[:2], *[1] * (len(shape) - 2))
    want = x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-6 if dtype == np.float32 else 1e-3, atol=1e-6)


def test_small_maps_stay_on_the_callers_thread():
    from rkc.runtime.kernels import threads
    from rkc.runtime.llm.threads import THREADS

    share = threads.ELEMENTS_PER_THREAD
    assert threads.threads_for(2 * share - 1) == 1  # a second thread only for a whole share of its own
    assert threads.threads_for(2 * share) == min(2, THREADS)
    assert threads.threads_for(THREADS * share) == THREADS
    assert threads.threads_for(100 * THREADS * share) == THREADS
    seen = []
    threads.over_rows(lambda lo, hi: seen.append((lo, hi)), 10, 100)
    assert seen == [(0, 10)]  # one range, this thread


def test_kernels_split_over_threads_give_the_one_thread_result(monkeypatch):
    """The map kernels' rows shared among threads (forced: one element per thread's share)
    write what the caller's thread alone writes."""
    from rkc.runtime.half import unpack_feature_bits, widen_feature
    from rkc.runtime.kernels import threads
    from rkc.runtime.kernels.pixels_jit import pixels_into_feature

    rng = np.random.default_rng(7)
    fm = rng.integers(0, 1 << 16, (3, 9, 11, 8), dtype=np.uint16)
    pixels = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
    tables = rng.integers(0, 1 << 16, (3, 256), dtype=np.uint16)

    def outputs():
        wide, kept, image = np.empty((20, 9, 11), np.uint32), np.empty((20, 9, 11), np.uint16), \
            np.full((1, 9, 11, 8), 7, np.uint16)
        widen_feature(fm, wide)
        unpack_feature_bits(fm, kept)
        pixels_into_feature(pixels, tables, image)
        return wide, kept, image

    alone = outputs()
    monkeypatch.setattr(threads, "ELEMENTS_PER_THREAD", 1)
    assert threads.threads_for(fm.size) == threads.THREADS
    for got, want in zip(outputs(), alone):
        np.testing.assert_array_equal(got, want)


def _average_pool_reference(x, kernel, strides, pads, dilations, include_pad, ceil_mode):
    """ONNX AveragePool in float64, window by window."""
    (kh, kw), (sy, sx), (dy, dx) = kernel, strides, dilations
    pt, pl, pb, pr = pads
    h, w = x.shape[2:]
    size = [(n + a + b - ((k - 1) * d + 1)) for n, a, b, k, d in ((h, pt, pb, kh, dy), (w, pl, pr, kw, dx))]
    oh, ow = [(-(-v // s) if ceil_mode else v // s) + 1 for v, s in zip(size, (sy, sx))]
    if ceil_mode:  # the last window must start inside the input or its left padding
        oh -= (oh - 1) * sy >= h + pt
        ow -= (ow - 1) * sx >= w + pl
    out = np.zeros((*x.shape[:2], oh, ow))
    for oy, ox in itertools.product(range(oh), range(ow)):
        total, count = 0.0, 0
        for ky, kx in itertools.product(range(kh), range(kw)):
            y, xx = oy * sy - pt + ky * dy, ox * sx - pl + kx * dx
            inside = 0 <= y < h and 0 <= xx < w
            if inside:
                total = total + x[:, :, y, xx].astype(np.float64)
            if inside or (include_pad and -pt <= y < h + pb and -pl <= xx < w + pr):
                count += 1
        out[:, :, oy, ox] = total / max(count, 1)
    return out


@pytest.mark.parametrize("shape, kernel, strides, pads, dilations, ceil_mode", [
    ((1, 24, 56, 56), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),  # ShuffleNet's
    ((1, 16, 28, 28), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),  # Inception v2's pool branch
    ((2, 5, 9, 11), (2, 3), (2, 1), (0, 1, 1, 2), (1, 1), 0),
    ((1, 7, 10, 9), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((1, 3, 13, 12), (3, 2), (3, 2), (1, 0, 1, 1), (2, 1), 1),
    ((1, 1024, 7, 7), (7, 7), (1, 1), (0, 0, 0, 0), (1, 1), 0)])
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_average_pool_matches_float64(shape, kernel, strides, pads, dilations, ceil_mode, include_pad, dtype):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 3 + 1).astype(dtype)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads),
             "dilations": list(dilations), "ceil_mode": ceil_mode, "count_include_pad": include_pad}
    got = _one("AveragePool", [x], attrs)
    want = _average_pool_reference(x, kernel, strides, pads, dilations, include_pad, ceil_mode)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("shape, axis, scale_shape, bias", [
    ((4, 128), -1, (128,), True), ((1, 7, 96), -1, (96,), True), ((2, 3, 5, 8), 2, (5, 8), True),
    ((3, 17), 0, (3, 17), False), ((2, 6, 9), 1, (1, 9), True), ((5, 1), -1, (1,), True),
    ((1, 2048), 1, (2048,), False), ((3, 4, 33), -1, (), True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_layer_normalization_matches_float64(shape, axis, scale_shape, bias, dtype):
    rng = np.random.default_rng(sum(shape) + len(scale_shape))
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    scale = rng.standard_normal(scale_shape).astype(np.float32)
    b = rng.standard_normal(scale_shape).astype(np.float32) if bias else None
    axes = tuple(range(axis % x.ndim, x.ndim))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt(((xd - mean) ** 2).mean(axis=axes, keepdims=True) + 1e-5)
    want = (xd - mean) * inv_std * scale.astype(np.float64) + (0.0 if b is None else b.astype(np.float64))
    y, got_mean, got_inv_std = run_kernel("LayerNormalization", [x, scale, b], {"axis": axis}, n_outputs=3)
    assert y.dtype == dtype and y.shape == x.shape
    assert got_mean.shape == got_inv_std.shape == mean.shape
    tol = {np.float16: (1e-3, 1e-3), np.float32: (1e-6, 1e-6), np.float64: (1e-12, 1e-12)}[dtype]
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol[0], atol=tol[1] * np.abs(want).max())
    np.testing.assert_allclose(got_mean, mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got_inv_std, inv_std, rtol=1e-6)
