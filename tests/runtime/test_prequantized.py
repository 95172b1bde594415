"""Pre-quantized models (onnxruntime.quantization.quantize_static, QDQ and
QOperator formats; int8/uint8 activations, per-tensor/per-channel weights) lower
their convolutions and matrix products onto the NPU in int8 with the model's
own scales, and match onnxruntime running the same quantized model."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from onnx_models import cosine, onnxruntime_outputs, save

quantization = pytest.importorskip("onnxruntime.quantization")


def float_model(rng, with_add: bool):
    """Conv3x3 -> Relu -> Conv1x1 [-> + Conv1x1 residual] -> Flatten -> MatMul [+ bias]."""
    c, o, hw, n = 8, 16, 6, 10
    inits = {"w1": rng.standard_normal((o, c, 3, 3)) * 0.3, "b1": rng.standard_normal(o) * 0.1,
             "w2": rng.standard_normal((o, o, 1, 1)) * 0.3, "b2": rng.standard_normal(o) * 0.1,
             "w3": rng.standard_normal((o, o, 1, 1)) * 0.3,
             "m": rng.standard_normal((o * hw * hw, n)) * 0.05, "mb": rng.standard_normal(n) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["h2"])]
    last = "h2"
    if with_add:
        nodes += [helper.make_node("Conv", ["h2", "w3"], ["h3"]), helper.make_node("Add", ["h3", "h2"], ["s"])]
        last = "s"
    else:
        del inits["w3"]
    nodes.append(helper.make_node("Flatten", [last], ["f"]))
    if with_add:
        nodes += [helper.make_node("MatMul", ["f", "m"], ["mm"]), helper.make_node("Add", ["mm", "mb"], ["y"])]
    else:
        nodes.append(helper.make_node("MatMul", ["f", "m"], ["y"]))
        del inits["mb"]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Reader(quantization.CalibrationDataReader if hasattr(quantization, "CalibrationDataReader") else object):
    def __init__(self, xs):
        self._it = iter([{"x": x} for x in xs])

    def get_next(self):
        return next(self._it, None)


CASES = [("QDQ", "s8", False), ("QDQ", "s8", True), ("QDQ", "u8", False), ("QDQ", "u8", True),
         ("QOperator", "u8", False), ("QOperator", "s8", True)]


@pytest.mark.parametrize("fmt,act,per_channel", CASES)
def test_prequantized_model_runs_int8_on_the_npu_with_its_own_scales(tmp_path, fmt, act, per_channel):
    rng = np.random.default_rng(5)
    # QOperator's Add is a com.microsoft op (QLinearAdd), outside the default domain
    fp = save(float_model(rng, with_add=fmt == "QDQ"), tmp_path / "f.onnx")
    xs = rng.standard_normal((8, 1, 8, 6, 6)).astype(np.float32)
    q = tmp_path / "q.onnx"
    quantization.quantize_static(
        str(fp), str(q), _Reader(xs), quant_format=getattr(quantization.QuantFormat, fmt),
        activation_type=quantization.QuantType.QUInt8 if act == "u8" else quantization.QuantType.QInt8,
        weight_type=quantization.QuantType.QInt8, per_channel=per_channel)
    report = build(q, tmp_path / "q.rkbin", BuildOptions(precision="int8"))
    heavy = [p for p in report.placements if p.op.type in ("Conv", "MatMul")]
    assert len(heavy) == 4 if fmt == "QDQ" else len(heavy) == 3
    assert all(p.device == "npu" and p.dtype == "int8" for p in heavy), \
        [(p.op.describe(), p.device, p.reason) for p in heavy]
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    want = onnxruntime_outputs(q, {"x": x})["y"]
    with runtime.load(tmp_path / "q.rkbin", "sim") as model:
        got = model.run({"x": x})["y"]
    # the same integers up to where the requantizations round differently (a step
    # here and there, which the following layers carry on)
    floats = onnxruntime_outputs(fp, {"x": x})["y"]
    # as close to the float model as onnxruntime's own run of the quantized model
    assert cosine(got, floats) >= min(0.999, cosine(want, floats) - 1e-3), (cosine(got, floats), cosine(want, floats))
    assert cosine(got, want) >= 0.998, cosine(got, want)
