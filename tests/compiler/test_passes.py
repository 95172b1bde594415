"""Rewrites keep the numbers: BatchNorm folding, Erf-GELU and LayerNorm fusion."""

import numpy as np

from rkc.compiler.frontend import load_graph
from rkc.compiler.passes import run_passes
from rkc.compiler.reference import run_graph
from onnx_models import example, save


def _before_after(tmp_path, module: str, shape):
    g = load_graph(save(example(module).build_model(), tmp_path / "m.onnx"))
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    before = run_graph(g, {"x": x})
    types_before = [op.type for op in g.ops]
    run_passes(g)
    after = run_graph(g, {"x": x})
    return types_before, [op.type for op in g.ops], before, after


def test_batchnorm_folds_into_conv(tmp_path):
    before_types, after_types, before, after = _before_after(tmp_path, "small_cnn", (1, 3, 32, 32))
    assert "BatchNormalization" in before_types and "BatchNormalization" not in after_types
    np.testing.assert_allclose(after["probs"], before["probs"], rtol=1e-5, atol=1e-6)


def test_gelu_and_layernorm_patterns_fuse(tmp_path):
    before_types, after_types, before, after = _before_after(tmp_path, "mlp", (4, 64))
    assert "Erf" in before_types and "Erf" not in after_types and after_types.count("Gelu") == 2
    assert "LayerNormalization" in after_types and "ReduceMean" not in after_types
    (name,) = before
    np.testing.assert_allclose(after[name], before[name], rtol=1e-4, atol=1e-5)


def test_hard_swish_pattern_fuses(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    consts = {"three": 3.0, "zero": 0.0, "six": 6.0, "sixth": 6.0}
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "sixth"], ["y"])]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    g = load_graph(save(model, tmp_path / "hs.onnx"))
    x = np.linspace(-5, 5, 36, dtype=np.float32).reshape(1, 4, 3, 3)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    assert [op.type for op in g.ops] == ["HardSwish"]
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-6, atol=1e-6)


def test_per_channel_mul_folds_into_conv(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal((4, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(nodes, "cm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    g = load_graph(save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx"))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    assert [op.type for op in g.ops] == ["Conv", "Add"]
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)


def test_bias_add_batchnorm_and_scale_fold_into_conv_transpose(tmp_path):
    """PP-OCR det's learned upsampling as exported: ConvTranspose, its bias as an Add,
    a BatchNormalization, a per-channel Mul; all become the ConvTranspose's weights
    and bias (the Relu after them fuses into its epilogue)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    c, o = 3, 5
    arrays = {"w": rng.standard_normal((c, o, 2, 2)), "b": rng.standard_normal((1, o, 1, 1)),
              "g": rng.uniform(0.5, 2, o), "beta": rng.standard_normal(o), "mean": rng.standard_normal(o),
              "var": rng.uniform(0.5, 2, o), "s": rng.standard_normal((o, 1, 1))}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Add", ["t", "b"], ["a"]),
             helper.make_node("BatchNormalization", ["a", "g", "beta", "mean", "var"], ["n"]),
             helper.make_node("Mul", ["n", "s"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    g = load_graph(save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx"))
    x = rng.standard_normal((1, c, 6, 7)).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    assert [op.type for op in g.ops] == ["ConvTranspose", "Relu"]
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)


def test_a_relu_of_a_concat_moves_onto_the_pieces_that_can_be_negative(tmp_path):
    """Relu(Concat(Conv, AveragePool(Relu))) -> Concat(Relu(Conv), AveragePool): the
    pool of a Relu's output is >= 0 already; the numbers do not change."""
    from onnx_models import graph_model, shufflenet_unit

    nodes, inits = shufflenet_unit(8, 4)
    g = load_graph(save(graph_model(nodes, inits, [1, 3, 10, 10]), tmp_path / "m.onnx"))
    x = np.random.default_rng(5).standard_normal((1, 3, 10, 10)).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    concat = next(op for op in g.ops if op.type == "Concat")
    assert concat.outputs == ["y"] and [op.type for op in g.ops].count("Relu") == 2
    relu = next(op for op in g.ops if op.type == "Relu" and op.outputs[0] == concat.inputs[0])
    assert relu.inputs == ["c1"] and concat.inputs[1] == "p"
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-6, atol=1e-6)
    # a piece that can be negative (the pool of a map no Relu bounds) gets its own Relu
    nodes[2].input[0] = "c0"
    g = load_graph(save(graph_model(nodes, inits, [1, 3, 10, 10]), tmp_path / "n.onnx"))
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    assert [op.type for op in g.ops].count("Relu") == 3
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-6, atol=1e-6)
