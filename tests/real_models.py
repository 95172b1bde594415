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


def text_like_image(shape, seed: int) -> np.ndarray:
    """A light page with dark strokes, normalised the way PP-OCR does
    ((pixel / 255 - 0.5) / 0.5): closer to what the models see than noise."""
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
