"""Small ONNX models for tests, written with onnx.helper."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def example(name: str):
    """Import an examples/ module (its build_model is reused by the tests)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def single_op(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
              out_shape=None, opset: int = 17, **attrs) -> onnx.ModelProto:
    consts = consts or {}
    node = helper.make_node(op, [*inputs, *consts], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def graph_model(nodes, inits: dict, shape, opset: int = 13) -> onnx.ModelProto:
    """nodes from input "x" (float32, `shape`) to output "y", with float32 initializers `inits`."""
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def shufflenet_unit(c: int, seed: int) -> tuple[list, dict]:
    """ShuffleNet v1's stride-2 unit: Relu(Conv) -> [3x3/2 AveragePool excluding padding,
    3x3/2 Conv] -> Concat -> Relu, random weights from `seed`: (nodes, initializers) for
    graph_model, input [1, 3, H, W]."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("AveragePool", ["r0"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c1", "p"], ["cat"], axis=1), helper.make_node("Relu", ["cat"], ["y"])]
    inits = {"w0": rng.standard_normal((c, 3, 1, 1)), "w1": rng.standard_normal((c, c, 3, 3)) / (3 * c ** 0.5),
             "b1": rng.standard_normal(c)}
    return nodes, inits


def sppf_like(c: int, hw: int, seed: int) -> onnx.ModelProto:
    """Conv -> strided padded MaxPool -> Conv -> three chained 5x5 MaxPools (YOLO's SPPF) -> Add, random
    weights from `seed`, input [1, 3, hw, hw]."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"]),
             *[helper.make_node("MaxPool", [a], [b], kernel_shape=[5, 5], pads=[2, 2, 2, 2])
               for a, b in (("c2", "m1"), ("m1", "m2"), ("m2", "m3"))],
             helper.make_node("Conv", ["m3", "w3"], ["c3"]), helper.make_node("Add", ["c3", "m1"], ["y"])]
    inits = {"w1": rng.standard_normal((c, 3, 3, 3)) / 4, "b1": rng.standard_normal(c) * 0.1,
             "w2": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c), "w3": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)}
    return graph_model(nodes, inits, [1, 3, hw, hw])


def cpu_max_pools(monkeypatch) -> None:
    """Keep every MaxPool on the CPU (tests where it stands for a CPU op): its CPU kernel modelled
    free, so no DPU taps model less (compiler/cost.py MAX_POOL_HOST_S)."""
    from rkc.compiler import cost

    monkeypatch.setattr(cost, "MAX_POOL_HOST_S", {"int8": (0.0, 0.0), "fp16": (0.0, 0.0)})


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def onnxruntime_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def light_with_random_weights(name: str, path: Path) -> Path | None:
    """onnx's bundled light model `name` with random weights (seed 0, He-scaled; batch-norm
    variances uniform in [0.5, 1.5]), saved at
    `path` (None when onnx ships no such model): its own weights are all
    ConstantOfShape(0.02), which proves nothing (issue 38)."""
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"
    if not light.exists():
        return None
    m = onnx.load(light)
    shapes = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    variances = {n.input[4] for n in m.graph.node if n.op_type == "BatchNormalization"}
    rng = np.random.default_rng(0)
    nodes, weights = [], []
    for n in m.graph.node:
        if n.op_type != "ConstantOfShape":
            nodes.append(n)
            continue
        shape = [int(d) for d in shapes[n.input[0]]]
        scale = np.sqrt(2.0 / np.prod(shape[1:])) if len(shape) > 1 else 0.1
        value = rng.standard_normal(shape) * scale
        if n.output[0] in variances:  # a variance is positive
            value = rng.uniform(0.5, 1.5, shape)
        weights.append(numpy_helper.from_array(value.astype(np.float32), n.output[0]))
    used = {x for n in nodes for x in n.input}
    kept = [i for i in m.graph.initializer if i.name in used]
    inputs = [i for i in m.graph.input if i.name in used]
    del m.graph.node[:], m.graph.initializer[:], m.graph.input[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.extend(kept + weights)
    m.graph.input.extend(inputs)
    m.ir_version = max(m.ir_version, 7)
    return save(m, path)


# cosine bounds of small random-weight graphs against onnxruntime, the simulator running them
# (tests/compiler's NPU coverage tests)
NPU_COSINE = {"fp16": 0.9995, "int8": 0.995}


def placements_by_output(report) -> dict[str, tuple[str, str]]:
    """A build report's placements by each op's first output: (device, reason)."""
    return {p.op.outputs[0]: (p.device, p.reason) for p in report.placements}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def compile_calibrated(tmp_path: Path, path: Path, shape, precision: str, seed: int, int8_only: bool = True,
                       name: str = "x"):
    """Compile the ONNX at `path` to tmp_path / "m.rkbin" at `precision` (int8: calibrated on 4
    random inputs `name` of `shape`; int8_only: kept int8 where fp16 throughout would model
    faster, as tests of the int8 lowering want): (the build report, the seeded generator past
    the calibration's draws, for the test's inputs)."""
    from rkc.compiler.build import BuildOptions, build

    options = BuildOptions(precision=precision, int8_only=int8_only)
    rng = np.random.default_rng(seed)
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        np.savez(options.calib, **{name: rng.standard_normal((4, *shape)).astype(np.float32)})
    return build(path, tmp_path / "m.rkbin", options), rng


def build_and_run(tmp_path: Path, model: onnx.ModelProto, shape, precision: str):
    """Compile `model` (input x, output y) at `precision` (int8: calibrated on 4 random
    inputs, and kept int8 where fp16 throughout would model faster: these test the int8
    lowering), run one random x on the simulator: (build report, rkc's y, onnxruntime's y)."""
    from rkc import runtime

    path = save(model, tmp_path / "m.onnx")
    report, rng = compile_calibrated(tmp_path, path, shape, precision, 7, int8_only=precision == "int8")
    x = rng.standard_normal(shape).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin") as m:
        got = m.run({"x": x})["y"]
    return report, got, onnxruntime_outputs(path, {"x": x})["y"]
