"""ImageNet classifiers that published RK3588 figures measure and no package
here ships as ONNX, built from their papers' layer tables: MobileNetV1 (Howard
et al. 2017, arXiv 1704.04861, Table 1) and MobileNetV2 (Sandler et al. 2018,
arXiv 1801.04381, Table 2; ReLU6 as Clip, as the ONNX model zoo's
mobilenetv2-12 has it). Weights are random: the performance model depends on
the shapes only. Written on the fly, never committed.

    python bench/zoo_models.py mobilenet_v2 out.onnx
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# MobileNetV1: (output channels, stride) of each depthwise-separable block after the 3x3/2 stem of 32
MOBILENET_V1 = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
                (512, 1), (512, 1), (1024, 2), (1024, 1)]
# MobileNetV2: (expansion t, output channels c, repeats n, first stride s) after the 3x3/2 stem of 32
MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]


class _Net:
    def __init__(self, seed: int = 0):
        self.nodes, self.inits, self.rng, self.n = [], [], np.random.default_rng(seed), 0

    def _name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int, group: int = 1, act: str | None = "relu6") -> str:
        w = self._name("w")
        fan = cin // group * k * k
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2 / fan)).astype(np.float32), w))
        b = self._name("b")
        self.inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), b))
        y = self._name("conv")
        self.nodes.append(helper.make_node("Conv", [x, w, b], [y], kernel_shape=[k, k], strides=[stride, stride],
                                           pads=[k // 2] * 4, group=group))
        if act == "relu6":
            lo, hi = self._name("lo"), self._name("hi")
            self.inits += [numpy_helper.from_array(np.array(0, np.float32), lo),
                           numpy_helper.from_array(np.array(6, np.float32), hi)]
            z = self._name("clip")
            self.nodes.append(helper.make_node("Clip", [y, lo, hi], [z]))
            return z
        if act == "relu":
            z = self._name("relu")
            self.nodes.append(helper.make_node("Relu", [y], [z]))
            return z
        return y

    def head(self, x: str, channels: int, classes: int = 1000) -> str:
        p, f, w, b, y = self._name("pool"), self._name("flat"), self._name("fcw"), self._name("fcb"), "logits"
        self.inits += [numpy_helper.from_array((self.rng.standard_normal((classes, channels)) * 0.01)
                                               .astype(np.float32), w),
                       numpy_helper.from_array(np.zeros(classes, np.float32), b)]
        self.nodes += [helper.make_node("GlobalAveragePool", [x], [p]), helper.make_node("Flatten", [p], [f]),
                       helper.make_node("Gemm", [f, w, b], [y], transB=1)]
        return y

    def model(self, name: str, out: str, classes: int = 1000) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name,
                                  [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, classes])], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def mobilenet_v1() -> onnx.ModelProto:
    net = _Net()
    x, c = net.conv("input", 3, 32, 3, 2, act="relu"), 32
    for cout, s in MOBILENET_V1:
        x = net.conv(net.conv(x, c, c, 3, s, group=c, act="relu"), c, cout, 1, 1, act="relu")
        c = cout
    return net.model("mobilenet_v1", net.head(x, c))


def mobilenet_v2() -> onnx.ModelProto:
    net = _Net()
    x, c = net.conv("input", 3, 32, 3, 2), 32
    for t, cout, n, s in MOBILENET_V2:
        for i in range(n):
            stride, hidden = s if i == 0 else 1, c * t
            y = net.conv(x, c, hidden, 1, 1) if t != 1 else x
            y = net.conv(net.conv(y, hidden, hidden, 3, stride, group=hidden), hidden, cout, 1, 1, act=None)
            if stride == 1 and c == cout:
                z = net._name("add")
                net.nodes.append(helper.make_node("Add", [x, y], [z]))
                y = z
            x, c = y, cout
    x = net.conv(x, c, 1280, 1, 1)
    return net.model("mobilenet_v2", net.head(x, 1280))


BUILDERS = {"mobilenet_v1": mobilenet_v1, "mobilenet_v2": mobilenet_v2}


def write(name: str, path: Path) -> Path:
    from rkc.ir.atomic import atomic_output

    model = BUILDERS[name]()
    onnx.checker.check_model(model)
    with atomic_output(path) as tmp:
        onnx.save(model, str(tmp))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(BUILDERS))
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    write(args.model, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
