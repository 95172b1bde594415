"""Grouped convolutions as block-diagonal ordinary ones, and channel shuffles folded
into the convolution before them (compiler/passes/groups.py): the rewrite keeps the
values (the IR reference before and after), and the result runs on the NPU and
matches onnxruntime on the simulator, fp16 and calibrated int8, over a sweep of
groups, channels, kernels and strides with random weights."""

from __future__ import annotations

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkc.compiler.frontend import load_graph
from rkc.compiler.passes import run_passes
from rkc.compiler.reference import run_graph
from onnx_models import build_and_run, cosine, save

BOUND = {"fp16": 0.9995, "int8": 0.995}
# (input channels, output channels, group, kernel, stride, H, W)
GROUPED = [(32, 64, 2, 3, 1, 9, 10), (12, 24, 3, 1, 1, 8, 8), (68, 68, 4, 1, 1, 7, 6), (48, 40, 4, 5, 2, 11, 9),
           (24, 16, 8, 3, 2, 6, 7)]


def _model(nodes, inits, shape, rank=4) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "groups", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _grouped(cin, cout, group, k, stride, h, w):
    rng = np.random.default_rng(cin * 7 + group)
    inits = {"w": (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32),
             "b": rng.standard_normal(cout).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group, kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, inits, (1, cin, h, w)), (1, cin, h, w)


def _shuffle(channels, groups, h, w, between="Relu"):
    """conv 1x1 -> [Relu] -> channel shuffle (Reshape, Transpose, Reshape) -> depthwise 3x3."""
    rng = np.random.default_rng(channels + groups)
    inits = {"w": (rng.standard_normal((channels, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32),
             "b": rng.standard_normal(channels).astype(np.float32) * 0.1,
             "dw": rng.standard_normal((channels, 1, 3, 3)).astype(np.float32) * 0.3,
             "s5": np.array([1, groups, channels // groups, h, w], np.int64),
             "s4": np.array([1, channels, h, w], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"])]
    src = "c"
    if between:
        nodes.append(helper.make_node(between, ["c"], ["a"]))
        src = "a"
    nodes += [helper.make_node("Reshape", [src, "s5"], ["r5"]),
              helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", ["t5", "s4"], ["sh"]),
              helper.make_node("Conv", ["sh", "dw"], ["y"], group=channels, pads=[1, 1, 1, 1])]
    return _model(nodes, inits, (1, channels, h, w)), (1, channels, h, w)


def _rewritten(tmp_path, model, shape):
    g = load_graph(save(model, tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)
    return g


@pytest.mark.parametrize("case", GROUPED, ids=lambda c: "x".join(map(str, c)))
def test_grouped_conv_becomes_one_ordinary_conv(tmp_path, case):
    g = _rewritten(tmp_path, *_grouped(*case))
    conv = next(op for op in g.ops if op.type == "Conv")
    assert int(conv.attrs.get("group", 1)) == 1


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("case", GROUPED, ids=lambda c: "x".join(map(str, c)))
def test_grouped_conv_runs_on_the_npu(tmp_path, case, precision):
    model, shape = _grouped(*case)
    report, got, want = build_and_run(tmp_path, model, shape, precision)
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    assert got.shape == want.shape
    assert cosine(got, want) >= BOUND[precision]


def test_more_groups_than_the_limit_stay_grouped(tmp_path):
    g = _rewritten(tmp_path, *_grouped(32, 32, 16, 3, 1, 5, 5))
    assert int(next(op for op in g.ops if op.type == "Conv").attrs["group"]) == 16


@pytest.mark.parametrize("channels,groups,between", [(48, 3, "Relu"), (64, 4, None), (68, 4, "Relu"),
                                                     (32, 8, "Clip")])
def test_channel_shuffle_folds_into_the_conv(tmp_path, channels, groups, between):
    g = _rewritten(tmp_path, *_shuffle(channels, groups, 5, 6, between))
    assert [op.type for op in g.ops] == ["Conv", *([between] if between else []), "Conv"]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("channels,groups", [(48, 3), (68, 4)])
def test_shuffled_block_runs_on_the_npu(tmp_path, channels, groups, precision):
    model, shape = _shuffle(channels, groups, 6, 7)
    report, got, want = build_and_run(tmp_path, model, shape, precision)
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    assert cosine(got, want) >= BOUND[precision]


def test_a_move_of_pixels_is_not_a_shuffle(tmp_path):
    """Reshape/Transpose/Reshape that swaps H and W (same shape for a square map): left alone."""
    model, shape = _shuffle(16, 4, 6, 6)
    transpose = next(n for n in model.graph.node if n.op_type == "Transpose")
    del transpose.attribute[:]
    transpose.attribute.append(helper.make_attribute("perm", [0, 1, 2, 4, 3]))
    g = _rewritten(tmp_path, model, shape)
    assert "Transpose" in [op.type for op in g.ops]
