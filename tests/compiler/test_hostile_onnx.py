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


def one_op(op, x_shape, consts=(), outputs=1, opset=17, **attrs):
    """x -> op(x, *consts) -> y0..: consts are (name, array) initializers, the op's extra inputs in order."""
    node = helper.make_node(op, ["x", *(n for n, _ in consts)], [f"y{i}" for i in range(outputs)], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
                               for i in range(outputs)],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def concat_model():
    node = helper.make_node("Concat", ["x", "c"], ["y"], axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((4, 3), np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def batchnorm_model(after_conv: bool, var: np.ndarray):
    """x [1, 4, 6, 6] -> (Conv ->) BatchNormalization with the given variance; random weights, fixed seed."""
    rng = np.random.default_rng(5)
    params = [("g", rng.uniform(0.5, 1.5, 4)), ("b", rng.standard_normal(4)), ("m", rng.standard_normal(4)), ("v", var)]
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in params]
    nodes = [helper.make_node("BatchNormalization", ["c" if after_conv else "x", "g", "b", "m", "v"], ["y"])]
    if after_conv:
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w"))
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


I64 = np.int64
# constant indices and sizes checked against their axis (by the rule, every op that takes them)
AXIS_CASES = {
    "Gather index 4 of 4": (lambda: one_op("Gather", (4, 3), [("i", np.array([0, 4], I64))]),
                            "index 4 is out of range for axis 0 of size 4"),
    "Gather index -5 of 4": (lambda: one_op("Gather", (4, 3), [("i", np.array([[-5]], I64))]),
                             "index -5 is out of range for axis 0 of size 4"),
    "Gather axis 1 index 3 of 3": (lambda: one_op("Gather", (4, 3), [("i", np.array(3, I64))], axis=1),
                                   "index 3 is out of range for axis 1 of size 3"),
    "Split sizes sum 5 of 6": (lambda: one_op("Split", (6, 2), [("s", np.array([2, 3], I64))], outputs=2),
                               r"split sizes \[2, 3\] sum to 5, but axis 0 has size 6"),
    "Split sizes sum 9 of 6": (lambda: one_op("Split", (2, 6), [("s", np.array([4, 5], I64))], outputs=2, axis=-1),
                               r"sum to 9, but axis 1 has size 6"),
    "Split negative size": (lambda: one_op("Split", (6, 2), [("s", np.array([8, -2], I64))], outputs=2),
                            "include a negative size"),
    "Split 3 sizes, 2 outputs": (lambda: one_op("Split", (6, 2), [("s", np.array([2, 2, 2], I64))], outputs=2),
                                 "3 split sizes for 2 outputs"),
    "Split 2 into 4": (lambda: one_op("Split", (2, 2), outputs=4, opset=18, num_outputs=4),
                       "axis 0 of size 2 cannot be split into 4 parts"),
    "Split num_outputs 3, 2 outputs": (lambda: one_op("Split", (6, 2), outputs=2, opset=18, num_outputs=3),
                                       "num_outputs 3, but the op has 2 outputs"),
    "Slice 2 starts, 1 end": (lambda: one_op("Slice", (4, 4), [("s", np.array([0, 0], I64)),
                                                               ("e", np.array([2], I64))]),
                              "starts, ends, axes and steps have 2, 1, 2 and 2 entries"),
    "Slice axis twice": (lambda: one_op("Slice", (4, 4), [("s", np.array([0, 1], I64)), ("e", np.array([2, 3], I64)),
                                                          ("a", np.array([1, -1], I64))]),
                         r"axes \[1, -1\] name an axis twice"),
    "Pad crops below 0": (lambda: one_op("Pad", (4, 4), [("p", np.array([0, -3, 0, -3], I64))]),
                          "crop axis 1 of size 4 to -2"),
    "Pad 3 pads for 2 axes": (lambda: one_op("Pad", (4, 4), [("p", np.array([1, 1, 1], I64))]),
                              "3 pads for 2 axes"),
    "Tile negative": (lambda: one_op("Tile", (4, 4), [("r", np.array([2, -1], I64))]),
                      r"repeats \[2, -1\] must be 2 counts >= 0"),
    "Squeeze axis of 4": (lambda: one_op("Squeeze", (1, 4), [("a", np.array([1], I64))]),
                          "cannot squeeze axis 1 of size 4"),
    "Concat rows 2 and 4": (concat_model, r"cannot concatenate \[2, 3\] and \[4, 3\] along axis 1"),
    "DepthToSpace blocksize 0": (lambda: one_op("DepthToSpace", (1, 8, 2, 2), blocksize=0),
                                 "blocksize 0 must be >= 1"),
    "SpaceToDepth 3 on 4x4": (lambda: one_op("SpaceToDepth", (1, 2, 4, 4), blocksize=3),
                              "blocksize 3 does not fit height 4"),
}

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
    "BatchNormalization after a Conv, negative variance": (
        lambda: batchnorm_model(True, np.array([1.0, -0.5, 1.0, 1.0])),
        r"sqrt\(variance \+ epsilon\) is undefined in 1 of 4 channels \(first: channel 1\)"),
    "BatchNormalization alone, NaN variance": (
        lambda: batchnorm_model(False, np.array([1.0, 1.0, 1.0, np.nan])),
        r"sqrt\(variance \+ epsilon\) is undefined in 1 of 4 channels \(first: channel 3\)"),
    **AXIS_CASES,
}


@pytest.mark.parametrize("op,x_shape,consts,outputs,attrs", [
    ("Gather", (4, 3), [("i", np.array([-4, 3, 0], I64))], 1, {}),
    ("Gather", (4, 3), [("i", np.array([[2, -3]], I64))], 1, {"axis": 1}),
    ("Split", (6, 2), [("s", np.array([2, 4], I64))], 2, {}),
    ("Split", (2, 6), [("s", np.array([0, 6, 0], I64))], 3, {"axis": 1}),
    ("Slice", (4, 4), [("s", np.array([1, -9], I64)), ("e", np.array([99, 2], I64))], 1, {}),
    ("Pad", (4, 4), [("p", np.array([0, -2, 1, -1], I64))], 1, {}),
    ("Squeeze", (1, 4, 1), [("a", np.array([0, -1], I64))], 1, {}),
])
def test_indices_and_sizes_inside_their_axis_compile_and_match_onnxruntime(tmp_path, op, x_shape, consts, outputs,
                                                                         attrs):
    """The checks refuse only what is out of range: the edges of each range compile and agree with onnxruntime."""
    import onnxruntime as ort

    from rkc import runtime

    model = one_op(op, x_shape, consts, outputs, **attrs)
    onnx.save(model, str(tmp_path / "m.onnx"))
    build(tmp_path / "m.onnx", tmp_path / "m.rkbin", BuildOptions())
    x = np.random.default_rng(3).standard_normal(x_shape).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})
    with runtime.load(tmp_path / "m.rkbin", device="sim") as m:
        got = m.run({"x": x})
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[f"y{i}"], w)


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
