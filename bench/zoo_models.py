"""Models that published RK3588 figures measure and no package here ships as
ONNX, built from their published structure: MobileNetV1 (Howard et al. 2017,
arXiv 1704.04861, Table 1) and MobileNetV2 (Sandler et al. 2018, arXiv
1801.04381, Table 2; ReLU6 as Clip, as the ONNX model zoo's mobilenetv2-12 has
it), and YOLOv8n and YOLO11n from ultralytics' model configs (cfg/models/v8/yolov8.yaml,
scale n: depth 0.33, width 0.25; cfg/models/11/yolo11.yaml, scale n: depth 0.50, width
0.25; modules C2f, C3k2, C3k, SPPF, C2PSA with its attention, Detect as
ultralytics/nn/modules define them: Conv = conv + folded BatchNorm + SiLU, exported as
Sigmoid and Mul),
cut where rknn_model_zoo's YOLOv8 export cuts it: per level the 64 box-distribution
channels and the 80 class scores through a Sigmoid; DFL, box decode and NMS run on
the CPU after the model, as the zoo's post-processing does. Weights are random from
a fixed seed (the performance model depends on the shapes only; correctness tests
need random, never constant, weights). Written on the fly, never committed.

    python bench/zoo_models.py mobilenet_v2 out.onnx
    python bench/zoo_models.py yolov8n out.onnx --size 640
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

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int, group: int = 1, act: str | None = "relu6",
             bias_std: float = 0.0) -> str:
        w = self._name("w")
        fan = cin // group * k * k
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2 / fan)).astype(np.float32), w))
        b = self._name("b")
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(cout) * bias_std).astype(np.float32), b))
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
        if act == "silu":  # x * sigmoid(x), as torch.onnx exports nn.SiLU
            s, z = self._name("sigmoid"), self._name("silu")
            self.nodes += [helper.make_node("Sigmoid", [y], [s]), helper.make_node("Mul", [y, s], [z])]
            return z
        return y

    def op(self, kind: str, inputs: list[str], outputs: int = 1, **attrs) -> list[str]:
        names = [self._name(kind.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, inputs, names, **attrs))
        return names

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


# YOLOv8's layers (yolov8.yaml): (module, full-scale channels, repeats, stride or shortcut), scaled by
# YOLOV8_SCALES[scale] = (depth, width, max channels)
YOLOV8_SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024)}
YOLO_REG_MAX, YOLO_CLASSES = 16, 80


def _yolo_conv(net: _Net, x: str, cin: int, cout: int, k: int = 1, s: int = 1) -> str:
    """ultralytics' Conv: k x k convolution, BatchNorm folded into its bias, SiLU."""
    return net.conv(x, cin, cout, k, s, act="silu", bias_std=0.1)


def _c2f(net: _Net, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
    """C2f: a 1x1 conv split in two halves, n bottlenecks on the second, all concatenated."""
    c = cout // 2
    y = _yolo_conv(net, x, cin, 2 * c)
    split = net._name("split_sizes")
    net.inits.append(numpy_helper.from_array(np.array([c, c], np.int64), split))
    parts = net.op("Split", [y, split], 2, axis=1)
    for _ in range(n):
        b = _yolo_conv(net, _yolo_conv(net, parts[-1], c, c, 3), c, c, 3)
        parts.append(net.op("Add", [parts[-1], b])[0] if shortcut else b)
    return _yolo_conv(net, net.op("Concat", parts, axis=1)[0], (2 + n) * c, cout)


def _sppf(net: _Net, x: str, cin: int, cout: int, k: int = 5) -> str:
    c = cin // 2
    parts = [_yolo_conv(net, x, cin, c)]
    for _ in range(3):
        parts += net.op("MaxPool", [parts[-1]], kernel_shape=[k, k], strides=[1, 1], pads=[k // 2] * 4)
    return _yolo_conv(net, net.op("Concat", parts, axis=1)[0], 4 * c, cout)


def _upsample(net: _Net, x: str) -> str:
    scales = net._name("scales")
    net.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), scales))
    return net.op("Resize", [x, "", scales], mode="nearest")[0]


def yolov8(scale: str = "n", size: int = 640, seed: int = 0) -> onnx.ModelProto:
    """YOLOv8 at `size` x `size`, outputs per level (P3, P4, P5): box distributions
    [1, 64, h, w] and class scores [1, 80, h, w] after a Sigmoid (rknn_model_zoo's cut)."""
    depth, width, top = YOLOV8_SCALES[scale]

    def ch(c):  # ultralytics' make_divisible(min(c, max channels) * width, 8)
        return int(np.ceil(min(c, top) * width / 8) * 8)

    def rep(n):
        return max(round(n * depth), 1)

    net = _Net(seed)
    x = _yolo_conv(net, "images", 3, ch(64), 3, 2)
    x = _yolo_conv(net, x, ch(64), ch(128), 3, 2)
    x = _c2f(net, x, ch(128), ch(128), rep(3), True)
    x = _yolo_conv(net, x, ch(128), ch(256), 3, 2)
    p3 = _c2f(net, x, ch(256), ch(256), rep(6), True)
    x = _yolo_conv(net, p3, ch(256), ch(512), 3, 2)
    p4 = _c2f(net, x, ch(512), ch(512), rep(6), True)
    x = _yolo_conv(net, p4, ch(512), ch(1024), 3, 2)
    x = _c2f(net, x, ch(1024), ch(1024), rep(3), True)
    p5 = _sppf(net, x, ch(1024), ch(1024))
    x = net.op("Concat", [_upsample(net, p5), p4], axis=1)[0]
    h4 = _c2f(net, x, ch(1024) + ch(512), ch(512), rep(3), False)
    x = net.op("Concat", [_upsample(net, h4), p3], axis=1)[0]
    out3 = _c2f(net, x, ch(512) + ch(256), ch(256), rep(3), False)
    x = net.op("Concat", [_yolo_conv(net, out3, ch(256), ch(256), 3, 2), h4], axis=1)[0]
    out4 = _c2f(net, x, ch(256) + ch(512), ch(512), rep(3), False)
    x = net.op("Concat", [_yolo_conv(net, out4, ch(512), ch(512), 3, 2), p5], axis=1)[0]
    out5 = _c2f(net, x, ch(512) + ch(1024), ch(1024), rep(3), False)
    levels = [(out3, ch(256)), (out4, ch(512)), (out5, ch(1024))]
    c2 = max(16, levels[0][1] // 4, YOLO_REG_MAX * 4)  # Detect's box and class branch widths
    c3 = max(levels[0][1], min(YOLO_CLASSES, 100))
    outputs = []
    for i, (f, c) in enumerate(levels):
        box = _yolo_conv(net, _yolo_conv(net, f, c, c2, 3), c2, c2, 3)
        box = net.conv(box, c2, 4 * YOLO_REG_MAX, 1, 1, act=None, bias_std=0.1)
        cls = _yolo_conv(net, _yolo_conv(net, f, c, c3, 3), c3, c3, 3)
        cls = net.op("Sigmoid", [net.conv(cls, c3, YOLO_CLASSES, 1, 1, act=None, bias_std=0.1)])[0]
        outputs += [(box, 4 * YOLO_REG_MAX, i), (cls, YOLO_CLASSES, i)]
    renamed = []
    for name, c, i in outputs:
        final = f"{'box' if c == 4 * YOLO_REG_MAX else 'cls'}{i}"
        net.nodes.append(helper.make_node("Identity", [name], [final]))
        renamed.append(helper.make_tensor_value_info(final, TensorProto.FLOAT, [1, c, size >> (3 + i), size >> (3 + i)]))
    graph = helper.make_graph(net.nodes, f"yolov8{scale}",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                              renamed, net.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def yolov8n(size: int = 640) -> onnx.ModelProto:
    return yolov8("n", size)


# YOLO11 (ultralytics/cfg/models/11/yolo11.yaml), scale n: depth 0.50, width 0.25
YOLO11_SCALES = {"n": (0.50, 0.25, 1024)}


def _bottleneck(net: _Net, x: str, c: int, e: float, shortcut: bool) -> str:
    hidden = int(c * e)
    y = _yolo_conv(net, _yolo_conv(net, x, c, hidden, 3), hidden, c, 3)
    return net.op("Add", [x, y])[0] if shortcut else y


def _c3k(net: _Net, x: str, cin: int, cout: int, n: int = 2) -> str:
    """C3k: C3 with 3x3 bottlenecks: two 1x1 branches, bottlenecks on the first, concatenated."""
    c = int(cout * 0.5)
    a = _yolo_conv(net, x, cin, c)
    for _ in range(n):
        a = _bottleneck(net, a, c, 1.0, True)
    return _yolo_conv(net, net.op("Concat", [a, _yolo_conv(net, x, cin, c)], axis=1)[0], 2 * c, cout)


def _c3k2(net: _Net, x: str, cin: int, cout: int, n: int, c3k: bool, e: float = 0.5) -> str:
    """C3k2: C2f whose blocks are C3k (c3k) or bottlenecks of half width."""
    c = int(cout * e)
    split = net._name("split_sizes")
    net.inits.append(numpy_helper.from_array(np.array([c, c], np.int64), split))
    parts = net.op("Split", [_yolo_conv(net, x, cin, 2 * c), split], 2, axis=1)
    for _ in range(n):
        parts.append(_c3k(net, parts[-1], c, c) if c3k else _bottleneck(net, parts[-1], c, 0.5, True))
    return _yolo_conv(net, net.op("Concat", parts, axis=1)[0], (2 + n) * c, cout)


def _const(net: _Net, value, dtype=np.int64) -> str:
    name = net._name("const")
    net.inits.append(numpy_helper.from_array(np.array(value, dtype), name))
    return name


def _attention(net: _Net, x: str, dim: int, heads: int, hw: int) -> str:
    """ultralytics' Attention (attn_ratio 0.5): qkv 1x1 conv, per-head softmax(q^T k * scale)
    over the H*W positions, v weighted, plus a depthwise 3x3 positional conv of v, 1x1 proj."""
    head_dim, key_dim = dim // heads, dim // heads // 2
    qkv = net.conv(x, dim, dim + 2 * key_dim * heads, 1, 1, act=None, bias_std=0.1)
    r = net.op("Reshape", [qkv, _const(net, [1, heads, 2 * key_dim + head_dim, hw])])[0]
    q, k, v = net.op("Split", [r, _const(net, [key_dim, key_dim, head_dim])], 3, axis=2)
    qt = net.op("Transpose", [q], perm=[0, 1, 3, 2])[0]
    scores = net.op("Mul", [net.op("MatMul", [qt, k])[0], _const(net, key_dim ** -0.5, np.float32)])[0]
    attn = net.op("Softmax", [scores], axis=-1)[0]
    mixed = net.op("MatMul", [v, net.op("Transpose", [attn], perm=[0, 1, 3, 2])[0]])[0]
    side = int(round(hw ** 0.5))
    shape = _const(net, [1, dim, side, side])
    vmap = net.op("Reshape", [v, shape])[0]
    pe = net.conv(vmap, dim, dim, 3, 1, group=dim, act=None, bias_std=0.1)
    y = net.op("Add", [net.op("Reshape", [mixed, shape])[0], pe])[0]
    return net.conv(y, dim, dim, 1, 1, act=None, bias_std=0.1)


def _c2psa(net: _Net, x: str, c1: int, hw: int) -> str:
    c = c1 // 2
    split = _const(net, [c, c])
    a, b = net.op("Split", [_yolo_conv(net, x, c1, 2 * c), split], 2, axis=1)
    b = net.op("Add", [b, _attention(net, b, c, c // 64, hw)])[0]
    ffn = net.conv(_yolo_conv(net, b, c, 2 * c), 2 * c, c, 1, 1, act=None, bias_std=0.1)
    b = net.op("Add", [b, ffn])[0]
    return _yolo_conv(net, net.op("Concat", [a, b], axis=1)[0], 2 * c, c1)


def yolo11(scale: str = "n", size: int = 640, seed: int = 0) -> onnx.ModelProto:
    """YOLO11 at `size` x `size`, outputs as yolov8()'s (the zoo's cut)."""
    depth, width, top = YOLO11_SCALES[scale]

    def ch(c):
        return int(np.ceil(min(c, top) * width / 8) * 8)

    n = max(round(2 * depth), 1)
    net = _Net(seed)
    x = _yolo_conv(net, "images", 3, ch(64), 3, 2)
    x = _yolo_conv(net, x, ch(64), ch(128), 3, 2)
    x = _c3k2(net, x, ch(128), ch(256), n, False, 0.25)
    x = _yolo_conv(net, x, ch(256), ch(256), 3, 2)
    p3 = _c3k2(net, x, ch(256), ch(512), n, False, 0.25)
    x = _yolo_conv(net, p3, ch(512), ch(512), 3, 2)
    p4 = _c3k2(net, x, ch(512), ch(512), n, True)
    x = _yolo_conv(net, p4, ch(512), ch(1024), 3, 2)
    x = _c3k2(net, x, ch(1024), ch(1024), n, True)
    x = _sppf(net, x, ch(1024), ch(1024))
    p5 = _c2psa(net, x, ch(1024), (size // 32) ** 2)
    x = net.op("Concat", [_upsample(net, p5), p4], axis=1)[0]
    h4 = _c3k2(net, x, ch(1024) + ch(512), ch(512), n, False)
    x = net.op("Concat", [_upsample(net, h4), p3], axis=1)[0]
    out3 = _c3k2(net, x, ch(512) + ch(512), ch(256), n, False)
    x = net.op("Concat", [_yolo_conv(net, out3, ch(256), ch(256), 3, 2), h4], axis=1)[0]
    out4 = _c3k2(net, x, ch(256) + ch(512), ch(512), n, False)
    x = net.op("Concat", [_yolo_conv(net, out4, ch(512), ch(512), 3, 2), p5], axis=1)[0]
    out5 = _c3k2(net, x, ch(512) + ch(1024), ch(1024), n, True)
    levels = [(out3, ch(256)), (out4, ch(512)), (out5, ch(1024))]
    c2 = max(16, levels[0][1] // 4, YOLO_REG_MAX * 4)
    c3 = max(levels[0][1], min(YOLO_CLASSES, 100))
    outputs = []
    for i, (f, c) in enumerate(levels):
        box = _yolo_conv(net, _yolo_conv(net, f, c, c2, 3), c2, c2, 3)
        box = net.conv(box, c2, 4 * YOLO_REG_MAX, 1, 1, act=None, bias_std=0.1)
        cls = f
        for cin, cout in ((c, c3), (c3, c3)):  # DWConv 3x3 then a 1x1 Conv, twice
            cls = _yolo_conv(net, net.conv(cls, cin, cin, 3, 1, group=cin, act="silu", bias_std=0.1), cin, cout)
        cls = net.op("Sigmoid", [net.conv(cls, c3, YOLO_CLASSES, 1, 1, act=None, bias_std=0.1)])[0]
        outputs += [(box, f"box{i}", 4 * YOLO_REG_MAX, i), (cls, f"cls{i}", YOLO_CLASSES, i)]
    for name, final, _, _ in outputs:
        net.nodes.append(helper.make_node("Identity", [name], [final]))
    graph = helper.make_graph(net.nodes, f"yolo11{scale}",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info(final, TensorProto.FLOAT,
                                                             [1, c, size >> (3 + i), size >> (3 + i)])
                               for _, final, c, i in outputs], net.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def yolo11n(size: int = 640) -> onnx.ModelProto:
    return yolo11("n", size)


BUILDERS = {"mobilenet_v1": mobilenet_v1, "mobilenet_v2": mobilenet_v2, "yolov8n": yolov8n, "yolo11n": yolo11n}


def write(name: str, path: Path, size: int | None = None) -> Path:
    from rkc.ir.atomic import atomic_output

    model = BUILDERS[name](*([size] if size else []))
    onnx.checker.check_model(model)
    with atomic_output(path) as tmp:
        onnx.save(model, str(tmp))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(BUILDERS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", type=int, help="yolov8n: input height and width (a multiple of 32; default 640)")
    args = ap.parse_args()
    write(args.model, args.out, args.size)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
