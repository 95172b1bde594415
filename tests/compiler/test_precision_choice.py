"""The precision plan (compiler/build.plan): a calibrated int8 build is weighed
against the whole program in fp16 with the NPU time its segments will really take
(emitter_ops.plan_npu_seconds, the figure `rkc inspect` then reports), and is built
in fp16 only where that models faster."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rkc.compiler.build import BuildOptions, build, plan
from rkc.compiler.emitter_ops import plan_npu_seconds
from rkc.compiler.inspect import figures
from rkc.ir.rkbin import read_rkbin
from onnx_models import graph_model, save


def _chain(c: int, hw: int, layers: int, seed: int):
    """`layers` 1x1 convolutions with ReLU: row-local, so fp16 chains them on each core."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], {}, "x"
    for i in range(layers):
        inits[f"w{i}"] = rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)
        y = "y" if i == layers - 1 else f"t{i}"
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [y])]
        x = y
    return graph_model(nodes, inits, (1, c, hw, hw)), (1, c, hw, hw)


def _int8(tmp_path, model, shape) -> BuildOptions:
    options = BuildOptions(precision="int8", calib=tmp_path / "calib.npz")
    np.savez(options.calib, x=np.random.default_rng(1).standard_normal((2, *shape)).astype(np.float32))
    save(model, tmp_path / "m.onnx")
    return options


@pytest.mark.parametrize("precision, layers, c, hw", [("fp16", 6, 32, 24), ("int8", 2, 256, 56)])
def test_the_plans_npu_time_is_the_built_programs(tmp_path, precision, layers, c, hw):
    """fp16 (chained kicks) and int8 (a kick per task) alike."""
    model, shape = _chain(c, hw, layers, 0)
    options = _int8(tmp_path, model, shape) if precision == "int8" else BuildOptions(precision="fp16")
    save(model, tmp_path / "m.onnx")
    graph, placements, groups, planned, _ = plan(tmp_path / "m.onnx", options)
    report = build(tmp_path / "m.onnx", tmp_path / "m.rkbin", options)
    assert planned == report.precision == precision
    built = figures(read_rkbin(tmp_path / "m.rkbin").module)["programs"]["main"]["modelled_npu_s"]
    assert built > 0 and abs(plan_npu_seconds(graph, placements, groups) - built) < 1e-9


def test_a_kick_bound_int8_build_gets_fp16_and_says_why(tmp_path):
    model, shape = _chain(32, 24, 6, 1)  # 6 layers of ~20 KB: int8 pays a kick per task
    report = build(tmp_path / "m.onnx", tmp_path / "m.rkbin", _int8(tmp_path, model, shape))
    assert report.precision == "fp16"
    assert "int8 plan models" in report.precision_note and "more accurate" in report.precision_note


def test_a_byte_bound_int8_build_stays_int8(tmp_path):
    model, shape = _chain(256, 56, 1, 2)  # one layer, 0.8 MB of int8 map: fp16 doubles the bytes
    report = build(tmp_path / "m.onnx", tmp_path / "m.rkbin", _int8(tmp_path, model, shape))
    assert report.precision == "int8" and not report.precision_note


def test_a_product_left_on_the_cpu_is_priced_by_its_multiply_adds(tmp_path):
    """The host side of the weighing counts a CPU convolution's multiply-adds, not only
    the elements it touches (SqueezeNet's last convolution, refused in fp16)."""
    from rkc.compiler.cost import op_macs
    from rkc.compiler.mixed_precision import HOST_S_PER_MAC, host_steps, program_seconds

    def cpu_products(placed) -> list[str]:
        return [s.op for s in host_steps(graph, placed) if s.what == "cpu" and s.op == "Conv"]

    model, shape = _chain(64, 16, 2, 3)
    save(model, tmp_path / "m.onnx")
    graph, placements, groups, _, _ = plan(tmp_path / "m.onnx", BuildOptions(precision="fp16"))
    assert cpu_products(placements) == []  # every convolution on the NPU
    convs = [p for p in placements if p.op.type == "Conv"]
    moved = [type(p)(**{**vars(p), "device": "cpu"}) if p is convs[0] else p for p in placements]
    assert cpu_products(moved) == ["Conv"] and op_macs(graph, convs[0].op) == 64 * 64 * 16 * 16
    npu_seconds = lambda *_: 0.0  # noqa: E731  (the host side alone)
    _, host_before = program_seconds(graph, placements, groups, npu_seconds=npu_seconds)
    _, host_after = program_seconds(graph, moved, groups, npu_seconds=npu_seconds)
    assert host_after - host_before >= 64 * 64 * 16 * 16 * HOST_S_PER_MAC
