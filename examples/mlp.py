"""An MLP, end to end: MatMul+Add layers with GELU (spelt out with Erf, as
exporters do) and a LayerNorm pattern, compiled, run on the simulator and
compared with onnxruntime.

    python examples/mlp.py [fp16|int8]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pipeline import compile_run_compare  # noqa: E402

OUT = Path("out")
SIZES = [64, 128, 128, 16]


def build_model(seed: int = 0, batch: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    x = "x"
    for i, (k, n) in enumerate(zip(SIZES, SIZES[1:])):
        w = const(f"w{i}", rng.standard_normal((k, n)) / math.sqrt(k))
        b = const(f"b{i}", rng.standard_normal(n) * 0.1)
        nodes += [helper.make_node("MatMul", [x, w], [f"mm{i}"]), helper.make_node("Add", [f"mm{i}", b], [f"h{i}"])]
        x = f"h{i}"
        if i == len(SIZES) - 2:
            break
        # GELU as exporters write it: x * 0.5 * (1 + erf(x / sqrt(2)))
        nodes += [
            helper.make_node("Div", [x, const(f"sqrt2_{i}", math.sqrt(2))], [f"gd{i}"]),
            helper.make_node("Erf", [f"gd{i}"], [f"ge{i}"]),
            helper.make_node("Add", [f"ge{i}", const(f"one{i}", 1.0)], [f"ga{i}"]),
            helper.make_node("Mul", [x, f"ga{i}"], [f"gm{i}"]),
            helper.make_node("Mul", [f"gm{i}", const(f"half{i}", 0.5)], [f"gelu{i}"]),
        ]
        x = f"gelu{i}"
        if i == 0:  # LayerNorm as its ReduceMean/Pow/Sqrt pattern
            nodes += [
                helper.make_node("ReduceMean", [x], ["ln_mean"], axes=[-1]),
                helper.make_node("Sub", [x, "ln_mean"], ["ln_d"]),
                helper.make_node("Pow", ["ln_d", const("two", 2.0)], ["ln_sq"]),
                helper.make_node("ReduceMean", ["ln_sq"], ["ln_var"], axes=[-1]),
                helper.make_node("Add", ["ln_var", const("eps", 1e-5)], ["ln_ve"]),
                helper.make_node("Sqrt", ["ln_ve"], ["ln_std"]),
                helper.make_node("Div", ["ln_d", "ln_std"], ["ln_n"]),
                helper.make_node("Mul", ["ln_n", const("ln_g", 1 + 0.1 * rng.standard_normal(SIZES[1]))], ["ln_s"]),
                helper.make_node("Add", ["ln_s", const("ln_b", 0.1 * rng.standard_normal(SIZES[1]))], ["ln"]),
            ]
            x = "ln"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, SIZES[0]])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, SIZES[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def main(precision: str = "fp16") -> float:
    OUT.mkdir(exist_ok=True)
    path = OUT / "mlp.onnx"
    onnx.save(build_model(), str(path))
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((4, SIZES[0])).astype(np.float32)}
    args = ["--precision", precision]
    if precision == "int8":
        np.savez(OUT / "mlp.calib.npz", x=rng.standard_normal((8, 4, SIZES[0])).astype(np.float32))
        args += ["--calib", str(OUT / "mlp.calib.npz")]
    return compile_run_compare(path, feeds, OUT, *args)


if __name__ == "__main__":
    worst = main(*sys.argv[1:2])
    sys.exit(0 if worst >= 0.99 else 1)
