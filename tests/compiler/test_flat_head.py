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
from rkc.compiler.passes import run_passes
from rkc.compiler.reference import run_graph
from onnx_models import cosine, onnxruntime_outputs, save

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
