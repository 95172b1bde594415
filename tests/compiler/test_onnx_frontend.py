"""ONNX -> IR: shapes, constant folding, --input-shape, old opsets, errors."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc.compiler.frontend import load_graph
from rkc.compiler.frontend.onnx import parse_input_shapes
from rkc.ir.errors import UnsupportedError
from rkc.ir.text import parse_graph, print_graph
from onnx_models import example, save

BIN = Path(sys.executable).parent


def test_rkc_ir_is_a_fixed_point(tmp_path):
    path = save(example("small_cnn").build_model(), tmp_path / "cnn.onnx")
    first = subprocess.run([str(BIN / "rkc"), "ir", str(path)], capture_output=True, text=True, check=True).stdout
    (tmp_path / "a.txt").write_text(first)
    second = subprocess.run([str(BIN / "rkc"), "ir", str(tmp_path / "a.txt")], capture_output=True, text=True,
                            check=True).stdout
    assert first == second
    assert "Conv(" in first and "fp32[1,16,32,32]" in first


def _shape_subgraph_model(dynamic: bool) -> onnx.ModelProto:
    """y = Reshape(x, Concat(Shape(x)[0:1], [-1])): foldable once x's shape is known."""
    dims = ["N", 4, 5] if dynamic else [2, 4, 5]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["s0"]),
        helper.make_node("Concat", ["s0", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("one", 1), ("minus1", -1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_shape_subgraphs_fold_to_constants(tmp_path):
    g = load_graph(save(_shape_subgraph_model(False), tmp_path / "m.onnx"))
    assert [op.type for op in g.ops] == ["Reshape"]
    assert g.tensors["y"].type.shape == (2, 20)


def test_input_shape_fixes_dynamic_dims(tmp_path):
    path = save(_shape_subgraph_model(True), tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError, match="--input-shape"):
        load_graph(path)  # the Reshape target depends on the dynamic N
    g = load_graph(path, input_shapes={"x": (3, 4, 5)})
    assert g.tensors["y"].type.shape == (3, 20) and [op.type for op in g.ops] == ["Reshape"]
    with pytest.raises(UnsupportedError, match="inputs are x"):
        load_graph(path, input_shapes={"nope": (1,)})
    with pytest.raises(UnsupportedError, match="rank 3"):
        load_graph(path, input_shapes={"x": (3, 20)})


def test_parse_input_shapes():
    assert parse_input_shapes(["x=1x3x224x224", "a.b:0=7"]) == {"x": (1, 3, 224, 224), "a.b:0": (7,)}
    for bad in ("x", "x=", "x=1xx2", "=1x2", "x=0x3"):
        with pytest.raises(UnsupportedError):
            parse_input_shapes([bad])


def test_old_opset_attributes_become_constant_inputs(tmp_path):
    node = helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 3])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g = load_graph(save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)]), tmp_path / "m.onnx"))
    (op,) = g.ops
    assert len(op.inputs) == 2 and list(g.payload(op.inputs[1])) == [0, 3]
    assert g.tensors["y"].type.shape == (1, 2, 3, 1)


def test_unknown_op_is_one_line_error(tmp_path):
    node = helper.make_node("NonMaxSuppression", ["b", "s"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 4]),
                                            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "nms.onnx")
    r = subprocess.run([str(BIN / "rkc"), "compile", str(path)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "NonMaxSuppression" in r.stderr and "not supported" in r.stderr
    assert not (tmp_path / "nms.rkbin").exists()


def test_truncated_model_is_one_line_error(tmp_path):
    data = example("small_cnn").build_model().SerializeToString()
    (tmp_path / "t.onnx").write_bytes(data[: len(data) // 2])
    r = subprocess.run([str(BIN / "rkc"), "compile", str(tmp_path / "t.onnx")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_ir_text_round_trip_of_real_structure(tmp_path):
    g = load_graph(save(example("mlp").build_model(), tmp_path / "mlp.onnx"))
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text
