"""fp16 MaxPool on the PPU, only for a kernel that completes PPU tasks
(`rkc compile --kernel-ppu-irq`, kernel/patches/0005): end to end on the
simulator against onnxruntime, with the simulator modelling that kernel
(completion on the DPU or PPU interrupt); stock kernels refuse to load such an
rkbin. Without the PPU (stock rocket, int8 maps: Q14) max pools run on the DPU
(one-hot depthwise convolutions keeping the element-wise max) and load anywhere."""

from __future__ import annotations

import numpy as np
import pytest

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.compiler.driver import OPTIONS, compile_model
from rkc.ir.errors import RkcError
from rkc.ir.program import PPU_COMPLETION_KEY
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.quirks import DEFAULT, Quirks
from onnx import helper

from onnx_models import cosine, graph_model, onnxruntime_outputs, save, sppf_like

FP16_COSINE = 0.9995  # the fp16 bound of tests/compiler/test_npu_coverage.py
INT8_COSINE = 0.995  # its int8 bound

PATCHED = Quirks(completion_blocks=("DPU", "PPU"))  # what a rocket 1.3 kernel completes on


@pytest.mark.parametrize("c, hw", [(16, 12), (24, 17)])
def test_fp16_max_pools_run_on_the_ppu_and_match_onnxruntime(tmp_path, c, hw):
    path = save(sppf_like(c, hw, c), tmp_path / "m.onnx")
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16", ppu_irq=True))
    pools = [p for p in report.placements if p.op.type == "MaxPool"]
    assert [p.device for p in pools] == ["npu"] * 4, [p.reason for p in pools]
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    x = np.random.default_rng(c + 1).standard_normal((1, 3, hw, hw)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=PATCHED)) as m:
        assert m.module.metadata[PPU_COMPLETION_KEY] is True
        got = m.run({"x": x})["y"]
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= FP16_COSINE


def _host_dear(monkeypatch):
    """The CPU's max pool modelled far dearer than any DPU taps: the compiler then takes them."""
    from rkc.compiler import cost

    monkeypatch.setattr(cost, "MAX_POOL_HOST_S", {"int8": (1.0, 0.0), "fp16": (1.0, 0.0)})


@pytest.mark.parametrize("precision, dear", [("fp16", False), ("int8", True)])
def test_stock_kernel_runs_max_pools_on_the_dpu(tmp_path, monkeypatch, precision, dear):
    """fp16 pools of small maps: DPU taps (chained) model less NPU time than the CPU kernel
    costs the host; int8 taps (one kick each) never do on these figures, so the int8 run
    takes them by a dearer host model, to check the lowering end to end."""
    if dear:
        _host_dear(monkeypatch)
    path = save(sppf_like(16, 12, 3), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(5).standard_normal((4, 1, 3, 12, 12)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision=precision, calib=calib, int8_only=True))
    pools = [p for p in report.placements if p.op.type == "MaxPool"]
    assert [(p.device, p.dtype) for p in pools] == [("npu", precision)] * 4, [p.reason for p in pools]
    assert not report.ppu
    x = np.random.default_rng(4).standard_normal((1, 3, 12, 12)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=DEFAULT)) as m:
        assert PPU_COMPLETION_KEY not in m.module.metadata
        got = m.run({"x": x})["y"]
    bound = FP16_COSINE if precision == "fp16" else INT8_COSINE
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= bound


@pytest.mark.parametrize("ppu_irq", [False, True])
def test_int8_max_pools_stay_on_the_cpu_where_dpu_taps_cost_more(tmp_path, monkeypatch, ppu_irq):
    """int8 pools: the PPU pools fp16 only (Q14), and DPU taps (a kick per task) model more NPU
    time than the CPU kernel takes, so they stay on the CPU, saying why; with the CPU modelled
    dearer they run as DPU taps, never on the PPU (the rkbin loads on a stock kernel)."""
    path = save(sppf_like(16, 12, 4), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(5).standard_normal((4, 1, 3, 12, 12)).astype(np.float32))
    options = BuildOptions(precision="int8", calib=calib, ppu_irq=ppu_irq, int8_only=True)
    report = build(path, tmp_path / "m.rkbin", options)
    pools = [p for p in report.placements if p.op.type == "MaxPool"]
    assert [p.device for p in pools] == ["cpu"] * 4
    assert all("max pooling as DPU taps" in p.reason and "ms of NPU time" in p.reason for p in pools)
    _host_dear(monkeypatch)
    report = build(path, tmp_path / "d.rkbin", options)
    assert [(p.device, p.dtype) for p in report.placements if p.op.type == "MaxPool"] == [("npu", "int8")] * 4
    assert not report.ppu


def _silu(x: str, y: str) -> list:
    return [helper.make_node("Sigmoid", [x], [f"{y}.s"]), helper.make_node("Mul", [x, f"{y}.s"], [y])]


def sppf_silu(c: int, hw: int, seed: int):
    """YOLOv8's SPPF: Conv+SiLU -> three chained 5x5 MaxPools -> Concat of the four -> Conv+SiLU."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), *_silu("c1", "a1"),
             *[helper.make_node("MaxPool", [a], [b], kernel_shape=[5, 5], pads=[2, 2, 2, 2])
               for a, b in (("a1", "m1"), ("m1", "m2"), ("m2", "m3"))],
             helper.make_node("Concat", ["a1", "m1", "m2", "m3"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2", "b2"], ["c2"]), *_silu("c2", "y")]
    inits = {"w1": rng.standard_normal((c, 3, 3, 3)) / 3, "b1": rng.standard_normal(c) * 0.1,
             "w2": rng.standard_normal((c, 4 * c, 1, 1)) / np.sqrt(4 * c), "b2": rng.standard_normal(c) * 0.1}
    return graph_model(nodes, inits, [1, 3, hw, hw])


@pytest.mark.parametrize("c, hw", [(16, 10), (32, 13)])
def test_int8_sppf_pools_in_its_fp16_table_island_on_the_ppu(tmp_path, c, hw):
    """In an int8 build SiLU's lookup table puts the convolutions around SPPF in fp16
    (Q22), so with --kernel-ppu-irq its pools run on the PPU in fp16 too: nothing of
    SPPF is left on the CPU and no int8/fp16 edge is added."""
    path = save(sppf_silu(c, hw, c), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(c).standard_normal((4, 1, 3, hw, hw)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision="int8", calib=calib, ppu_irq=True))
    pools = [p for p in report.placements if p.op.type == "MaxPool"]
    assert [(p.device, p.dtype) for p in pools] == [("npu", "fp16")] * 3, [p.reason for p in pools]
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    x = np.random.default_rng(c + 1).standard_normal((1, 3, hw, hw)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=PATCHED)) as m:
        got = m.run({"x": x})["y"]
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= INT8_COSINE
    stock = build(path, tmp_path / "s.rkbin", BuildOptions(precision="int8", calib=calib))
    assert [(p.device, p.dtype) for p in stock.placements if p.op.type == "MaxPool"] == [("npu", "fp16")] * 3
    assert not stock.ppu


def test_loader_refuses_a_ppu_rkbin_on_a_stock_kernel(tmp_path):
    path = save(sppf_like(16, 12, 6), tmp_path / "m.onnx")
    build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16", ppu_irq=True))
    with pytest.raises(RkcError, match="runs max pooling on the PPU .*never completes PPU tasks: use rocket 1.3"):
        runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=DEFAULT))


def test_compile_option_is_documented_and_explain_says_where_max_pooling_runs(tmp_path):
    option = next(o for o in OPTIONS if o.name == "kernel_ppu_irq")
    assert option.flag == "--kernel-ppu-irq" and "kernel/patches/0005" in option.help
    path = save(sppf_like(16, 12, 7), tmp_path / "m.onnx")
    on = compile_model(path, tmp_path / "a.rkbin", {"precision": "fp16", "kernel_ppu_irq": True, "explain": True})
    off = compile_model(path, tmp_path / "b.rkbin", {"precision": "fp16", "explain": True})
    assert any(line.startswith("max pooling: fp16 pools on the PPU (--kernel-ppu-irq: needs a kernel with "
                               "kernel/patches/0005)") for line in on)
    assert any(line.startswith("max pooling: on the DPU") for line in off)


def test_rkrun_refuses_a_ppu_rkbin_on_a_stock_kernel_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    bin_dir = Path(sys.executable).parent
    save(sppf_like(16, 12, 8), tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(9).standard_normal((1, 3, 12, 12)).astype(np.float32))
    done = subprocess.run([str(bin_dir / "rkc"), "compile", "m.onnx", "--precision", "fp16", "--kernel-ppu-irq"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    r = subprocess.run([str(bin_dir / "rkrun"), "m.rkbin", "--inputs", "in.npz", "--device", "sim"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "never completes PPU tasks: use rocket 1.3 (kernel/patches/0005)" in r.stderr


def _pool_between_precisions(c: int, hw: int, seed: int):
    """Conv+ReLU -> Conv+ReLU -> MaxPool 3x3/2 -> Conv (a pool after a convolution), and the
    first ReLU's map also pooled (a pool of a map an fp16 group reads) -> Conv, the two
    added; random weights from `seed`."""
    rng = np.random.default_rng(seed)
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], **pool), helper.make_node("Conv", ["p2", "w3"], ["c3"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], **pool), helper.make_node("Conv", ["p1", "w4"], ["c4"]),
             helper.make_node("Add", ["c3", "c4"], ["y"])]
    inits = {"w1": rng.standard_normal((c, 3, 3, 3)) / 3, "w2": rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c),
             "w3": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c), "w4": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)}
    return graph_model(nodes, inits, [1, 3, hw, hw])


@pytest.mark.parametrize("c, hw", [(16, 12), (32, 15)])
def test_int8_max_pools_of_maps_held_in_fp16_run_on_the_ppu(tmp_path, monkeypatch, c, hw):
    """In an int8 build whose mixed plan puts a convolution in fp16 (here chosen for it,
    as the SQNR rule does for Inception v1's), a max pool of the map that group makes,
    or of a map it reads (converted to fp16 for it anyway), pools that fp16 map on the
    PPU with --kernel-ppu-irq instead of as DPU taps in int8 (Q14: the PPU pools fp16 only)."""
    from rkc.compiler import build as build_module

    monkeypatch.setattr(build_module, "choose_fp16", lambda graph, groups, calib: {
        next(i for i, op in enumerate(graph.ops) if op.outputs == ["c2"]): "chosen by the test"})
    monkeypatch.setattr(build_module, "merge_islands", lambda *args: {})
    monkeypatch.setattr(build_module, "whole_fp16_wins", lambda *args: "")
    path = save(_pool_between_precisions(c, hw, c), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(c).standard_normal((4, 1, 3, hw, hw)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision="int8", calib=calib, ppu_irq=True))
    placed = {p.op.outputs[0]: (p.device, p.dtype) for p in report.placements}
    assert placed["c2"] == ("npu", "fp16") and placed["c1"] == ("npu", "int8")
    assert placed["p2"] == ("npu", "fp16") and placed["p1"] == ("npu", "fp16"), report.placements
    assert [p.op.type for p in report.placements if p.device == "cpu"] == []
    x = np.random.default_rng(c + 1).standard_normal((1, 3, hw, hw)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=PATCHED)) as m:
        got = m.run({"x": x})["y"]
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= INT8_COSINE
    stock = build(path, tmp_path / "s.rkbin", BuildOptions(precision="int8", calib=calib))
    assert [p.device for p in stock.placements if p.op.type == "MaxPool"] == ["npu"] * 2 and not stock.ppu


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("c, hw", [(24, 14), (70, 12)])
def test_ceil_mode_pools_as_dpu_taps_match_onnxruntime(tmp_path, monkeypatch, precision, c, hw):
    """Conv+ReLU -> MaxPool 3x3/2 in ceil mode (the last window overhangs: extra bottom and
    right padding at the minimum) -> Conv; channels not a
    multiple of the atom. The pool runs as DPU taps (host modelled dear) on a stock kernel."""
    _host_dear(monkeypatch)
    rng = np.random.default_rng(c + hw)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             helper.make_node("Conv", ["p1", "w2"], ["y"])]
    inits = {"w1": rng.standard_normal((c, 3, 3, 3)) / 3, "b1": rng.standard_normal(c) * 0.1,
             "w2": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)}
    path = save(graph_model(nodes, inits, [1, 3, hw, hw]), tmp_path / "m.onnx")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(c).standard_normal((4, 1, 3, hw, hw)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision=precision, calib=calib))
    assert [p.device for p in report.placements if p.device == "cpu"] == [], report.placements
    x = np.random.default_rng(c + 1).standard_normal((1, 3, hw, hw)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin", device=SimDevice(quirks=DEFAULT)) as m:
        got = m.run({"x": x})["y"]
    bound = FP16_COSINE if precision == "fp16" else INT8_COSINE
    assert cosine(got, onnxruntime_outputs(path, {"x": x})["y"]) >= bound
