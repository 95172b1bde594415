"""--precision int8 end to end on the simulator: convolutions and matrix products
run on the NPU in int8 and match the integer model of the same quantization
(compiler/fakequant.py) to a step; mixed precision keeps low-SQNR groups in fp16."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.compiler.fakequant import run_fake_quant
from rkc.compiler.frontend import load_graph
from rkc.compiler.passes import run_passes
from rkc.compiler.placement import place_ops
from rkc.compiler.quantize import quantize
from onnx_models import cosine, onnxruntime_outputs, save


def conv_model(rng, c=16, o=24, dead=(), hw=12) -> onnx.ModelProto:
    """x -> Conv3x3(+bias) -> ReLU6 -> Conv1x1(+bias) -> + residual Conv1x1 -> y;
    output channels in `dead` of the first conv have weights ~1e-10 and a bias
    (what BatchNorm folding leaves of a pruned channel)."""
    w1 = rng.standard_normal((o, c, 3, 3)).astype(np.float32) * 0.2
    w1[list(dead)] = 1e-10
    b1 = rng.standard_normal(o).astype(np.float32)
    w2 = rng.standard_normal((o, o, 1, 1)).astype(np.float32) * 0.2
    w3 = rng.standard_normal((o, o, 1, 1)).astype(np.float32) * 0.2
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["h1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["h2"]),
             helper.make_node("Conv", ["h2", "w3"], ["h3"]),
             helper.make_node("Add", ["h3", "h2"], ["y"])]
    inits = [numpy_helper.from_array(v, n) for n, v in
             (("w1", w1), ("b1", b1), ("lo", np.float32(0)), ("hi", np.float32(6)), ("w2", w2), ("b2", rng.standard_normal(o).astype(np.float32)), ("w3", w3))]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, hw, hw])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _build(tmp_path, model, calib):
    path = save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=calib)
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision="int8", calib=tmp_path / "calib.npz",
                                                             int8_only=True))
    return path, report


def test_int8_convolutions_run_on_the_npu_and_match_the_integer_model(tmp_path):
    """Per-channel int8 weights on the NPU, dead channels included (their tiny
    scales used to round the BS multiplier to 1: outputs 100+ steps off)."""
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((4, 1, 16, 12, 12)).astype(np.float32)
    path, report = _build(tmp_path, conv_model(rng, dead=(3, 17)), calib)
    convs = [p for p in report.placements if p.op.type == "Conv"]
    assert convs and all(p.device == "npu" and p.dtype == "int8" for p in convs), \
        [(p.op.name, p.device, p.reason) for p in convs]
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", "sim") as model:
        got = model.run({"x": x})["y"]
    g = quantize(run_passes(load_graph(path)), "int8", tmp_path / "calib.npz")
    _, groups = place_ops(g, "int8")
    want = run_fake_quant(g, groups, {"x": x})["y"]
    step = g.tensors["y"].type.quant.scale
    assert np.abs(got - want).max() <= 1.01 * step
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= 0.999


def test_mixed_precision_keeps_a_low_sqnr_group_in_fp16(tmp_path):
    """An input whose calibrated range is set by rare extreme values leaves the
    first convolution a coarse int8 input step: its measured SQNR is below the
    threshold, so it runs in fp16 on the NPU. The int8 run after it then goes fp16
    too: on these small maps fp16 adds less NPU time than the int8/fp16 crossing
    costs the host (compiler/mixed_precision.merge_islands), so one fp16 segment."""
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((4, 1, 16, 12, 12)).astype(np.float32)
    calib[:, 0, 0, 0, 0] = 400.0  # one extreme pixel per sample
    path, report = _build(tmp_path, conv_model(rng), calib)
    by_name = {p.op.outputs[0]: p for p in report.placements}
    assert by_name["h1"].dtype == "fp16" and "SQNR" in by_name["h1"].reason, by_name["h1"].reason
    for name in ("h2", "h3"):
        assert by_name[name].dtype == "fp16" and "crossings" in by_name[name].reason, by_name[name].reason
    assert by_name["y"].device == "npu" and report.segments == 1 and report.conversions == 2
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", "sim") as model:
        got = model.run({"x": x})["y"]
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= 0.999


def test_a_mixed_program_crosses_int8_and_fp16_through_the_host(tmp_path, monkeypatch):
    """The same model with the crossings not weighed (merge_islands keeps every
    int8 group, and the mixed plan is not weighed against fp16 throughout): an
    fp16 segment, then int8 segments, the int8/fp16 edges run by the host between
    them; the result still matches onnxruntime. (With the weighing, small maps
    like these go fp16 whole, and so does PP-OCR det: this keeps the crossing
    path covered.)"""
    import rkc.compiler.build as build_module

    monkeypatch.setattr(build_module, "merge_islands", lambda *args, **kwargs: {})
    monkeypatch.setattr(build_module, "whole_fp16_wins", lambda *args, **kwargs: "")
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((4, 1, 16, 12, 12)).astype(np.float32)
    calib[:, 0, 0, 0, 0] = 400.0
    path, report = _build(tmp_path, conv_model(rng), calib)
    by_name = {p.op.outputs[0]: p for p in report.placements}
    assert by_name["h1"].dtype == "fp16" and by_name["h2"].dtype == by_name["h3"].dtype == "int8"
    assert by_name["y"].device == "npu" and report.segments >= 2
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", "sim") as model:
        got = model.run({"x": x})["y"]
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= 0.999


@pytest.mark.parametrize("shape,kind", [((1, 192, 1, 1), "native"), ((1, 16, 4, 4), "native"), ((3, 32), "native-gemm")])
def test_reading_an_npu_tensor_copies_it_out_of_the_buffer(shape, kind):
    """What the runtime reads back from a BO is the CPU's own array: a dense
    feature map used to come back as a view of the BO, which later NPU steps
    (memory-plan reuse) overwrote under the reader."""
    from rkc.ir.npu import geometry

    value = np.arange(np.prod(shape)).reshape(shape).astype(np.int8)
    raw = geometry.pack(value, kind).reshape(-1).view(np.uint8)
    got = geometry.unpack(raw, shape, kind, np.dtype(np.int8))
    np.testing.assert_array_equal(got, value)
    assert not np.shares_memory(got, raw)


def test_int8_layers_tool_finds_no_arithmetic_difference(tmp_path, capsys):
    """tools/int8_layers.py: every NPU group of a small int8 build within one step of
    the integer model (the column that would show a lowering/emitter/simulator bug)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import int8_layers

    rng = np.random.default_rng(2)
    path = save(conv_model(rng, dead=(5,)), tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((4, 1, 16, 12, 12)).astype(np.float32))
    np.savez(tmp_path / "in.npz", x=rng.standard_normal((1, 16, 12, 12)).astype(np.float32))
    assert int8_layers.main([str(path), "--calib", str(tmp_path / "calib.npz"), "--inputs", str(tmp_path / "in.npz"),
                             "--out", str(tmp_path / "m.rkbin")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:] if not line.startswith("output")]
    assert len(rows) == 3 and all(r[2] == "int8" and r[3] == "0" and int(r[4]) <= 1 for r in rows), rows
