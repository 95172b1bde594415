"""Hostile ONNX models: attributes no convolution can have, shapes and folded
constants too large to allocate, data shorter than its shape. Each is one
RkcError at compile time, naming what is wrong, before anything of the bad
size is allocated."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc.compiler.build import BuildOptions, build
from rkc.ir.errors import RkcError

BIN = Path(sys.executable).parent


def conv_model(x_shape=(1, 8, 8, 8), w_shape=(8, 8, 3, 3), opset=17, initializers=None, **attrs):
    w = numpy_helper.from_array(np.ones(w_shape, np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializers if initializers is not None else [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def pool_model(**attrs):
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def folding_model(op):
    shape = numpy_helper.from_array(np.array([1 << 16, 1 << 16], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"])] if op == "ConstantOfShape" else [
        helper.make_node("Expand", ["one", "s"], ["c"])]
    inits = [shape, numpy_helper.from_array(np.ones((1, 1), np.float32), "one")]
    nodes.append(helper.make_node("Add", ["x", "c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def short_raw_data():
    w = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    w.raw_data = w.raw_data[:100]
    return conv_model(initializers=[w])


def duplicate_initializers():
    w = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    return conv_model(initializers=[w, w])


CASES = {
    "group 3 on 8 channels": (lambda: conv_model(group=3), "group 3 does not divide the 8 input channels"),
    "weight Cin mismatch": (lambda: conv_model(w_shape=(8, 4, 3, 3)),
                            "the weight takes 4 channels per group, but the input has 8"),
    "dilations [0,0]": (lambda: conv_model(dilations=[0, 0]), r"dilations \[0, 0\] outside 1\.\.65536"),
    "pads 2^30": (lambda: conv_model(pads=[1 << 30] * 4), r"pads .* outside 0\.\.65536|more than the 2 GiB"),
    "strides 2^40": (lambda: conv_model(strides=[1 << 40] * 2), r"strides .* outside 1\.\.65536"),
    "strides [0,0]": (lambda: conv_model(strides=[0, 0]), r"strides|stride"),
    "MaxPool kernel [0,0]": (lambda: pool_model(kernel_shape=[0, 0]), r"kernel_shape \[0, 0\] outside|kernel"),
    "opset 99": (lambda: conv_model(opset=99), "ONNX opset 99 is newer than any this onnx knows"),
    "duplicate initializer": (duplicate_initializers, "initializer 'w' is defined twice"),
    "raw_data shorter than shape": (short_raw_data, "initializer 'w' has 100 bytes of data, but shape"),
    "Conv input [1,8,2^40,16]": (lambda: conv_model(x_shape=(1, 8, 1 << 40, 16)),
                                 r"tensor 'x': shape \[1, 8, 1099511627776, 16\] is \d+ bytes, more than the 2 GiB"),
    "ConstantOfShape 2^32": (lambda: folding_model("ConstantOfShape"), r"more than the 2 GiB a tensor may take"),
    "Expand 2^32": (lambda: folding_model("Expand"), r"more than the 2 GiB a tensor may take"),
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_onnx_is_one_clear_error(tmp_path, case):
    make, message = CASES[case]
    onnx.save(make(), str(tmp_path / "m.onnx"))
    with pytest.raises(RkcError, match=message) as info:
        build(tmp_path / "m.onnx", tmp_path / "m.rkbin", BuildOptions())
    assert "\n" not in str(info.value)
    assert not (tmp_path / "m.rkbin").exists()
    print(f"{case}: {info.value}")


def test_external_data_shorter_than_the_tensor(tmp_path):
    w = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    model = conv_model(initializers=[w])
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    data = (tmp_path / "w.bin").read_bytes()
    (tmp_path / "w.bin").write_bytes(data[:len(data) // 2])
    r = subprocess.run([str(BIN / "rkc"), "compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.rkbin")],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "m.rkbin").exists()


def test_gather_index_out_of_range_at_run_time(tmp_path):
    from rkc import runtime

    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
                                            helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    build(tmp_path / "m.onnx", tmp_path / "m.rkbin", BuildOptions())
    x = np.zeros((4, 3), np.float32)
    with runtime.load(tmp_path / "m.rkbin", device="sim") as model:
        assert model.run({"x": x, "i": np.array([0, 3])})["y"].shape == (2, 3)
        with pytest.raises(RkcError, match="Gather: index 4 is out of range for axis 0 of size 4"):
            model.run({"x": x, "i": np.array([0, 4])})
        with pytest.raises(RkcError, match="Gather: index -5 is out of range"):
            model.run({"x": x, "i": np.array([-5, 0])})
