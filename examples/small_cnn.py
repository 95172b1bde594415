"""A small CNN, end to end: build it with onnx.helper, compile it for the NPU,
run it on the simulator, compare with onnxruntime.

    python examples/small_cnn.py          # fp16
    python examples/small_cnn.py int8     # int8 with a generated calibration set
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pipeline import compile_run_compare  # noqa: E402

OUT = Path("out")


def build_model(seed: int = 0) -> onnx.ModelProto:
    """Conv-BN-ReLU x2, max pool, depthwise conv, residual add, global pool, Gemm, softmax."""
    rng = np.random.default_rng(seed)

    def const(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        const("w1", 16, 3, 3, 3), const("b1", 16),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "bn_g"),
        const("bn_b", 16, scale=0.1), const("bn_m", 16, scale=0.1),
        numpy_helper.from_array((1 + 0.2 * rng.random(16)).astype(np.float32), "bn_v"),
        const("w2", 32, 16, 3, 3, scale=0.1), const("b2", 32),
        const("wd", 32, 1, 3, 3), const("bd", 32),
        const("fc_w", 10, 32), const("fc_b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_g", "bn_b", "bn_m", "bn_v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("Add", ["d", "r2"], ["res"]),
        helper.make_node("GlobalAveragePool", ["res"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def main(precision: str = "fp16") -> float:
    OUT.mkdir(exist_ok=True)
    path = OUT / "small_cnn.onnx"
    onnx.save(build_model(), str(path))
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    args = ["--precision", precision]
    if precision == "int8":
        np.savez(OUT / "small_cnn.calib.npz", x=rng.standard_normal((8, 1, 3, 32, 32)).astype(np.float32))
        args += ["--calib", str(OUT / "small_cnn.calib.npz")]
    return compile_run_compare(path, feeds, OUT, *args)


if __name__ == "__main__":
    worst = main(*sys.argv[1:2])
    sys.exit(0 if worst >= 0.99 else 1)
