"""A classifier head (pool -> Flatten/Reshape -> MatMul/Gemm) stays in one NPU
segment: the product runs as a 1x1 convolution on the pooled map and the
flatten moves after it (compiler/passes/flat_head.py). Checked on the
simulator against onnxruntime, fp16 and calibrated int8."""

from __future__ import annotations

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.compiler.frontend import load_graph
from rkc.compiler.fakequant import run_fake_quant
from rkc.compiler.passes import run_passes
from rkc.compiler.placement import place_ops
from rkc.compiler.quantize import quantize
from rkc.compiler.reference import run_graph
from onnx_models import build_and_run, cosine, onnxruntime_outputs, save

SHAPE = (1, 16, 5, 6)
HEADS = {
    "flatten_gemm": lambda: [helper.make_node("Flatten", ["p"], ["f"]),
                             helper.make_node("Gemm", ["f", "w_t", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)],
    "reshape_matmul": lambda: [helper.make_node("Reshape", ["p", "shape"], ["f"]),
                               helper.make_node("MatMul", ["f", "w"], ["y"])],
    # Paddle's fc (PP-OCR cls): the bias a separate Add after the product, into the convolution's bias
    "matmul_then_bias": lambda: [helper.make_node("Flatten", ["p"], ["f"]),
                                 helper.make_node("MatMul", ["f", "w"], ["m"]),
                                 helper.make_node("Add", ["m", "b"], ["y"])],
}


def _model(head: str) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 10)).astype(np.float32) * 0.3
    inits = {"cw": rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2, "w": w, "w_t": w.T.copy(),
             "b": rng.standard_normal(10).astype(np.float32), "shape": np.array([1, 16], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), *HEADS[head]()]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("head", sorted(HEADS))
def test_rewrite_keeps_the_values(tmp_path, head):
    g = load_graph(save(_model(head), tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    assert [op.type for op in g.ops][-2:] == ["Conv", "Flatten"]
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_head_runs_in_the_segment_of_its_pool(tmp_path, head, precision):
    path = save(_model(head), tmp_path / "m.onnx")
    options = BuildOptions(precision=precision)
    rng = np.random.default_rng(7)
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        np.savez(options.calib, x=rng.standard_normal((4, *SHAPE)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", options)
    assert report.segments == 1
    assert [p.op.type for p in report.placements if p.device == "cpu"] == ["Flatten"]
    x = rng.standard_normal(SHAPE).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin") as m:
        got = m.run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})["y"]
    assert got.shape == want.shape
    assert cosine(got, want) >= (0.9995 if precision == "fp16" else 0.995)


def test_a_flatten_with_other_readers_is_left_alone(tmp_path):
    model = _model("flatten_gemm")
    model.graph.output.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, None))
    g = load_graph(save(model, tmp_path / "m.onnx"))
    run_passes(g)
    assert "Gemm" in [op.type for op in g.ops]


def _map_head(c: int, h: int, w: int) -> onnx.ModelProto:
    """conv 3x3 -> Relu -> Flatten of the whole [1, c, h, w] map -> Gemm -> Relu -> MatMul (AlexNet's, VGG's head):
    after the passes every product is a convolution, the ReLU in its epilogue, and one Flatten is left at the end."""
    rng = np.random.default_rng(c * h + w)
    k = c * h * w
    inits = {"cw": (rng.standard_normal((c, 8, 3, 3)) / 8).astype(np.float32),
             "w1": (rng.standard_normal((256, k)) / np.sqrt(k)).astype(np.float32),
             "b1": rng.standard_normal(256).astype(np.float32) * 0.1,
             "w2": (rng.standard_normal((256, 10)) / 16).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "w1", "b1"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "map_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, h, w))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


MAP_HEADS = [(16, 6, 6), (32, 4, 5), (24, 7, 4), (96, 12, 12)]  # the last in two channel slices


@pytest.mark.parametrize("c,h,w", MAP_HEADS)
def test_a_whole_map_flattened_becomes_a_window_conv(tmp_path, c, h, w):
    g = load_graph(save(_map_head(c, h, w), tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((1, 8, h, w)).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    window = ["Conv"] if c * h * w <= 9216 else ["Split", "Conv", "Conv", "Add"]
    assert [op.type for op in g.ops] == ["Conv", "Relu", *window, "Relu", "Conv", "Flatten"]
    assert all(op.attrs["kernel_shape"] == [h, w] for op in g.ops[2:2 + len(window)] if op.type == "Conv")
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c,h,w", MAP_HEADS)
def test_a_whole_map_head_runs_on_the_npu(tmp_path, c, h, w, precision):
    report, got, want = build_and_run(tmp_path, _map_head(c, h, w), (1, 8, h, w), precision)
    assert [p.op.type for p in report.placements if p.device == "cpu"] == ["Flatten"]
    assert got.shape == want.shape
    assert cosine(got, want) >= (0.9995 if precision == "fp16" else 0.995)


def _one_pixel(c, h, w, stride) -> onnx.ModelProto:
    rng = np.random.default_rng(c + h * w)
    inits = {"w": (rng.standard_normal((24, c, h, w - stride + 1)) / np.sqrt(c * h * w)).astype(np.float32),
             "b": rng.standard_normal(24).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[1, stride]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "one_pixel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, c, h, w))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


ONE_PIXEL = [(16, 6, 6, 1), (16, 4, 4, 1), (32, 5, 7, 1), (16, 6, 7, 2)]


@pytest.mark.parametrize("c,h,w,stride", ONE_PIXEL)
def test_a_conv_to_one_pixel_writes_a_gemm_row(tmp_path, c, h, w, stride):
    """A convolution whose window is the whole map (1x1 result, stored as a GEMM row of 4 rows)
    matches onnxruntime (it used to write a native one-row map its readers took for a GEMM row)."""
    report, got, want = build_and_run(tmp_path, _one_pixel(c, h, w, stride), (1, c, h, w), "fp16")
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    assert got.shape == want.shape == (1, 24, 1, 1)
    assert cosine(got, want) >= 0.9995


@pytest.mark.parametrize("c,h,w,stride", ONE_PIXEL)
def test_an_int8_conv_to_one_pixel_matches_its_integer_model(tmp_path, c, h, w, stride):
    """int8: to a step of the fake-quantized graph (compiler/fakequant.py): the per-tensor output
    step of 24 values is what separates it from onnxruntime, not the lowering."""
    report, got, _ = build_and_run(tmp_path, _one_pixel(c, h, w, stride), (1, c, h, w), "int8")
    assert [(p.op.type, p.dtype) for p in report.placements if p.device == "cpu"] == []
    g = quantize(run_passes(load_graph(tmp_path / "m.onnx")), "int8", tmp_path / "calib.npz")
    _, groups = place_ops(g, "int8")
    x = np.random.default_rng(7)
    x.standard_normal((4, 1, c, h, w))  # build_and_run's calibration draw, then its input
    want = run_fake_quant(g, groups, {"x": x.standard_normal((1, c, h, w)).astype(np.float32)})["y"]
    assert np.abs(got - want).max() <= 1.01 * g.tensors["y"].type.quant.scale
