"""A stride-2 convolution reading a uint8 image (rkc compile --image-input) reads it
as 2x2 blocks of pixels: SpaceToDepth(2) of the normalised image, then a stride-1
convolution over the blocks with the same products.

Why: the NPU reads a feature map in 16-byte atoms of channels, so a 3-channel
image is 16 bytes a pixel (3 lanes live) and the host writes 6.5 MB of atoms for
a 640x640 image every inference, the largest host cost of a detector (its image
pass is bound by those writes: docs/notes/2026-12-07-yolo-host-2.md). As 2x2
blocks a pixel of the map carries 12 channels: two fp16 atoms (3.3 MB) or one
int8 atom (1.6 MB) for the same image. The block map is written by the runtime's
image pass straight from the pixels (runtime/kernels/pixels_jit.py), so the
SpaceToDepth costs no step of its own; the NPU then reads fewer bytes too.

The products: out[y] = sum over taps dy of W[dy] x[2y + dy - p] (p the top pad).
Write 2y + dy - p = 2(y + q) + r with r in {0, 1}: tap dy reads block row
y + q at phase r, so the block convolution's kernel spans q in [qmin, qmax]
(qmin = floor(-p / 2), qmax = floor((k - 1 - p) / 2)) with top pad -qmin, and
W'[o, (ry * 2 + rx) * C + c, qy - qmin, qx - qmin] = W[o, c, dy, dx] (SpaceToDepth's
channel order, runtime/kernels/shape.py), zero where no tap lands. A 3x3 stride-2
convolution with pad 1 becomes a 2x2 one with pads (1, 1, 0, 0).

Only for an RGB map (3 channels: 12 block channels fill two fp16 atoms or one
int8 atom but for 4 lanes) that comes from a uint8 graph input through per-channel steps (the
image chain rkc's --image-input makes: the runtime fuses such a chain into one
pass) and is read by this convolution alone: a float input's edge has no fused
pass that writes blocks, and a second reader would need the plain map too.
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.passes.edit import add_const, only_consumer, producer
from rkc.ir.graph import Graph, Op
from rkc.ir.types import DType, TensorType

BLOCK = 2  # the convolution's stride the blocks absorb
RGB = 3  # the image's channels the runtime writes as blocks (runtime/kernels/pixels_jit.py pixels_into_blocks)
# ops between the uint8 input and the map, each value a function of its own channel's pixel alone
# (the runtime's image chain, runtime/image_edges.py image_chain_end)
_PER_CHANNEL = frozenset({"Cast", "Sub", "Div", "Mul", "Add", "Conv"})


def _from_image(graph: Graph, name: str) -> bool:
    """Whether tensor `name` is a uint8 NHWC graph input carried to NCHW by a Transpose
    and per-channel steps each of whose values only this chain reads."""
    while True:
        op = producer(graph, name)
        if op is None or only_consumer(graph, name) is None:
            return False
        if op.type == "Transpose":
            src = op.inputs[0]
            return list(op.attrs.get("perm", ())) == [0, 3, 1, 2] and src in graph.inputs \
                and graph.tensors[src].type.dtype == DType.UINT8
        if op.type not in _PER_CHANNEL or any(graph.const_value(i) is None for i in op.inputs[1:] if i):
            return False
        if op.type == "Conv" and int(op.attrs.get("group", 1)) != graph.tensors[name].type.shape[1]:
            return False  # only a depthwise (per-channel) convolution: the normalisation
        name = op.inputs[0]


def _taps(k: int, pad: int) -> tuple[int, int]:
    """(qmin, qmax): the block offsets a stride-2 kernel of k taps with top pad `pad` reads."""
    return (-pad) // BLOCK, (k - 1 - pad) // BLOCK


def image_conv_as_blocks(graph: Graph, op: Op) -> bool:
    if op.type != "Conv" or int(op.attrs.get("group", 1)) != 1 or op.attrs.get("auto_pad", "NOTSET") != "NOTSET" \
            or [int(s) for s in op.attrs.get("strides", [1, 1])] != [BLOCK, BLOCK] \
            or any(int(d) != 1 for d in op.attrs.get("dilations", [1, 1])):
        return False
    x_name = op.inputs[0]
    x, y = graph.tensors[x_name].type, graph.tensors[op.outputs[0]].type
    w = graph.const_value(op.inputs[1])
    if w is None or w.ndim != 4 or not x.is_static or len(x.shape) != 4 or x.shape[0] != 1 \
            or x.shape[1] != RGB or x.shape[2] % BLOCK or x.shape[3] % BLOCK \
            or not _from_image(graph, x_name):
        return False
    _, c, h, wd = x.shape
    pt, pl, pb, pr = [int(p) for p in op.attrs.get("pads", [0, 0, 0, 0])]
    (qy0, qy1), (qx0, qx1) = _taps(w.shape[2], pt), _taps(w.shape[3], pl)
    ky, kx = qy1 - qy0 + 1, qx1 - qx0 + 1
    # bottom / right pads that give the same output size (stride 1 over the blocks)
    bottom, right = y.shape[2] - 1 + qy1 - (h // BLOCK - 1), y.shape[3] - 1 + qx1 - (wd // BLOCK - 1)
    if bottom < 0 or right < 0 or -qy0 < 0 or -qx0 < 0:
        return False
    blocks = np.zeros((w.shape[0], c * BLOCK * BLOCK, ky, kx), w.dtype)
    for dy in range(w.shape[2]):
        qy, ry = divmod(dy - pt, BLOCK)
        for dx in range(w.shape[3]):
            qx, rx = divmod(dx - pl, BLOCK)
            ch = (ry * BLOCK + rx) * c
            blocks[:, ch:ch + c, qy - qy0, qx - qx0] = w[:, :, dy, dx]
    s2d = f"{x_name}:blocks"
    graph.add_op("SpaceToDepth", [x_name], [(s2d, TensorType(x.dtype, (1, c * BLOCK * BLOCK, h // BLOCK,
                                                                         wd // BLOCK)))],
                 {"blocksize": BLOCK}, name=s2d)
    graph.ops.insert(graph.ops.index(op), graph.ops.pop())  # before its reader: the list stays in order
    op.inputs = [s2d, add_const(graph, f"{op.inputs[1]}:blocks", blocks), *op.inputs[2:]]
    op.attrs = {**op.attrs, "kernel_shape": [ky, kx], "strides": [1, 1], "pads": [-qy0, -qx0, bottom, right]}
    return True


REWRITES = [image_conv_as_blocks]
