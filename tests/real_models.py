"""Real models that PyPI packages ship (never committed): where they are,
what input shape to compile them with, and text-like inputs for them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent if spec and spec.origin else None


@dataclass(frozen=True)
class RealModel:
    name: str
    path: Path
    input_name: str
    shape: tuple[int, ...]
    runs: bool  # compared end to end (else: must compile)

    def inputs(self, seed: int) -> np.ndarray:
        if self.name.startswith("ppocr"):
            return text_like_image(self.shape, seed)
        return np.random.default_rng(seed).standard_normal(self.shape).astype(np.float32)


WORDS = ["rkc", "NPU", "RK3588", "rocket", "tensor", "segment", "compile", "kernel", "simulator", "onnx"]


def text_like_image(shape, seed: int) -> np.ndarray:
    """Printed words on a light page (OpenCV, which rapidocr-onnxruntime brings),
    normalised the way PP-OCR does ((pixel / 255 - 0.5) / 0.5): the detector then
    finds real text. Without OpenCV: dark strokes on a light page."""
    try:
        import cv2
    except ImportError:
        return _strokes(shape, seed)
    rng = np.random.default_rng(seed)
    n, c, h, w = shape
    img = np.full((h, w, 3), 235, np.uint8)
    lines = max(1, h // 40)
    for k in range(lines):
        text = " ".join(rng.choice(WORDS, size=4))
        scale = min(h / lines / 40, 1.2) + rng.uniform(0, 0.2)
        y = int((k + 0.75) * h / lines)
        cv2.putText(img, text, (int(rng.integers(0, max(1, w // 8))), y), cv2.FONT_HERSHEY_SIMPLEX, scale,
                    (20, 20, 20), max(1, int(2 * scale)), cv2.LINE_AA)
    x = img.astype(np.float32).transpose(2, 0, 1)[None] / 255.0
    return np.ascontiguousarray(np.broadcast_to((x - 0.5) / 0.5, (n, c, h, w))).astype(np.float32)


def _strokes(shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n, c, h, w = shape
    img = np.full((n, c, h, w), 0.9, np.float32) + rng.normal(0, 0.03, (n, c, h, w)).astype(np.float32)
    for _ in range(max(4, h * w // 400)):
        y, x = rng.integers(0, h), rng.integers(0, w)
        hh, ww = rng.integers(1, max(2, h // 6)), rng.integers(1, max(2, w // 8))
        img[:, :, y:y + hh, x:x + ww] = rng.uniform(0.0, 0.3)
    return ((np.clip(img, 0, 1) - 0.5) / 0.5).astype(np.float32)


def real_models() -> list[RealModel]:
    models = []
    ocr = _package_dir("rapidocr_onnxruntime")
    if ocr is not None:
        models += [
            RealModel("ppocr_cls", ocr / "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "x", (1, 3, 48, 192), True),
            RealModel("ppocr_det", ocr / "models/ch_PP-OCRv4_det_infer.onnx", "x", (1, 3, 160, 160), True),
        ]
    light = _package_dir("onnx")
    if light is not None:
        for path in sorted((light / "backend/test/data/light").glob("light_*.onnx")):
            models.append(RealModel(path.stem, path, "", (), False))
    return models
