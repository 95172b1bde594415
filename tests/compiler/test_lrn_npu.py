"""LRN on the NPU inside a CNN (compiler/npu/lrn.py), end to end on the simulator
against onnxruntime: fp16 in an int8 program (its power is a lookup table), the
table's range from the input's calibration."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from onnx_models import (NPU_COSINE, build_and_run, cosine, graph_model, light_with_random_weights, onnxruntime_outputs,
                         save)

pytest.importorskip("rkc.runtime.sim")
THRESHOLD = NPU_COSINE


def _conv_lrn_conv(alpha: float, seed: int):
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("LRN", ["r1"], ["n1"], size=5, alpha=alpha, beta=0.75, bias=1.0),
             helper.make_node("Conv", ["n1", "w2"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w1": rng.standard_normal((24, 8, 3, 3)) / 3, "b1": rng.standard_normal(24) * 0.1,
             "w2": rng.standard_normal((16, 24, 3, 3)) / 10}
    return graph_model(nodes, inits, [1, 8, 12, 16])


@pytest.mark.parametrize("alpha", [1e-4, 0.05])
def test_lrn_of_a_calibrated_int8_program_runs_on_the_npu_in_fp16(tmp_path, alpha):
    report, got, want = build_and_run(tmp_path, _conv_lrn_conv(alpha, 3), (1, 8, 12, 16), "int8")
    lrn = next(p for p in report.placements if p.op.type == "LRN")
    assert lrn.device == "npu", lrn.reason
    assert [p.op.describe() for p in report.placements if p.device == "cpu"] == []
    assert cosine(got, want) >= THRESHOLD["int8"]  # the LRN alone: tests/npu/test_emit_lrn.py


def test_lrn_without_a_calibrated_range_stays_on_the_cpu(tmp_path):
    report, got, want = build_and_run(tmp_path, _conv_lrn_conv(1e-4, 4), (1, 8, 12, 16), "fp16")
    lrn = next(p for p in report.placements if p.op.type == "LRN")
    assert lrn.device == "cpu" and "range is unknown" in lrn.reason
    assert cosine(got, want) >= THRESHOLD["fp16"]


def test_an_int8_plan_made_mixed_by_its_lrn_is_weighed_against_fp16_throughout(tmp_path):
    """No group's SQNR asks for fp16, but the LRN and what reads it run in fp16: the plan
    is mixed, so it is weighed against the whole program in fp16, whose LRN takes its
    range from the int8 build's calibration."""
    from rkc.compiler.build import plan

    path = save(_conv_lrn_conv(1e-4, 5), tmp_path / "m.onnx")
    options = BuildOptions(precision="int8", calib=tmp_path / "calib.npz")
    np.savez(options.calib, x=np.random.default_rng(1).standard_normal((4, 1, 8, 12, 16)).astype(np.float32))
    weighed = []

    def stage(name, fn, *args):
        result = fn(*args)
        if name == "mixed precision: whole program":
            weighed.append(result)
        elif name == "fp16 throughout: place":
            placed = {p.op.type: p.device for p in result[0]}
            assert placed["LRN"] == "npu"
        return result

    plan(path, options, stage)
    assert len(weighed) == 1


def test_an_int8_plan_made_mixed_by_its_lrn_weighs_the_crossings_around_it(tmp_path):
    """The LRN's fp16 group makes its int8 neighbours cross through the host (ZFNet's
    first convolution: a 96x110x110 map dequantized and cast back, ~1 ms): the crossings
    are weighed as for the SQNR rule's groups, and the convolutions go fp16 where that
    is cheaper."""
    from rkc.compiler.build import plan

    path = save(_conv_lrn_conv(1e-4, 6), tmp_path / "m.onnx")
    options = BuildOptions(precision="int8", calib=tmp_path / "calib.npz")
    np.savez(options.calib, x=np.random.default_rng(2).standard_normal((4, 1, 8, 12, 16)).astype(np.float32))
    merged = []

    def stage(name, fn, *args):
        result = fn(*args)
        if name == "mixed precision: crossings":
            merged.append(result)
        return result

    placed = plan(path, options, stage).placements
    assert len(merged) == 1 and merged[0]
    convs = [p for p in placed if p.op.type == "Conv"]
    assert all(p.dtype == "fp16" for p in convs) and "crossings removed" in convs[0].reason


def _random_inception(tmp_path):
    path = light_with_random_weights("light_inception_v1", tmp_path / "inception.onnx")
    if path is None:
        pytest.skip("onnx ships no light_inception_v1.onnx")
    return path


@pytest.mark.slow
def test_inception_v1_with_random_weights_runs_its_lrns_and_pools_on_the_npu(tmp_path):
    from rkc.runtime.sim import Quirks, SimDevice

    path = _random_inception(tmp_path)
    rng = np.random.default_rng(1)
    options = BuildOptions(precision="int8", calib=tmp_path / "calib.npz", ppu_irq=True)
    np.savez(options.calib, data_0=rng.standard_normal((2, 1, 3, 224, 224)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", options)
    assert sorted(p.op.type for p in report.placements if p.device == "cpu") == ["Flatten", "Softmax"]
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=Quirks(completion_blocks=("DPU", "PPU")))) as m:
        got = np.asarray(m.run({"data_0": x})["prob_1"], np.float64).ravel()
    want = onnxruntime_outputs(path, {"data_0": x})["prob_1"].astype(np.float64).ravel()
    # the output is a softmax: compare the logits up to a constant (log-probabilities)
    lg, lw = np.log(got) - np.log(got).mean(), np.log(want) - np.log(want).mean()
    assert cosine(lg, lw) >= THRESHOLD["int8"]
    assert got.argmax() == want.argmax()
