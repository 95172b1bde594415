"""YOLOv8n and YOLO11n (bench/zoo_models.py: ultralytics' yolov8.yaml and
yolo11.yaml at scale n, random weights from a fixed seed, cut where
rknn_model_zoo cuts them) at 128x128: the default test compiles YOLOv8n and
checks where every op runs (nothing on the CPU: SPPF's small pools as DPU taps,
or on the PPU with --kernel-ppu-irq; upsampling on the NPU, every Concat and Split a view); the slow
ones run both on the simulator against onnxruntime in fp16 and int8."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.quirks import Quirks
from onnx_models import cosine, onnxruntime_outputs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import zoo_models  # noqa: E402

SIZE = 128  # P5 is 4x4: every convolution task keeps its 4 input rows
THRESHOLD = {"fp16": 0.9995, "int8": 0.999}


def _model(tmp_path, family: str = "yolov8") -> Path:
    path = tmp_path / f"{family}n.onnx"
    onnx.save(getattr(zoo_models, family)("n", SIZE), str(path))
    return path


def _options(tmp_path, precision: str) -> BuildOptions:
    options = BuildOptions(precision=precision)
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        rng = np.random.default_rng(1)
        np.savez(options.calib, images=rng.random((2, 1, 3, SIZE, SIZE)).astype(np.float32))
    return options


def test_yolov8n_runs_on_the_npu_pools_included(tmp_path):
    """Stock rocket: SPPF's pools of 4x4 maps (at 128x128) are DPU taps, which model less NPU time
    than the CPU kernel takes (at 640x640, 20x20 maps, they stay on the CPU: compiler/cost.py)."""
    report = build(_model(tmp_path), tmp_path / "y.rkbin", _options(tmp_path, "fp16"))
    cpu = sorted(p.op.type for p in report.placements if p.device == "cpu")
    assert cpu == [], [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"]
    assert [p.device for p in report.placements if p.op.type == "MaxPool"] == ["npu"] * 3 and not report.ppu
    assert [p.device for p in report.placements if p.op.type == "Resize"] == ["npu"] * 2
    views = sorted({p.op.type for p in report.placements if p.device == "view"})
    assert views == ["Concat", "Split"] and report.ops_view == 21
    assert sum(p.op.type == "Swish" for p in report.placements) == 57  # every Conv's SiLU, fused
    assert report.conversions == 7  # the image in, six outputs back


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_yolov8n_with_ppu_pools_runs_all_on_the_npu(tmp_path, precision):
    """With --kernel-ppu-irq SPPF's pools run on the PPU (int8: in the fp16 island
    SiLU's table makes, Q22): nothing of YOLOv8n is left on the CPU."""
    options = _options(tmp_path, precision)
    options.ppu_irq = True
    report = build(_model(tmp_path), tmp_path / "y.rkbin", options)
    assert [(p.op.describe(), p.reason) for p in report.placements if p.device == "cpu"] == []
    assert report.conversions == 7  # the image in, six outputs back


@pytest.mark.slow
@pytest.mark.parametrize("ppu", [False, True], ids=["stock", "ppu-irq"])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("family", ["yolov8", "yolo11"])
def test_yolo_matches_onnxruntime(tmp_path, family, precision, ppu):
    """YOLO11n's C2PSA attention (Reshape, Transpose, MatMul, Softmax over the 4x4
    positions) stays on the CPU; everything else as YOLOv8n. `ppu`: built for a
    kernel that completes PPU tasks, run on a simulator modelling it."""
    path = _model(tmp_path, family)
    options = _options(tmp_path, precision)
    options.ppu_irq = ppu
    build(path, tmp_path / "y.rkbin", options)
    x = np.random.default_rng(2).random((1, 3, SIZE, SIZE)).astype(np.float32)
    device = SimDevice(quirks=Quirks(completion_blocks=("DPU", "PPU"))) if ppu else "sim"
    with runtime.load(tmp_path / "y.rkbin", device=device) as m:
        got = m.run({"images": x})
    want = onnxruntime_outputs(path, {"images": x})
    assert set(got) == set(want) == {f"{k}{i}" for k in ("box", "cls") for i in range(3)}
    for name in want:
        assert cosine(got[name], want[name]) >= THRESHOLD[precision], name


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("family", ["yolov8", "yolo11"])
def test_yolo_on_a_uint8_image_matches_onnxruntime(tmp_path, family, precision):
    """The deployment bench/run.py measures: --image-input images=0,0,0/255,255,255, so the
    stem reads the image's 2x2 blocks (compiler/passes/image_blocks.py), fp16 outputs kept;
    against onnxruntime fed pixel / 255."""
    path = _model(tmp_path, family)
    options = BuildOptions(precision=precision, image_inputs={"images": ((0.0,) * 3, (255.0,) * 3)})
    rng = np.random.default_rng(1)
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        np.savez(options.calib, images=rng.integers(0, 256, (2, 1, SIZE, SIZE, 3), dtype=np.uint8))
    build(path, tmp_path / "y.rkbin", options)
    image = np.random.default_rng(2).integers(0, 256, (1, SIZE, SIZE, 3), dtype=np.uint8)
    with runtime.load(tmp_path / "y.rkbin") as m:
        assert "SpaceToDepth" in [s.op for s in m.module.programs[0].steps if s.kind == "cpu"]
        got = m.run({"images": image}, fp16_outputs=True)
    want = onnxruntime_outputs(path, {"images": image.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255)})
    for name in want:
        assert cosine(got[name].astype(np.float32), want[name]) >= THRESHOLD[precision], name


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_yolo11n_attention_on_the_npu_matches_onnxruntime(tmp_path, precision):
    """--npu-attention: C2PSA's two batched products run per head as fp16 NPU GEMMs
    with a run-time B (int8 programs too); the softmax between them stays on the CPU."""
    path = _model(tmp_path, "yolo11")
    options = _options(tmp_path, precision)
    options.npu_attention = True
    report = build(path, tmp_path / "y.rkbin", options)
    products = [p for p in report.placements if p.op.type == "MatMul"]
    assert [p.device for p in products] == ["npu"] * 4, [(p.op.describe(), p.reason) for p in products]
    x = np.random.default_rng(2).random((1, 3, SIZE, SIZE)).astype(np.float32)
    with runtime.load(tmp_path / "y.rkbin") as m:
        got = m.run({"images": x})
    want = onnxruntime_outputs(path, {"images": x})
    for name in want:
        assert cosine(got[name], want[name]) >= THRESHOLD[precision], name
