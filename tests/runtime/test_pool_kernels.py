"""The CPU max pool (runtime/kernels/conv.py, compiled for 2-D maps by
runtime/kernels/pool_jit.py) against a float64 reference written window by
window, over a sweep of shapes, windows, strides, dilations, pads and ceil mode,
in float32, int8 and uint8 (a maximum is exact: equality), and NPU feature maps (int8, uint8, fp16
planes [C1, C2, H, W] viewed in place); its argmax output only when read."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rkc.runtime.kernels import run_kernel


def _reference(x, kernel, strides, dilations, pads, ceil_mode):
    """Each output's window gathered from the unpadded map in float64."""
    h, w = x.shape[2:]
    (kh, kw), (sy, sx), (dy, dx) = kernel, strides, dilations
    pt, pl, pb, pr = pads
    sizes = []
    for n, k, s, d, b, e in ((h, kh, sy, dy, pt, pb), (w, kw, sx, dx, pl, pr)):
        span = n + b + e - ((k - 1) * d + 1)
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= n + b:
            out -= 1
        sizes.append(out)
    y = np.empty((*x.shape[:2], *sizes))
    for oy, ox in itertools.product(range(sizes[0]), range(sizes[1])):
        rows = [oy * sy - pt + i * dy for i in range(kh) if 0 <= oy * sy - pt + i * dy < h]
        cols = [ox * sx - pl + j * dx for j in range(kw) if 0 <= ox * sx - pl + j * dx < w]
        y[:, :, oy, ox] = x[:, :, rows][:, :, :, cols].astype(np.float64).max(axis=(2, 3))
    return y


CASES = [((1, 3, 9, 9), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 0),  # ResNet's stem pool
         ((1, 16, 20, 20), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 0),  # YOLO's SPPF
         ((2, 5, 11, 7), (2, 3), (2, 1), (1, 2), (0, 1, 1, 0), 0),
         ((1, 4, 10, 13), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 1),
         ((1, 7, 6, 6), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), 0),
         ((1, 2, 15, 4), (4, 2), (3, 2), (2, 1), (1, 0, 2, 1), 1),
         ((1, 3, 8, 9), (3, 3), (1, 1), (2, 1), (2, 1, 1, 2), 0),  # stride 1: rows' maxima, then columns'
         ((2, 5, 7, 6), (3, 2), (1, 1), (1, 1), (0, 0, 0, 0), 1),
         ((1, 16, 12, 11), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 0),  # channels filling 8-byte words
         ((2, 24, 7, 9), (2, 3), (2, 1), (1, 2), (0, 1, 1, 0), 1),
         ((1, 8, 9, 8), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 0),
         ((1, 24, 6, 17), (1, 4), (1, 1), (1, 3), (0, 2, 0, 1), 0),  # stride 1, dilated, one row a window
         ((1, 40, 3, 3), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 0),  # windows past the map on every side
         ((1, 9, 13, 4), (3, 1), (1, 1), (2, 1), (2, 0, 0, 0), 1),  # one column a window, rows dilated
         ((1, 16, 9, 14), (2, 5), (2, 3), (1, 2), (1, 2, 0, 1), 1)]  # strided, dilated, 5 column taps


def _values(rng, shape, dtype):
    """Random values over the dtype's whole range for the integers (the extremes included)."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
@pytest.mark.parametrize("shape, kernel, strides, dilations, pads, ceil_mode", CASES)
def test_max_pool_matches_a_window_by_window_reference(dtype, shape, kernel, strides, dilations, pads, ceil_mode):
    rng = np.random.default_rng(sum(shape))
    x = _values(rng, shape, dtype)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dilations),
             "pads": list(pads), "ceil_mode": ceil_mode}  # ONNX pads: begins (H, W), then ends (H, W)
    want = _reference(x, kernel, strides, dilations, pads, ceil_mode)
    (got,) = run_kernel("MaxPool", [x], attrs, n_outputs=1)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float64), want)
    both = run_kernel("MaxPool", [x], attrs)  # the indices too, when read
    assert len(both) == 2 and both[1].dtype == np.int64
    np.testing.assert_array_equal(both[0], got)
    np.testing.assert_array_equal(x.reshape(-1)[both[1]], got)  # each index points at its maximum


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16])
@pytest.mark.parametrize("shape, kernel, strides, dilations, pads, ceil_mode", CASES)
def test_feature_map_planes_pool_in_place_as_the_reference(dtype, shape, kernel, strides, dilations, pads, ceil_mode):
    """An NPU feature map [C1, H, W, C2] (16-byte atoms: 16 int8 or 8 fp16 lanes) seen as planes
    [C1, C2, H, W], how runtime/feature_edges.py hands a CPU MaxPool its input: the result
    equals the reference's on the same planes (fp16 with NaN, infinities and -0.0 among the values)."""
    rng = np.random.default_rng(sum(shape) + 1)
    fm = _values(rng, (shape[0] + 1, *shape[2:], 16 // np.dtype(dtype).itemsize), dtype)
    if dtype == np.float16:
        flat = fm.reshape(-1)
        flat[rng.choice(flat.size, 4, replace=False)] = [np.nan, np.inf, -np.inf, -0.0]
    planes = fm.transpose(0, 3, 1, 2)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dilations),
             "pads": list(pads), "ceil_mode": ceil_mode}
    (got,) = run_kernel("MaxPool", [planes], attrs, n_outputs=1)
    assert got.dtype == fm.dtype
    np.testing.assert_array_equal(got.astype(np.float64),
                                  _reference(planes, kernel, strides, dilations, pads, ceil_mode))


@pytest.mark.parametrize("channels", [2, 4])  # 4 float32 channels: whole 16-byte pixels (_plane_max)
def test_a_nan_in_a_window_is_its_maximum_as_in_numpy(channels):
    x = np.random.default_rng(0).standard_normal((1, channels, 6, 6)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    (got,) = run_kernel("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [1, 1]}, n_outputs=1)
    want = _reference(x, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), 0)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.isnan(got[0, 1, 0:3, 1:4]).all() and not np.isnan(got[0, 0]).any()


@pytest.mark.parametrize("stride", [2, 1])
def test_fp16_max_pool_is_the_float32_pool_rounded_back(stride):
    x = np.random.default_rng(5).standard_normal((1, 8, 9, 9)).astype(np.float16)
    x[0, 3, 4, 4], x[0, 5, 0, 0], x[0, 6, 2, 2] = np.nan, -np.inf, -0.0
    attrs = {"kernel_shape": [3, 3], "strides": [stride, stride], "pads": [1, 1, 1, 1]}
    (got,) = run_kernel("MaxPool", [x], attrs, n_outputs=1)
    assert got.dtype == np.float16
    want = _reference(x, (3, 3), (stride, stride), (1, 1), (1, 1, 1, 1), 0)
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("coordinates, nearest, scales", [
    ("asymmetric", "floor", [1, 1, 2, 2]), ("half_pixel", "round_prefer_floor", [1, 1, 2, 2]),
    ("align_corners", "round_prefer_ceil", [1, 1, 3, 1.5]), ("pytorch_half_pixel", "ceil", [1, 1, 0.5, 2]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_nearest_resize_gathers_values_as_onnxruntime_does(coordinates, nearest, scales, dtype):
    """The nearest Resize copies input values in the input's dtype (no float round trip)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    rng = np.random.default_rng(len(coordinates))
    x = (rng.standard_normal((1, 3, 6, 10)) * 50).astype(dtype)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coordinates, "nearest_mode": nearest}
    s = np.array(scales, np.float32)
    (got,) = run_kernel("Resize", [x, None, s], attrs)
    assert got.dtype == x.dtype
    tt = helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], **attrs)
    graph = helper.make_graph([node], "r", [helper.make_tensor_value_info("x", tt, x.shape)],
                              [helper.make_tensor_value_info("y", tt, None)],
                              [onnx.numpy_helper.from_array(s, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, session.run(None, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16])
@pytest.mark.parametrize("shape, kernel, strides, dilations, pads, ceil_mode",
                         CASES + [((1, 64, 111, 111), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 1),  # SqueezeNet's pools
                                  ((1, 32, 13, 13), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 1),
                                  ((1, 48, 5, 3), (3, 2), (1, 3), (1, 1), (1, 0, 1, 1), 1)])
@pytest.mark.parametrize("zero_rows", [0, 3])
def test_a_feature_map_pools_straight_into_the_next_map(dtype, shape, kernel, strides, dilations, pads, ceil_mode,
                                                        zero_rows):
    """pool_jit.max_pool_atoms with conv.max_pool_window's geometry (runtime/feature_edges.py's
    MaxPool between two maps): the result, written in place over stale bytes into a map
    inside a larger buffer (its groups `zero_rows` rows apart: a map stored over more rows
    than it has), is the reference's on the same planes, and no byte around it moves;
    given the maps' views (copied densely around the kernel) and, through atoms_pooler, the
    arrays they are stored in (read and written in place, the input's rows past the map's
    random: a row read from there would show)."""
    from rkc.runtime.kernels import conv, pool_jit

    rng = np.random.default_rng(sum(shape) + 2)
    lanes = 16 // np.dtype(dtype).itemsize
    stored_in = _values(rng, (-(-shape[1] // lanes), shape[2] + zero_rows, shape[3], lanes), dtype)
    if dtype == np.float16:
        flat = stored_in[:, :shape[2]].reshape(-1)
        flat[rng.choice(flat.size, 4, replace=False)] = [np.nan, np.inf, -np.inf, -0.0]
        stored_in[:, :shape[2]] = flat.reshape(stored_in[:, :shape[2]].shape)
    fm = stored_in[:, :shape[2]]
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dilations),
             "pads": list(pads), "ceil_mode": ceil_mode}
    kernel_, strides_, dilations_, begin, out_hw = conv.max_pool_window(list(shape[2:]), **attrs)
    stored = (fm.shape[0], out_hw[0] + zero_rows, out_hw[1], lanes)
    n = int(np.prod(stored))
    expected = _reference(fm.transpose(0, 3, 1, 2), kernel, strides, dilations, pads, ceil_mode)
    for as_stored in (False, True):
        buffer = np.full(n + 2 * lanes, 0x5A, np.uint8 if np.dtype(dtype).itemsize == 1 else np.uint16)
        whole = buffer[lanes:lanes + n].view(dtype).reshape(stored)
        out = whole[:, :out_hw[0]]
        if as_stored:
            pool_jit.atoms_pooler(dtype, fm.shape, out.shape, kernel_, strides_, dilations_, begin)(stored_in, whole)
        else:
            pool_jit.max_pool_atoms(fm, kernel_, strides_, dilations_, begin, out)
        np.testing.assert_array_equal(out.transpose(0, 3, 1, 2).astype(np.float64), expected)
        assert (buffer[:lanes] == 0x5A).all() and (buffer[lanes + n:] == 0x5A).all()
        assert (whole[:, out_hw[0]:].view(buffer.dtype) == 0x5A).all()  # the rows past the map's


def test_fp16_keys_order_every_bit_pattern_and_map_back():
    """pool_jit's fp16 keys over all 65536 bit patterns: strictly in the values' order (-0.0
    just below +0.0), every NaN's (either sign, any payload) above +inf's, and back to the
    bits (a NaN's to the positive quiet NaN, 0x7E00)."""
    from rkc.runtime.kernels import pool_jit

    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    keys = np.array([pool_jit._sign_key(b) for b in bits], np.int64)
    values = bits.view(np.float16).astype(np.float64)
    nan = np.isnan(values)
    order = np.argsort(np.where(bits == 0x8000, -1e-300, values)[~nan])
    assert (np.diff(keys[~nan][order]) > 0).all()
    assert keys[nan].min() > keys[bits == 0x7C00][0]
    back = np.array([pool_jit._sign_value(k) for k in keys], np.uint16)
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert (back[nan] == 0x7E00).all()


@pytest.mark.parametrize("shape, kernel, strides, dilations, pads, ceil_mode",
                         [c for c in CASES if c[1][0] > 1 or c[1][1] > 1])
def test_fp16_maps_of_any_bit_pattern_pool_as_the_reference(shape, kernel, strides, dilations, pads, ceil_mode):
    """fp16 feature maps of random bit patterns (NaNs of both signs and any payload, infinities,
    subnormals, -0.0) through atoms_pooler (strided: `_block_max`; stride 1: `_plane_max`): the
    float64 reference's values, a window holding any NaN pooled to the positive quiet NaN."""
    from rkc.runtime.kernels import conv, pool_jit

    rng = np.random.default_rng(sum(shape) + 3)
    bits = rng.integers(0, 65536, (-(-shape[1] // 8), *shape[2:], 8), dtype=np.uint16)
    bits.reshape(-1)[rng.choice(bits.size, min(bits.size // 4, 64), replace=False)] = \
        rng.integers(0xFC01, 0x10000, min(bits.size // 4, 64))  # negative NaNs: the keys' wrapped end
    fm = bits.view(np.float16)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dilations),
             "pads": list(pads), "ceil_mode": ceil_mode}
    kernel_, strides_, dilations_, begin, out_hw = conv.max_pool_window(list(shape[2:]), **attrs)
    out = np.empty((fm.shape[0], *out_hw, 8), np.float16)
    pool_jit.atoms_pooler(np.float16, fm.shape, out.shape, kernel_, strides_, dilations_, begin)(fm, out)
    planes = fm.transpose(0, 3, 1, 2)
    with np.errstate(invalid="ignore"):
        want = _reference(planes, kernel, strides, dilations, pads, ceil_mode)
    got = out.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got.astype(np.float64), want)
    assert (got.view(np.uint16)[np.isnan(want)] == 0x7E00).all()
