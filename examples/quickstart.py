"""Quickstart: the main job end to end on a tiny model, with the built-in NPU simulator.

Run it from the repository root after installing rkc:

    python examples/quickstart.py

It writes a tiny ONNX model (convolutions, a residual add, ReLU, a matrix
product and a softmax) into out/, compiles it with `rkc compile`, shows the
segments with `rkc inspect` (and their graph as DOT), runs it with `rkrun`
(NPU segments on the simulator when no NPU is present) and compares the result
with onnxruntime.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path("out")
BIN = Path(sys.executable).parent


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def const(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["res"]),
        helper.make_node("Relu", ["res"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])],
        [const("w1", 16, 8, 3, 3), const("b1", 16), const("w2", 16, 16, 3, 3), const("b2", 16), const("fc", 16, 10)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(*cmd: str) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run([str(BIN / cmd[0]), *cmd[1:]], check=True)


def main() -> None:
    import onnxruntime as ort

    OUT.mkdir(exist_ok=True)
    model, rkbin = OUT / "tiny.onnx", OUT / "tiny.rkbin"
    onnx.save(tiny_model(), str(model))
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.savez(OUT / "tiny.in.npz", x=x)
    run("rkc", "compile", str(model), "-o", str(rkbin), "--explain")
    run("rkc", "inspect", str(rkbin), "--dot", str(OUT / "tiny.dot"))
    run("rkrun", str(rkbin), "--inputs", str(OUT / "tiny.in.npz"), "--outputs", str(OUT / "tiny.out.npz"))
    got = np.load(OUT / "tiny.out.npz")["probs"]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    error = float(np.abs(got - want).max())
    print(f"max abs difference vs onnxruntime: {error:.2e} (fp16 on the NPU)")
    if error > 1e-2:
        sys.exit("quickstart: results differ from onnxruntime")


if __name__ == "__main__":
    main()
