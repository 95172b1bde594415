"""A stride-2 convolution of a uint8 RGB image reads it as 2x2 blocks
(compiler/passes/image_blocks.py): SpaceToDepth(2), then a stride-1 convolution
with the taps regrouped. The rewritten graph computes the original's products
(reference kernels, float64 weights: within float32 rounding) over kernel sizes,
pads and map sizes; the runtime's block pass writes SpaceToDepth's map
(runtime/kernels/pixels_jit.py, bit for bit, tables and computed codes). On the
simulator against onnxruntime (fp16, int8; YOLO's and ResNet's stems):
tests/runtime/test_image_input.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc.compiler.frontend import load_graph
from rkc.compiler.passes import run_passes
from rkc.compiler.reference import run_graph
from rkc.runtime import image_edges
from rkc.runtime.kernels import pixels_jit, shape as shape_kernels
from onnx_models import save

MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


def _stem(h: int, w: int, k: int, pads: list[int], channels: int = 3, out: int = 8, stride: int = 2):
    rng = np.random.default_rng(h * 31 + w * 7 + k)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=pads, strides=[stride, stride]),
             helper.make_node("Relu", ["c0"], ["y"])]
    inits = {"w0": rng.standard_normal((out, channels, k, k)) / k, "b0": rng.standard_normal(out) * 0.1}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _graph(tmp_path, model, images=True):
    path = save(model, tmp_path / "m.onnx")
    channels = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    means, stds = (MEAN + (0.0,))[:channels], (STD + (1.0,))[:channels]  # a 4th channel: its values as they are
    return run_passes(load_graph(path, image_inputs={"x": (means, stds)} if images else None))


@pytest.mark.parametrize("h, w, k, pads", [
    (12, 18, 3, [1, 1, 1, 1]),  # YOLO's stem
    (16, 16, 7, [3, 3, 3, 3]),  # ResNet's
    (10, 14, 3, [0, 0, 0, 0]),
    (8, 12, 2, [0, 0, 0, 0]),
    (14, 10, 5, [2, 1, 2, 1]),
    (6, 8, 3, [1, 1, 0, 0]),  # an odd output: the last row's window ends inside the map
    (8, 6, 1, [0, 0, 0, 0]),
])
def test_the_block_convolution_is_the_strided_one(tmp_path, h, w, k, pads):
    graph = _graph(tmp_path, _stem(h, w, k, pads))
    convs = [op for op in graph.ops if op.type == "Conv" and op.attrs.get("group", 1) == 1]
    assert [op.type for op in graph.ops].count("SpaceToDepth") == 1
    assert [int(s) for s in convs[0].attrs["strides"]] == [1, 1]
    image = np.random.default_rng(h + w + k).integers(0, 256, (1, h, w, 3), dtype=np.uint8)
    got = run_graph(graph, {"x": image})["y"]
    plain = _graph(tmp_path, _stem(h, w, k, pads), images=False)  # the float model, normalised by hand
    normalised = (image.transpose(0, 3, 1, 2).astype(np.float64) - np.reshape(MEAN, (1, 3, 1, 1))) \
        / np.reshape(STD, (1, 3, 1, 1))
    want = run_graph(plain, {"x": normalised.astype(np.float32)})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("model", [
    _stem(12, 18, 3, [1, 1, 1, 1], stride=1),  # no stride to absorb
    _stem(11, 18, 3, [1, 1, 1, 1]),  # an odd height: no whole blocks
    _stem(12, 18, 3, [1, 1, 1, 1], channels=4),  # not RGB
])
def test_other_convolutions_keep_their_input(tmp_path, model):
    graph = _graph(tmp_path, model)
    assert "SpaceToDepth" not in [op.type for op in graph.ops]


def test_a_float_input_keeps_its_convolution(tmp_path):
    graph = _graph(tmp_path, _stem(12, 18, 3, [1, 1, 1, 1]), images=False)
    assert "SpaceToDepth" not in [op.type for op in graph.ops]


@pytest.mark.parametrize("h, w", [(2, 2), (4, 6), (6, 34), (10, 640)])
@pytest.mark.parametrize("dtype", [np.int8, np.float16])
def test_pixels_go_into_the_block_map(h, w, dtype):
    rng = np.random.default_rng(h * w)
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    bits = np.uint8 if dtype == np.int8 else np.uint16
    tables = rng.integers(0, np.iinfo(bits).max + 1, (3, 256)).astype(bits)
    values = np.stack([tables[c][pixels[..., c]] for c in range(3)]).view(dtype)[None]  # [1, 3, H, W]
    blocks = shape_kernels.space_to_depth(values, blocksize=2)[0]  # the reference order, [12, H/2, W/2]
    c2 = 16 // np.dtype(dtype).itemsize  # 16-byte atoms
    lanes = np.zeros((16, h // 2, w // 2), dtype)
    lanes[:12] = blocks
    want = lanes.reshape(16 // c2, c2, h // 2, w // 2).transpose(0, 2, 3, 1).view(bits)  # [C1, H, W, C2] atoms
    got = np.full(want.shape, 0x55, bits)  # stale bytes, padding lanes included
    assert pixels_jit.is_rgb_blocks(got)
    pixels_jit.pixels_into_blocks(pixels, tables, got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("h, w", [(2, 2), (4, 6), (6, 34), (10, 640), (2, 18)])
def test_computed_fp16_blocks_over_map_sizes_are_the_float32_values_cast(h, w):
    """The affine codes of every block (one vector of 12 lanes a block) over map sizes:
    numpy's fp16 cast of float32(pixel) * scale + offset in SpaceToDepth's order, lanes
    12-15 zero (stale bytes overwritten)."""
    rng = np.random.default_rng(h + w)
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    s, o = np.float32([1 / 58.4, 1 / 57.1, 1 / 57.4]), np.float32([-2.1, -2.0, -1.8])
    values = (pixels.transpose(2, 0, 1).astype(np.float32) * s[:, None, None] + o[:, None, None]).astype(np.float16)
    blocks = shape_kernels.space_to_depth(values[None], blocksize=2)[0]  # [12, H/2, W/2]
    lanes = np.zeros((16, h // 2, w // 2), np.float16)
    lanes[:12] = blocks
    want = lanes.reshape(2, 8, h // 2, w // 2).transpose(0, 2, 3, 1).view(np.uint16)
    got = np.full(want.shape, 0x55, np.uint16)
    unused = np.zeros((3, 256), np.uint16)  # (the tables: not read by the computed codes)
    pixels_jit.pixels_into_blocks(pixels, unused, got, pixels_jit.affine_lanes(s, o))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scales, offsets", [
    ((1 / 255, 1 / 255, 1 / 255), (0, 0, 0)),  # ultralytics' pixel / 255
    (tuple(1 / s for s in STD), tuple(-m / s for m, s in zip(MEAN, STD))),  # ImageNet's
    ((2.0 ** -7, 300.0, -1.5), (-1.0, 7.0, 65000.0)),  # overflowing to inf, large and tiny steps
])
def test_computed_fp16_codes_are_the_cast_of_the_affine_values(scales, offsets):
    """The computed codes (affine) are numpy's fp16 cast of float32(p) * scale + offset
    for every pixel value; image_plan takes them where they equal the tables."""
    s, o = np.float32(scales), np.float32(offsets)
    pixels = np.empty((4, 256, 3), np.uint8)
    pixels[:2] = np.arange(256, dtype=np.uint8)[:, None]
    pixels[2:] = np.random.default_rng(5).integers(0, 256, (2, 256, 3), dtype=np.uint8)
    with np.errstate(over="ignore"):
        tables = np.stack([(np.arange(256, dtype=np.float32) * s[c] + o[c]).astype(np.float16).view(np.uint16)
                           for c in range(3)])
    looked, computed = (np.full((2, 2, 128, 8), 0x55, np.uint16) for _ in range(2))
    pixels_jit.pixels_into_blocks(pixels, tables, looked)
    pixels_jit.pixels_into_blocks(pixels, tables, computed, pixels_jit.affine_lanes(s, o))
    np.testing.assert_array_equal(computed, looked)
    values = np.arange(256, dtype=np.float32)[None] * s[:, None] + o[:, None]
    assert image_edges._affine_codes(tables, values) is not None
    tables[1, 7] ^= 1  # a table no affine form gives: looked up
    assert image_edges._affine_codes(tables, values) is None
