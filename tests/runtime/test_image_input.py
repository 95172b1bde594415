"""A model input taken as a uint8 NHWC image (rkc compile --image-input): the
graph starts with the normalisation, and the runtime reads the pixels once into
the first NPU map through per-channel tables of the reference kernels' results
(runtime/image_edges.py image_plan, runtime/kernels/pixels_jit.py). The result
is the interpreter's step by step, bit for bit, and onnxruntime's on the float
model fed the normalised image within the precision's bound."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.compiler.frontend.onnx import parse_image_inputs
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import geometry, layout
from rkc.runtime import image_edges
from rkc.runtime.kernels import pixels_jit
from onnx_models import cosine, onnxruntime_outputs, save

MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


def _small_cnn(h: int, w: int, k: int = 3):
    """A stride-2 k x k stem (YOLO's 3, ResNet's 7), then a 3x3 convolution."""
    rng = np.random.default_rng(h * w)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[k // 2] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w0": rng.standard_normal((16, 3, k, k)) / (k + 1), "b0": rng.standard_normal(16) * 0.1,
             "w1": rng.standard_normal((8, 16, 3, 3)) / 12}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("k", [3, 7])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_an_image_input_is_the_interpreters_and_onnxruntimes(tmp_path, precision, k, monkeypatch):
    """The stride-2 stem reads the image's 2x2 blocks (compiler/passes/image_blocks.py):
    the SpaceToDepth runs inside the image pass, and through its own kernel on the
    interpreter's path."""
    h, w = 12, 18
    path = save(_small_cnn(h, w, k), tmp_path / "m.onnx")
    rng = np.random.default_rng(7)
    options = BuildOptions(precision=precision, image_inputs={"x": (MEAN, STD)})
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        np.savez(options.calib, x=rng.integers(0, 256, (4, 1, h, w, 3), dtype=np.uint8))
    build(path, tmp_path / "m.rkbin", options)
    image = rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8)
    ran = []
    real = image_edges.run_image

    def counted(run, steps, plan):
        ran.append(real(run, steps, plan))
        return ran[-1]
    monkeypatch.setattr(image_edges, "run_image", counted)
    with runtime.load(tmp_path / "m.rkbin") as model:
        info = model.tensors["x"]
        assert (info.shape, info.dtype) == ([1, h, w, 3], "uint8")
        assert "SpaceToDepth" in [s.op for s in model.module.programs[0].steps if s.kind == "cpu"]
        fast = model.run({"x": image})["y"]
        again = model.run({"x": image})["y"]
    assert ran == [True, True]
    monkeypatch.setattr(image_edges, "run_image", lambda run, steps, plan: False)
    with runtime.load(tmp_path / "m.rkbin") as model:
        slow = model.run({"x": image})["y"]
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(again, slow)
    normalised = ((image.transpose(0, 3, 1, 2).astype(np.float32) - np.float32(MEAN).reshape(1, 3, 1, 1))
                  / np.float32(STD).reshape(1, 3, 1, 1))
    want = onnxruntime_outputs(path, {"x": normalised})["y"]
    assert cosine(fast, want) >= (0.999 if precision == "fp16" else 0.99)


@pytest.mark.parametrize("shape", [(5, 7, 3), (3, 33, 1), (4, 6, 4), (1, 1, 2)])
@pytest.mark.parametrize("dtype", [np.int8, np.float16])
def test_pixels_go_through_their_channels_table_into_the_atoms(shape, dtype):
    h, w, c = shape
    rng = np.random.default_rng(h * w + c)
    pixels = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
    bits = np.uint8 if dtype == np.int8 else np.uint16
    tables = rng.integers(0, np.iinfo(bits).max + 1, (c, 256)).astype(bits)
    want_values = np.stack([tables[b][pixels[..., b]] for b in range(c)]).view(dtype)  # [C, H, W]
    raw = geometry.pack(want_values[None], "native").reshape(-1).view(np.uint8).copy()
    want = layout.feature_view(raw, c, h, w, dtype).view(bits)
    got = np.full(want.shape, 0x55, bits)  # stale bytes, padding lanes included
    assert pixels_jit.is_image(c, got)
    pixels_jit.pixels_into_feature(pixels, tables, got)
    np.testing.assert_array_equal(got, want)


def test_bad_image_input_specs_are_one_clear_error(tmp_path):
    for spec in ("x", "x=1,2,3", "x=1,2/3", "x=1,2,3/0,1,1", "=1/2"):
        with pytest.raises(UnsupportedError, match="--image-input"):
            parse_image_inputs([spec])
    assert parse_image_inputs(["x=0,0,0/255,255,255"]) == {"x": ((0.0,) * 3, (255.0,) * 3)}
    path = save(_small_cnn(8, 8), tmp_path / "m.onnx")
    for images, words in (({"y": ((0,) * 3, (1,) * 3)}, "the model's inputs are x"),
                          ({"x": ((0,) * 4, (1,) * 4)}, "C = 4")):
        with pytest.raises(UnsupportedError, match=words):
            build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16", image_inputs=images))
