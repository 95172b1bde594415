"""Ops that used to fall back to the CPU inside CNNs now run on the NPU, checked
end to end on the simulator against onnxruntime (fp16 and calibrated int8):
per-channel affine maps (Mul / Add / Sub / Div by constants, BatchNormalization,
HardSigmoid) as 1x1 depthwise convolutions, fp16 depthwise convolutions of any
channel count."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc.compiler.build import BuildOptions, build
from rkc.compiler.frontend import load_graph
from rkc.compiler.passes import run_passes
from rkc.compiler.reference import run_graph
from rkc.ir.npu.layout import kernel_group_for
from onnx_models import (NPU_COSINE, build_and_run, cosine, cpu_max_pools, graph_model, light_with_random_weights,
                         onnxruntime_outputs, placements_by_output, save, shufflenet_unit, sppf_like)

@pytest.fixture(autouse=True)
def _max_pools_on_the_cpu(monkeypatch):
    """MaxPool stands for a CPU op in these tests (a small fp16 pool's DPU taps would otherwise
    model less NPU time than its CPU kernel takes)."""
    cpu_max_pools(monkeypatch)


pytest.importorskip("rkc.runtime.sim")
THRESHOLD = NPU_COSINE


def _affine_chain(c: int, seed: int):
    """Relu (so nothing folds into a Conv) -> every affine form -> Relu."""
    rng = np.random.default_rng(seed)
    inits = {"s": rng.uniform(0.5, 2, (c, 1, 1)), "b": np.float32(0.25), "k": rng.standard_normal((1, c, 1, 1)),
             "d": np.float32(1.5), "g": rng.uniform(0.5, 1.5, c), "beta": rng.standard_normal(c),
             "mean": rng.standard_normal(c), "var": rng.uniform(0.5, 2, c)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "s"], ["m"]),
             helper.make_node("Add", ["b", "m"], ["a"]), helper.make_node("Sub", ["k", "a"], ["s1"]),
             helper.make_node("Div", ["s1", "d"], ["d1"]),
             helper.make_node("BatchNormalization", ["d1", "g", "beta", "mean", "var"], ["bn"]),
             helper.make_node("HardSigmoid", ["bn"], ["h"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["h", "bn"], ["y"])]
    return nodes, inits


def test_affine_maps_become_depthwise_convolutions(tmp_path):
    nodes, inits = _affine_chain(5, 0)
    g = load_graph(save(graph_model(nodes, inits, [1, 5, 6, 7]), tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((1, 5, 6, 7)).astype(np.float32)
    before = run_graph(g, {"x": x})["y"]
    run_passes(g)
    types = [op.type for op in g.ops]
    assert not {"Sub", "Div", "BatchNormalization", "HardSigmoid"} & set(types)
    assert types.count("Mul") == 1  # x * hardsigmoid(x): two tensors
    assert all(int(op.attrs["group"]) == 5 for op in g.ops if op.type == "Conv")
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], before, rtol=1e-5, atol=1e-5)


def test_a_constant_after_a_conv_still_folds_into_it(tmp_path):
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "b"], ["y"])]
    model = graph_model(nodes, {"w": rng.standard_normal((4, 3, 1, 1)), "b": rng.standard_normal((1, 4, 1, 1))},
                   [1, 3, 5, 5])
    g = run_passes(load_graph(save(model, tmp_path / "m.onnx")))
    assert [op.type for op in g.ops] == ["Conv", "Add"]  # the Add fuses as the Conv's bias


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c", [3, 8, 24, 40])
def test_affine_chain_runs_on_the_npu(tmp_path, precision, c):
    nodes, inits = _affine_chain(c, c)
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, c, 6, 9]), (1, c, 6, 9), precision)
    cpu = [p.op.type for p in report.placements if p.device == "cpu"]
    assert cpu == ["Relu"], [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"]
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("c", [1, 8, 16, 24, 48])
def test_fp16_depthwise_of_any_channel_count_runs_on_the_npu(tmp_path, c):
    rng = np.random.default_rng(c)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = graph_model(nodes, {"w": rng.standard_normal((c, 1, 3, 3)), "b": rng.standard_normal(c)}, [1, c, 7, 10])
    report, got, want = build_and_run(tmp_path, model, (1, c, 7, 10), "fp16")
    assert all(p.device == "npu" for p in report.placements)
    assert cosine(got, want) >= THRESHOLD["fp16"]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, h, w", [(8, 3, 20), (200, 3, 96), (40, 2, 7), (16, 1, 5)])
def test_pointwise_conv_and_global_pool_on_maps_of_few_rows(tmp_path, precision, c, h, w):
    """Fewer rows than a task reads (Q2): both treat every position alike, so the
    H*W positions are read as a taller grid; a wide global pool's kernel also fits
    the kernel fields that way, and a depthwise kernel over many channels is split
    into channel tiles that each fit a CBUF bank."""
    rng = np.random.default_rng(c + h)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    model = graph_model(nodes, {"w": rng.standard_normal((c, 6, 1, 1)) / 3, "b": rng.standard_normal(c)}, [1, 6, h, w])
    report, got, want = build_and_run(tmp_path, model, (1, 6, h, w), precision)
    assert [p.device for p in report.placements] == ["npu"] * 3, [p.reason for p in report.placements]
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, h, w", [(8, 12, 20), (88, 3, 96), (40, 4, 5)])
def test_squeeze_excite_branch_runs_on_the_npu(tmp_path, precision, c, h, w):
    """GlobalAveragePool -> 1x1 Conv + ReLU -> 1x1 Conv -> HardSigmoid: the [1, C, 1, 1]
    maps are held as GEMM rows, the 1x1 convolutions run as GEMMs (M = 1), the
    HardSigmoid as bias + clip. The final broadcast Mul runs in fp16 as a 1x1 depthwise
    convolution whose weights are the gate (a map of 3 rows read as a taller grid),
    which the gate's last convolution writes as a native map (row 0 of the GEMM row at
    row stride 4): no host step, one segment. An int8 program keeps the Mul on the CPU."""
    rng = np.random.default_rng(c)
    r = max(c // 4, 1)
    inits = {"w1": rng.standard_normal((r, c, 1, 1)) / np.sqrt(c), "b1": rng.standard_normal(r) * 0.1,
             "w2": rng.standard_normal((c, r, 1, 1)) / np.sqrt(r), "b2": rng.standard_normal((1, c, 1, 1))}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]), helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Add", ["c2", "b2"], ["a2"]),
             helper.make_node("HardSigmoid", ["a2"], ["s"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, c, h, w]), (1, c, h, w), precision)
    cpu = [p.op.type for p in report.placements if p.device == "cpu"]
    assert cpu == ([] if report.precision == "fp16" else ["Mul"]), \
        [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"]
    if report.precision == "fp16":
        assert (report.segments, report.conversions) == (1, 2)  # the model's input and output only
    assert cosine(got, want) >= THRESHOLD[precision]


def _hard_swish_model(c: int, spelled_out: bool):
    """Conv -> HardSwish, as the op or as exporters spell it: x * clip(x + 3, 0, 6) / 6."""
    rng = np.random.default_rng(c)
    inits = {"w": rng.standard_normal((c, 4, 3, 3)) / 4, "b": rng.standard_normal(c)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    if spelled_out:
        inits |= {"three": np.float32(3), "zero": np.float32(0), "six": np.float32(6)}
        nodes += [helper.make_node("Add", ["c", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["k"]),
                  helper.make_node("Mul", ["c", "k"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])]
    else:
        nodes.append(helper.make_node("HardSwish", ["c"], ["y"]))
    return graph_model(nodes, inits, [1, 4, 8, 12], opset=14)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, spelled_out", [(8, False), (24, True), (40, False)])
def test_hard_swish_runs_on_the_npu(tmp_path, precision, c, spelled_out):
    """fp16: a lookup table in the convolution's epilogue. int8 (no int8 table):
    x * clip(x/6 + 1/2, 0, 1), the gate a 1x1 depthwise convolution with a clip,
    the product an element-wise Mul of two int8 tensors."""
    report, got, want = build_and_run(tmp_path, _hard_swish_model(c, spelled_out), (1, 4, 8, 12), precision)
    assert all(p.device == "npu" for p in report.placements), \
        [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"]
    types = sorted(p.op.type for p in report.placements)
    assert types == (["Conv", "HardSwish"] if precision == "fp16" else ["Add", "Clip", "Conv", "Conv", "Mul"])
    assert cosine(got, want) >= THRESHOLD[precision]
    assert report.segments == 1


@pytest.mark.parametrize("c, h, w", [(16, 8, 8), (48, 6, 20), (80, 5, 5)])
def test_silu_fuses_into_the_convolution_epilogue(tmp_path, c, h, w):
    """x * sigmoid(x) after a convolution (how exporters spell nn.SiLU) becomes one
    Swish and rides the convolution's DPU epilogue as the SiLU lookup table (fp16)."""
    rng = np.random.default_rng(c)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    model = graph_model(nodes, {"w": rng.standard_normal((c, 4, 3, 3)) / 2, "b": rng.standard_normal(c)}, [1, 4, h, w])
    report, got, want = build_and_run(tmp_path, model, (1, 4, h, w), "fp16")
    assert report.placements[-1].op.type == "Swish"
    assert [p.device for p in report.placements] == ["npu"] * 2
    assert "fused into the epilogue" in report.placements[-1].reason
    assert cosine(got, want) >= THRESHOLD["fp16"]
    np.testing.assert_allclose(got, want, atol=0.02, rtol=0.01)  # the table's step (compiler/npu/lut.py)


def _c2f_block(c: int, seed: int):
    """YOLOv8's C2f: a 1x1 conv split in two halves, a bottleneck on the second, the
    three concatenated, a 1x1 conv; then an SPPF-like Concat of the input and its pool."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.standard_normal((2 * c, 8, 1, 1)) / 3, "b1": rng.standard_normal(2 * c) * 0.1,
             "wb": rng.standard_normal((c, c, 3, 3)) / (3 * np.sqrt(c)), "bb": rng.standard_normal(c) * 0.1,
             "w2": rng.standard_normal((2 * c, 3 * c, 1, 1)) / np.sqrt(3 * c), "split": np.array([c, c])}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Split", ["r1", "split"], ["s0", "s1"], axis=1),
             helper.make_node("Conv", ["s1", "wb", "bb"], ["cb"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["cb"], ["rb"]), helper.make_node("Add", ["rb", "s1"], ["ab"]),
             helper.make_node("Concat", ["s0", "s1", "ab"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["c2"]),
             helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c2", "p"], ["y"], axis=1)]
    return nodes, inits


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, h, w", [(16, 8, 8), (32, 6, 11)])
def test_concat_and_split_of_npu_maps_are_slices_of_one_buffer(tmp_path, precision, c, h, w):
    """No step for a channel Split or Concat of NPU maps: the producers write their
    slices of one buffer, the consumers read theirs (int8: one shared scale)."""
    nodes, inits = _c2f_block(c, c + h)
    inits["split"] = inits["split"].astype(np.int64)
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.int64 if k == "split" else np.float32), k)
                               for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    report, got, want = build_and_run(tmp_path, model, (1, 8, h, w), precision)
    placed = {p.op.type: p.device for p in report.placements if p.op.type in ("Split", "Concat")}
    assert placed == {"Split": "view", "Concat": "view"}, [(p.op.type, p.reason) for p in report.placements]
    assert [p.op.type for p in report.placements if p.device == "cpu"] == ["MaxPool"]
    assert cosine(got, want) >= THRESHOLD[precision]


def _neck(c: int, resize_attrs: dict, scales=(1, 1, 2, 2)):
    """YOLO's PAN neck: conv + SiLU at half resolution, nearest Resize, Concat with the
    finer map, conv + SiLU."""
    rng = np.random.default_rng(c)
    silu = [helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["a1"]),
            helper.make_node("Sigmoid", ["c3"], ["s3"]), helper.make_node("Mul", ["c3", "s3"], ["y"])]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]), *silu[:2],
             helper.make_node("Resize", ["a1", "", "scales"], ["up"], mode="nearest", **resize_attrs),
             helper.make_node("Concat", ["up", "x"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]), *silu[2:]]
    inits = {"w1": rng.standard_normal((c, 16, 3, 3)) / 6, "b1": rng.standard_normal(c) * 0.1,
             "w3": rng.standard_normal((16, c + 16, 3, 3)) / 8, "b3": rng.standard_normal(16) * 0.1,
             "scales": np.array(scales)}
    return graph_model(nodes, inits, [1, 16, 12, 12])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("modes", [{}, {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                                   {"coordinate_transformation_mode": "align_corners"}],
                         ids=["half_pixel", "asymmetric", "align_corners"])
def test_yolo_neck_upsamples_on_the_npu(tmp_path, precision, modes):
    """With channels the depthwise writer fills (64: int8, 32: fp16) the Resize is two
    depthwise convolutions on the NPU, writing its slice of the Concat: nothing on the CPU.
    align_corners x2 rounds output 2y + 1 to y + (n-1-y)/(2n-1) < y + 0.5: it samples
    pixel y too."""
    report, got, want = build_and_run(tmp_path, _neck(64, modes), (1, 16, 12, 12), precision)
    assert [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"] == []
    assert report.conversions == 2, report.conversions
    assert cosine(got, want) >= THRESHOLD["fp16"]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_residual_made_by_a_later_conv_fuses_into_that_conv(tmp_path, precision):
    """Conv a -> Conv b, Conv c (both from a, b first) -> Add(b, c) -> ReLU: the Add's
    operand c does not exist yet when b runs, so the Add fuses into c's epilogue (it
    commutes), not b's (which read c before it was written)."""
    rng = np.random.default_rng(13)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a1", "w3"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = {"w1": rng.standard_normal((24, 8, 3, 3)) / 6, "w2": rng.standard_normal((16, 24, 3, 3)) / 10,
             "w3": rng.standard_normal((16, 24, 3, 3)) / 10}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 10, 12]), (1, 8, 10, 12), precision)
    assert [p.device for p in report.placements] == ["npu"] * 6
    (add,) = [p for p in report.placements if p.op.type == "Add"]
    assert add.reason == "fused into the epilogue of " + report.placements[3].op.describe(), add.reason
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_fused_residual_waits_for_its_operand_across_a_cpu_op(tmp_path, precision):
    """Conv p of x -> Concat(x, p) -> Conv c1; Conv c2 of x -> Add(c1, c2): the Add fuses
    into c2's epilogue, so c2 runs in c1's segment, after the Concat, not in the first
    segment with p (whose partition level it has alone): the group is one unit."""
    rng = np.random.default_rng(19)
    nodes = [helper.make_node("Conv", ["x", "wp"], ["p"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["x", "p"], ["joined"], axis=1),
             helper.make_node("Conv", ["joined", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "c2"], ["y"])]
    inits = {"wp": rng.standard_normal((16, 8, 3, 3)) / 8, "w1": rng.standard_normal((16, 24, 3, 3)) / 14,
             "w2": rng.standard_normal((16, 8, 3, 3)) / 8}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 12, 12]), (1, 8, 12, 12), precision)
    (add,) = [p for p in report.placements if p.op.type == "Add"]
    assert add.device == "npu", add.reason
    assert cosine(got, want) >= THRESHOLD[precision]


def _two_branch_block(w3_scale: float, branch_relus: bool):
    """Conv a -> Conv b, Conv c (b first) -> Add(b, c) -> ReLU, a ResNet projection
    block's shape; `branch_relus`: each branch ends in a ReLU (the Add then fuses
    into neither convolution)."""
    rng = np.random.default_rng(17)
    rb, rc = ("rb", "rc") if branch_relus else ("b", "c")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a1", "w3"], ["c"], pads=[1, 1, 1, 1])]
    if branch_relus:
        nodes += [helper.make_node("Relu", ["b"], ["rb"]), helper.make_node("Relu", ["c"], ["rc"])]
    nodes += [helper.make_node("Add", [rb, rc], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = {"w1": rng.standard_normal((24, 8, 3, 3)) / 6, "w2": rng.standard_normal((32, 24, 3, 3)) / 10,
             "w3": rng.standard_normal((32, 24, 3, 3)) * w3_scale}
    return graph_model(nodes, inits, [1, 8, 10, 12])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("w3_scale, branch_relus", [(1e-4, False), (0.1, True)])
def test_a_residual_add_no_conv_takes_runs_with_its_relu_on_the_npu(tmp_path, precision, w3_scale, branch_relus):
    """The Add of a residual block whose operand c's epilogue cannot take it (int8: b's
    scale over c's accumulator unit needs a left shift, as in onnx's light ResNet-50,
    whose constant weights make the shortcut tiny; or both branches end in a ReLU) is a
    standalone NPU Add with the ReLU in its own epilogue: nothing on the CPU."""
    report, got, want = build_and_run(tmp_path, _two_branch_block(w3_scale, branch_relus), (1, 8, 10, 12),
                                       precision)
    assert [p.device for p in report.placements] == ["npu"] * len(report.placements)
    add = next(p for p in report.placements if p.op.type == "Add")
    standalone = branch_relus or precision == "int8"  # fp16 has no scales: the Add fuses into c
    if standalone:
        assert add.reason == "all NPU constraints hold", add.reason
        assert report.placements[-1].reason == "fused into the epilogue of " + add.op.describe()
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_leaky_relu_folds_into_the_conv_epilogue(tmp_path, precision):
    """Conv -> LeakyReLU (YOLOv3/v4-tiny's activation) twice: BN's multiplier on negative
    values, nothing on the CPU; after a residual Add it stays on the CPU (BN runs before EW)."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c1"], ["a1"], alpha=0.1),
             helper.make_node("Conv", ["a1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c2"], ["y"])]  # ONNX's default alpha, 0.01
    inits = {"w1": rng.standard_normal((24, 8, 3, 3)) / 6, "b1": rng.standard_normal(24) * 0.1,
             "w2": rng.standard_normal((16, 24, 3, 3)) / 10}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 10, 12]), (1, 8, 10, 12), precision)
    assert [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"] == []
    assert cosine(got, want) >= THRESHOLD[precision]
    nodes[3:] = [helper.make_node("Conv", ["a1", "w3"], ["c2b"], pads=[1, 1, 1, 1]),
                 helper.make_node("Add", ["c2", "c2b"], ["s"]), helper.make_node("LeakyRelu", ["s"], ["y"])]
    inits["w3"] = rng.standard_normal((16, 24, 3, 3)) / 10
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 10, 12]), (1, 8, 10, 12), precision)
    assert [p.op.type for p in report.placements if p.device == "cpu"] == ["LeakyRelu"]
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("modes, scales", [
    ({"coordinate_transformation_mode": "half_pixel", "nearest_mode": "floor"}, (1, 1, 2, 2)),
    ({"coordinate_transformation_mode": "asymmetric", "nearest_mode": "round_prefer_ceil"}, (1, 1, 2, 2)),
    ({"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, (1, 1, 2.0001, 2.0001))],
    ids=["half_pixel_floor", "round_prefer_ceil", "scale_near_2"])
def test_other_nearest_resizes_stay_on_the_cpu(tmp_path, modes, scales):
    """Resizes that sample other pixels than y for outputs 2y, 2y+1 run on the CPU, and match onnxruntime."""
    report, got, want = build_and_run(tmp_path, _neck(32, modes, scales), (1, 16, 12, 12), "fp16")
    (resize,) = [p for p in report.placements if p.op.type == "Resize"]
    assert resize.device == "cpu" and "upsamples by an integer factor" in resize.reason, resize.reason
    assert cosine(got, want) >= THRESHOLD["fp16"]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_yolo_neck_upsample_of_few_channels_and_silu_stay_on_the_npu(tmp_path, precision):
    """PAN neck: conv + SiLU, nearest x2 Resize (16 channels, fewer than the depthwise
    writer fills: identity copies on the NPU), Concat with a finer map (a view),
    conv + SiLU. int8: the SiLU table is fp16-only (Q22), so the groups run in fp16 and
    nothing converts between them: only the model's input and output."""
    rng = np.random.default_rng(11)
    silu = [helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["a1"]),
            helper.make_node("Sigmoid", ["c3"], ["s3"]), helper.make_node("Mul", ["c3", "s3"], ["y"])]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]), *silu[:2],
             helper.make_node("Resize", ["a1", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["up", "x"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]), *silu[2:]]
    inits = {"w1": rng.standard_normal((16, 16, 3, 3)) / 6, "b1": rng.standard_normal(16) * 0.1,
             "w3": rng.standard_normal((16, 32, 3, 3)) / 8, "b3": rng.standard_normal(16) * 0.1,
             "scales": np.array([1, 1, 2, 2])}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 16, 12, 12]), (1, 16, 12, 12), precision)
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    assert report.conversions == 2, report.conversions
    assert cosine(got, want) >= THRESHOLD["fp16"]


@pytest.mark.parametrize("precision, c", [("fp16", 24), ("int8", 48)])
def test_fpn_upsamples_by_2_4_8_into_concat_slices(tmp_path, precision, c):
    """PP-OCR det's neck: maps of c channels (not whole depthwise or kernel groups) at 1/2,
    1/4, 1/8 resolution upsampled x2, x4, x8 (nearest, asymmetric + floor) into slices of
    one Concat with a full-resolution map, then a conv: every Resize on the NPU writing only
    its c channels (the Concat stays a view), against onnxruntime."""
    rng = np.random.default_rng(23)
    resize = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["d"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w1"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w3"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "s8"], ["c8"], **resize),
             helper.make_node("Resize", ["b", "", "s4"], ["b4"], **resize),
             helper.make_node("Resize", ["a", "", "s2"], ["a2"], **resize),
             helper.make_node("Concat", ["c8", "b4", "a2", "d"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w4"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w0": rng.standard_normal((c, 8, 3, 3)) / 8, "w1": rng.standard_normal((c, 8, 3, 3)) / 8,
             "w2": rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c), "w3": rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c),
             "w4": rng.standard_normal((8, 4 * c, 3, 3)) / np.sqrt(36 * c), **{f"s{k}": np.array([1.0, 1, k, k]) for k in (2, 4, 8)}}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 32, 32]), (1, 8, 32, 32), precision)
    assert [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"] == []
    assert [p.device for p in report.placements if p.op.type == "Concat"] == ["view"]
    assert cosine(got, want) >= THRESHOLD[precision]


def _db_head(c: int, mid: int, k: int):
    """PP-OCR det's head as exported: Conv + BN + Relu, then a learned k x k/k upsampling
    (ConvTranspose, its bias as an Add, BN, Relu) and another to one channel
    (ConvTranspose, Add, Sigmoid)."""
    rng = np.random.default_rng(c * 10 + k)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("ConvTranspose", ["r0", "w1"], ["t1"], kernel_shape=[k, k], strides=[k, k]),
             helper.make_node("Add", ["t1", "b1"], ["a1"]),
             helper.make_node("BatchNormalization", ["a1", "g", "beta", "mean", "var"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "w2"], ["t2"], kernel_shape=[k, k], strides=[k, k]),
             helper.make_node("Add", ["t2", "b2"], ["a2"]), helper.make_node("Sigmoid", ["a2"], ["y"])]
    inits = {"w0": rng.standard_normal((mid, c, 3, 3)) / np.sqrt(9 * c),
             "w1": rng.standard_normal((mid, mid, k, k)) / np.sqrt(mid), "b1": rng.standard_normal((1, mid, 1, 1)),
             "g": rng.uniform(0.5, 1.5, mid), "beta": rng.standard_normal(mid) * 0.1,
             "mean": rng.standard_normal(mid) * 0.1, "var": rng.uniform(0.5, 2, mid),
             "w2": rng.standard_normal((mid, 1, k, k)) / np.sqrt(mid), "b2": rng.standard_normal((1, 1, 1, 1))}
    return graph_model(nodes, inits, [1, c, 8, 10])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, mid, k", [(16, 24, 2), (8, 16, 3)])
def test_learned_upsampling_runs_on_the_npu(tmp_path, precision, c, mid, k):
    """A ConvTranspose whose stride is its kernel runs on the NPU as 1 x k windows and
    copies (compiler/npu/conv_transpose.py), its bias Add and BatchNorm folded in and its
    Relu / Sigmoid fused: nothing on the CPU, and the result matches onnxruntime."""
    report, got, want = build_and_run(tmp_path, _db_head(c, mid, k), (1, c, 8, 10), precision)
    assert [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"] == []
    assert [p.op.type for p in report.placements] == ["Conv", "Relu", "ConvTranspose", "Relu", "ConvTranspose",
                                                      "Sigmoid"]
    # in int8 the first upsampling computes in int8; the second, with its table, in fp16
    assert [p.dtype for p in report.placements][2::2] == (["int8", "fp16"] if precision == "int8" else ["fp16"] * 2)
    assert cosine(got, want) >= THRESHOLD[precision]


def test_other_transposed_convolutions_stay_on_the_cpu(tmp_path):
    """Overlapping windows (stride below the kernel) or padding: the CPU computes them."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])]
    report, got, want = build_and_run(tmp_path, graph_model(nodes, {"w": rng.standard_normal((8, 4, 3, 3))},
                                                             [1, 8, 6, 6]), (1, 8, 6, 6), "fp16")
    (placed,) = report.placements
    assert placed.device == "cpu" and "stride equals its square kernel" in placed.reason
    assert cosine(got, want) >= THRESHOLD["fp16"]


@pytest.mark.parametrize("axis", [0, 1])
def test_a_pre_quantized_conv_transpose_needs_scales_per_output_channel(tmp_path, axis):
    """int8 ConvTranspose weights from a QDQ model are requantized per output channel
    (weight axis 1); scales along the input channels (axis 0) leave it on the CPU, with
    the reason, and the result still matches onnxruntime."""
    rng = np.random.default_rng(21)
    c, o = 16, 8
    scale = rng.uniform(0.01, 0.02, (c, o)[axis]).astype(np.float32)
    shape = [1, 1, 1, 1]
    shape[axis] = -1
    wq = np.clip(np.rint(rng.standard_normal((c, o, 2, 2)) / 0.05 / scale.reshape(shape)), -127, 127)
    inits = [numpy_helper.from_array(wq.astype(np.int8), "wq"), numpy_helper.from_array(scale, "ws"),
             numpy_helper.from_array(np.zeros_like(scale, np.int8), "wz")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=axis),
             helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    report, got, want = build_and_run(tmp_path, model, (1, c, 6, 6), "int8")
    (ct,) = [p for p in report.placements if p.op.type == "ConvTranspose"]
    if axis == 1:
        assert ct.device == "npu" and ct.dtype == "int8", ct.reason
    else:
        assert ct.device == "cpu" and "axis 0" in ct.reason, ct.reason
    assert cosine(got, want) >= THRESHOLD["int8"]


def _few_row_chain(c: int, h: int, w: int, k: int, stride: int, pad: int, seed: int):
    """1x1 Conv + ReLU -> k x k depthwise over an h-row map + HardSwish -> 1x1 Conv,
    random weights from `seed` (PP-OCR cls's late blocks)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd", "bd"], ["cd"], group=c, pads=[pad] * 4, strides=[stride, 1]),
             helper.make_node("HardSwish", ["cd"], ["rd"]), helper.make_node("Conv", ["rd", "w2", "b2"], ["y"])]
    inits = {"w1": rng.standard_normal((c, 8, 1, 1)) / 3, "b1": rng.standard_normal(c) * 0.1,
             "wd": rng.standard_normal((c, 1, k, k)) / k, "bd": rng.standard_normal(c) * 0.1,
             "w2": rng.standard_normal((16, c, 1, 1)) / np.sqrt(c), "b2": rng.standard_normal(16) * 0.1}
    return graph_model(nodes, inits, [1, 8, h, w], opset=14)  # HardSwish: opset 14


@pytest.mark.parametrize("c, h, k, stride, pad", [
    (24, 3, 5, 1, 2), (40, 2, 5, 1, 2), (19, 3, 5, 2, 2), (32, 3, 3, 1, 1), (48, 2, 3, 2, 2), (16, 1, 5, 1, 4),
    (16, 2, 3, 1, 1), (24, 1, 5, 1, 2), (8, 1, 3, 2, 1)])
def test_depthwise_over_few_rows_reads_zero_rows_on_the_npu(tmp_path, c, h, k, stride, pad):
    """A depthwise window over a map of fewer than 4 rows (Q2) runs on the NPU over
    the map's stored zero rows (ir/npu/geometry.py) where its bottom padding covers
    them (pad >= 4 - h): the whole chain is one NPU segment. Otherwise it stays on the
    CPU, on the fp16 maps between its segments: no conversion around it either way.
    Two runs: the second reads zero rows that the first run's tensors left alone."""
    from rkc import runtime

    model = _few_row_chain(c, h, 40, k, stride, pad, c + h + k)
    report, got, want = build_and_run(tmp_path, model, (1, 8, h, 40), "fp16")
    on_npu = pad >= 4 - h
    cpu = [(p.op.type, p.reason) for p in report.placements if p.device == "cpu"]
    assert [t for t, _ in cpu] == ([] if on_npu else ["Conv"]), cpu
    assert on_npu or "more output rows than the map" in cpu[0][1] or "at least 4" in cpu[0][1], cpu
    assert report.conversions == 2, report.conversions  # the model's input and output only
    assert cosine(got, want) >= THRESHOLD["fp16"]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    with runtime.load(tmp_path / "m.rkbin") as m:
        x = np.random.default_rng(7).standard_normal((1, 8, h, 40)).astype(np.float32)
        first, again = m.run({"x": x})["y"], m.run({"x": x})["y"]
    np.testing.assert_array_equal(first, again)


def test_maps_with_zero_rows_keep_their_bytes_for_the_whole_program(tmp_path):
    """The memory plan lends no byte of a map a window reads over its zero rows to
    another tensor, at any step (module_builder.py): no write ever lands in its zero
    rows. Maps of few rows nothing reads that way are planned as any other."""
    from rkc.ir.npu import geometry
    from rkc.ir.rkbin import read_rkbin

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 1]),  # 6 rows -> 3
             helper.make_node("Conv", ["c1", "wd"], ["d1"], group=32, pads=[2] * 4),
             helper.make_node("Relu", ["d1"], ["r1"]), helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Conv", ["c2", "wd2"], ["d2"], group=32, pads=[1] * 4),
             helper.make_node("Add", ["d2", "c2"], ["a"]), helper.make_node("Conv", ["a", "w3"], ["y"])]
    rng = np.random.default_rng(3)
    inits = {"w1": rng.standard_normal((32, 8, 1, 1)), "wd": rng.standard_normal((32, 1, 5, 5)) / 5,
             "w2": rng.standard_normal((32, 32, 1, 1)) / 6, "wd2": rng.standard_normal((32, 1, 3, 3)) / 3,
             "w3": rng.standard_normal((8, 32, 1, 1)) / 6}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 6, 24]), (1, 8, 6, 24), "fp16")
    assert all(p.device == "npu" for p in report.placements), [p.reason for p in report.placements]
    assert cosine(got, want) >= THRESHOLD["fp16"]
    scratch = [t for t in read_rkbin(tmp_path / "m.rkbin").module.tensors if t.region == "scratch"]
    few = {t.name for t in scratch if geometry.zero_rows(t.shape, t.layout)}
    assert {"c1@npu", "r1@npu", "c2@npu", "a@npu"} <= few, few
    kept = [t for t in scratch if t.name in ("c1@npu", "c2@npu")]  # the depthwise windows' inputs
    assert len(kept) == 2
    for t in kept:
        for other in scratch:
            overlap = other.offset < t.offset + t.nbytes and t.offset < other.offset + other.nbytes
            assert other is t or not overlap, (t.name, other.name)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_shufflenet_stride_two_unit_runs_on_the_npu(tmp_path, precision):
    """ShuffleNet v1's stride-2 unit (a pad-excluding 3x3/2 AveragePool beside a 3x3/2
    Conv, concatenated, then a Relu): the Relu moves onto the Conv's epilogue (the pool
    of a Relu's output is >= 0 already), the Concat is slices of one buffer, the pool
    runs on the NPU: nothing on the CPU, against onnxruntime."""
    nodes, inits = shufflenet_unit(32, 9)  # whole int8 kernel groups: no piece writes into the next
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 3, 12, 12]), (1, 3, 12, 12),
                                      precision)
    cpu = [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"]
    assert not cpu, cpu
    assert [p.device for p in report.placements if p.op.type == "Concat"] == ["view"]
    assert cosine(got, want) >= THRESHOLD[precision]


def _conv_beside_pool(c: int, ca: int, conv_first: bool, seed: int):
    """Relu(Conv 1x1, c channels) -> [3x3/2 Conv to `ca` channels, 3x3/2 AveragePool],
    concatenated (the conv's piece first), then a 1x1 Conv: `conv_first` orders the two
    producers in the graph, hence in the segment's jobs."""
    rng = np.random.default_rng(seed)
    producers = [helper.make_node("Conv", ["r0", "wa", "ba"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
                 helper.make_node("AveragePool", ["r0"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1], count_include_pad=1)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"]), helper.make_node("Relu", ["c0"], ["r0"]),
             *(producers if conv_first else producers[::-1]),
             helper.make_node("Concat", ["a", "p"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w1"], ["y"])]
    inits = {"w0": rng.standard_normal((c, 3, 1, 1)), "b0": rng.standard_normal(c) * 0.1,
             "wa": rng.standard_normal((ca, c, 3, 3)) / (3 * c ** 0.5), "ba": rng.standard_normal(ca) * 0.1,
             "w1": rng.standard_normal((16, ca + c, 1, 1)) / (ca + c) ** 0.5}
    return nodes, inits


@pytest.mark.parametrize("precision, c, ca", [("fp16", 16, 24), ("fp16", 40, 136), ("fp16", 24, 8),
                                              ("int8", 32, 48), ("int8", 16, 16)])
@pytest.mark.parametrize("conv_first", [True, False])
def test_a_concat_piece_whose_padding_spills_into_the_next_slice(tmp_path, precision, c, ca, conv_first):
    """A conv writes whole kernel groups (16 fp16, 32 int8 channels): of 8 mod 16 fp16 (16
    mod 32 int8) channels, its padding lands in the next slice of the Concat. The Concat stays slices of one buffer
    when the next piece's producer runs later in the segment (its jobs overwrite them,
    ModuleBuilder.spill_covered); written before, the Concat is a gather. Against onnxruntime."""
    nodes, inits = _conv_beside_pool(c, ca, conv_first, c + ca)
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 3, 13, 11]), (1, 3, 13, 11),
                                      precision)
    cpu = [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"]
    concat = [p.device for p in report.placements if p.op.type == "Concat"]
    spills = ca % kernel_group_for(1 if precision == "int8" else 2) != 0
    if conv_first or not spills:
        assert not cpu and concat == ["view"], cpu
    else:
        assert concat == ["cpu"], concat
    assert cosine(got, want) >= THRESHOLD[precision]
    tolerance = {"fp16": 0.02, "int8": 0.1}[precision] * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=tolerance)


def test_a_spilling_piece_with_another_reader_is_not_overwritten(tmp_path):
    """The conv whose padding would land in the pool's slice is also read by another op,
    which would then read the pool's values as that padding (a conv weighs them by zero,
    other readers need not): that Concat is a gather (the other one, of two maps read by
    nothing else, a view). Against onnxruntime."""
    nodes, inits = _conv_beside_pool(16, 24, True, 5)
    nodes[-1] = helper.make_node("Conv", ["cat", "w1"], ["joined"])
    nodes += [helper.make_node("Conv", ["a", "wz"], ["side"]), helper.make_node("Concat", ["joined", "side"], ["y"], axis=1)]
    inits["wz"] = np.random.default_rng(6).standard_normal((16, 24, 1, 1)) / 24 ** 0.5
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 3, 13, 11]), (1, 3, 13, 11), "fp16")
    concats = {p.op.outputs[0]: p.device for p in report.placements if p.op.type == "Concat"}
    assert concats == {"cat": "cpu", "y": "view"}, concats
    assert cosine(got, want) >= THRESHOLD["fp16"]


@pytest.mark.slow
def test_shufflenet_with_random_weights_has_no_concat_on_the_cpu(tmp_path):
    """onnx's light ShuffleNet, random weights, PPU pools: stage 3's Concat n64, whose first
    piece (a 136-channel fp16 conv) writes 144 channels, is slices of one buffer; only
    Flatten and Softmax run on the CPU. Logits against onnxruntime on the simulator."""
    from rkc import runtime
    from rkc.runtime.sim import Quirks, SimDevice

    path = light_with_random_weights("light_shufflenet", tmp_path / "shufflenet.onnx")
    if path is None:
        pytest.skip("onnx ships no light_shufflenet.onnx")
    x_name, y_name = "gpu_0/data_0", "gpu_0/softmax_1"
    rng = np.random.default_rng(1)
    options = BuildOptions(precision="int8", calib=tmp_path / "calib.npz", ppu_irq=True)
    np.savez(options.calib, **{x_name: rng.standard_normal((2, 1, 3, 224, 224)).astype(np.float32)})
    report = build(path, tmp_path / "m.rkbin", options)
    assert sorted(p.op.type for p in report.placements if p.device == "cpu") == ["Flatten", "Softmax"]
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=Quirks(completion_blocks=("DPU", "PPU")))) as m:
        assert not [s for s in m.module.programs[0].steps if s.op == "Relayout"]
        got = np.asarray(m.run({x_name: x})[y_name], np.float64).ravel()
    want = onnxruntime_outputs(path, {x_name: x})[y_name].astype(np.float64).ravel()
    # the output is a softmax: compare the logits up to a constant (log-probabilities)
    lg, lw = np.log(got) - np.log(got).mean(), np.log(want) - np.log(want).mean()
    assert cosine(lg, lw) >= THRESHOLD["fp16"]
    assert got.argmax() == want.argmax()
