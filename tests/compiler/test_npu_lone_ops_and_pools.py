"""Where the lone-op rule leaves an op between CPU ops, and pooling on the NPU
(average pools of one window, pad-excluding averages, int8 max pools between
int8 segments), checked end to end on the simulator against onnxruntime (fp16
and calibrated int8). Split from test_npu_coverage.py, whose fixture and bounds
these share."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_models import NPU_COSINE as THRESHOLD
from onnx_models import build_and_run, cosine, cpu_max_pools, graph_model, placements_by_output, sppf_like


@pytest.fixture(autouse=True)
def _max_pools_on_the_cpu(monkeypatch):
    """MaxPool stands for a CPU op here, as in test_npu_coverage.py."""
    cpu_max_pools(monkeypatch)


pytest.importorskip("rkc.runtime.sim")


def _pool(src: str, dst: str):
    """A CPU op (the module keeps max pools there) that keeps the map's shape."""
    return helper.make_node("MaxPool", [src], [dst], kernel_shape=[3, 3], pads=[1, 1, 1, 1])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_cheap_op_alone_between_cpu_ops_stays_on_the_cpu(tmp_path, precision):
    """An affine map and an element-wise Add whose inputs come from CPU ops and
    whose outputs go to CPU ops: converting in and out touches the same bytes the
    op does, so both stay on the CPU and no segment is made for them."""
    rng = np.random.default_rng(3)
    nodes = [_pool("x", "p1"), helper.make_node("Mul", ["p1", "s"], ["m"]), _pool("m", "p2"),
             _pool("x", "p3"), helper.make_node("Add", ["p2", "p3"], ["a"]), _pool("a", "y")]
    model = graph_model(nodes, {"s": rng.uniform(0.5, 2, (1, 8, 1, 1))}, [1, 8, 6, 9])
    report, got, want = build_and_run(tmp_path, model, (1, 8, 6, 9), precision)
    placed = placements_by_output(report)
    assert placed["m"][0] == placed["a"][0] == "cpu"
    assert placed["m"][1] == placed["a"][1] == "kept on the CPU: alone between CPU ops, the conversions would " \
                                                "cost more than it saves"
    assert report.segments == 0 and report.conversions == 0
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_cheap_ops_with_an_npu_neighbour_or_real_work_stay_on_the_npu(tmp_path, precision):
    """Not moved: an affine map feeding a convolution in its segment, a 3x3
    depthwise convolution (9 MACs per output) alone between CPU ops, an Add
    reading the model's own input, and an affine map with a fused ReLU alone
    between CPU ops (one pass on the NPU, two on the CPU: more bytes than the
    conversions it would save)."""
    rng = np.random.default_rng(4)
    nodes = [_pool("x", "p1"), helper.make_node("Mul", ["p1", "s"], ["m"]),
             helper.make_node("Conv", ["m", "w"], ["c"], pads=[1, 1, 1, 1]), _pool("c", "p2"),
             helper.make_node("Conv", ["p2", "dw"], ["d"], group=8, pads=[1, 1, 1, 1]), _pool("d", "p3"),
             helper.make_node("Add", ["p3", "x"], ["a"]), _pool("a", "p4"),
             helper.make_node("Mul", ["p4", "s"], ["m2"]), helper.make_node("Relu", ["m2"], ["r2"]), _pool("r2", "y")]
    inits = {"s": rng.uniform(0.5, 2, (1, 8, 1, 1)), "w": rng.standard_normal((8, 8, 3, 3)) / 8,
             "dw": rng.standard_normal((8, 1, 3, 3)) / 3}
    report, got, want = build_and_run(tmp_path, graph_model(nodes, inits, [1, 8, 6, 9]), (1, 8, 6, 9), precision)
    placed = placements_by_output(report)
    assert [placed[t][0] for t in ("m", "c", "d", "a", "m2", "r2")] == ["npu"] * 6, placed
    assert report.segments == 4
    assert cosine(got, want) >= THRESHOLD[precision]


def test_an_average_pool_alone_between_cpu_ops_stays_on_the_npu(tmp_path):
    """A 3x3 average pool does 9 operations per output: not memory-bound, so the
    lone-op rule leaves it on the NPU even between two CPU ops."""
    nodes = [_pool("x", "p1"), helper.make_node("AveragePool", ["p1"], ["a"], kernel_shape=[3, 3]), _pool("a", "y")]
    report, got, want = build_and_run(tmp_path, graph_model(nodes, {}, [1, 8, 9, 9]), (1, 8, 9, 9), "fp16")
    assert placements_by_output(report)["a"][0] == "npu"
    assert cosine(got, want) >= THRESHOLD["fp16"]


def _assert_one_window_pool_on_the_npu(tmp_path, precision: str, c: int, hw: int, **pool) -> None:
    """Conv -> Relu -> an AveragePool (`pool`: its attributes) whose one window covers the map:
    all three on the NPU, a [1, C, 1, 1] result, onnxruntime's within the precision's cosine."""
    rng = np.random.default_rng(c + hw)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["y"], **pool)]
    model = graph_model(nodes, {"w": rng.standard_normal((c, 6, 1, 1)) / 3}, [1, 6, hw, hw])
    report, got, want = build_and_run(tmp_path, model, (1, 6, hw, hw), precision)
    assert [p.device for p in report.placements] == ["npu"] * 3, [p.reason for p in report.placements]
    assert got.shape == (1, c, 1, 1)
    assert cosine(got, want) >= THRESHOLD[precision]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, hw, kernel, stride, pads", [(64, 7, 7, 1, 0), (40, 7, 7, 7, 0), (24, 5, 5, 2, 0),
                                                          (16, 4, 6, 1, 1), (8, 8, 8, 8, 0)])
def test_average_pool_of_one_window_runs_on_the_npu(tmp_path, precision, c, hw, kernel, stride, pads):
    """An AveragePool whose one window covers the map (ResNet's 7x7 head): its
    [1, C, 1, 1] result is a GEMM row of 4 stored rows, made as a global pool's is."""
    _assert_one_window_pool_on_the_npu(tmp_path, precision, c, hw, kernel_shape=[kernel] * 2,
                                       strides=[stride] * 2, pads=[pads] * 4, count_include_pad=1)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, hw, kernel, pads", [(64, 6, 7, [0, 0, 1, 1]), (24, 5, 7, [1, 1, 1, 1]),
                                                 (40, 7, 8, [1, 0, 0, 1])])
def test_average_pool_of_one_window_excluding_its_padding_runs_on_the_npu(tmp_path, precision, c, hw, kernel, pads):
    """count_include_pad 0 with one window over the whole map (Inception v1's 7x7 pool
    of a 6x6 map padded at the end): the mean of the map, a global pool."""
    _assert_one_window_pool_on_the_npu(tmp_path, precision, c, hw, kernel_shape=[kernel] * 2, pads=pads)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c, hw, kernel, stride, pads, ceil", [(24, 14, 3, 2, [1, 1, 1, 1], 0),
                                                               (40, 9, 3, 1, [1, 1, 1, 1], 0),
                                                               (19, 11, 3, 2, [0, 1, 1, 0], 1)])
def test_average_pool_excluding_its_padding_runs_on_the_npu(tmp_path, precision, c, hw, kernel, stride, pads, ceil):
    """count_include_pad 0 over windows that padding clips (ShuffleNet's 3x3/2, Inception
    v2's 3x3/1; a ceil-mode overhang): window sums times a constant map of 1/count on the
    NPU, nothing on the CPU, against onnxruntime."""
    rng = np.random.default_rng(c + hw)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                              pads=pads, ceil_mode=ceil)]
    model = graph_model(nodes, {"w": rng.standard_normal((c, 6, 1, 1)) / 3}, [1, 6, hw, hw])
    report, got, want = build_and_run(tmp_path, model, (1, 6, hw, hw), precision)
    assert [p.device for p in report.placements] == ["npu"] * 3, [p.reason for p in report.placements]
    assert cosine(got, want) >= THRESHOLD[precision]


def test_int8_average_pool_whose_divisors_have_no_common_scale_stays_on_the_cpu(tmp_path):
    """5x5 windows clipped by 2 of padding count 9 to 25 positions: fp16 multiplies by
    1/count on the NPU; int8 has no exact common scale for the map (3600 steps), so the
    pool stays on the CPU and says why."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[5, 5], pads=[2, 2, 2, 2])]
    model = graph_model(nodes, {"w": rng.standard_normal((16, 6, 1, 1)) / 3}, [1, 6, 8, 8])
    report, got, want = build_and_run(tmp_path, model, (1, 6, 8, 8), "fp16")
    assert report.placements[-1].device == "npu" and cosine(got, want) >= THRESHOLD["fp16"]
    report, got, want = build_and_run(tmp_path, model, (1, 6, 8, 8), "int8")
    assert report.placements[-1].device == "cpu" and "common int8 scale" in report.placements[-1].reason
    assert cosine(got, want) >= THRESHOLD["int8"]


@pytest.mark.parametrize("c, hw", [(16, 12), (24, 17)])
def test_int8_max_pools_run_on_the_npu_codes_without_conversions(tmp_path, c, hw):
    """A CPU MaxPool between int8 NPU segments pools the int8 codes in place (its
    output keeps its input's scale): the only conversions left are the model's
    input and output, through a strided pool and an SPPF-like chain of three."""
    report, got, want = build_and_run(tmp_path, sppf_like(c, hw, c), (1, 3, hw, hw), "int8")
    assert [p.op.type for p in report.placements if p.device == "cpu"] == ["MaxPool"] * 4
    assert report.conversions == 2, report.conversions
    assert cosine(got, want) >= THRESHOLD["int8"]
