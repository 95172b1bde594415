"""Real ONNX models through rkc: compile time, size, segments, and cosine
similarity against onnxruntime (fp16 and int8). Prints a table, or JSON with --json.

    python bench/onnx_models.py [--json] [--only ppocr_cls]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rkc.compiler.build import BuildOptions, build  # noqa: E402
from onnx_models import cosine, onnxruntime_outputs  # noqa: E402
from real_models import real_models  # noqa: E402


def measure(model, precision: str, tmp: Path) -> dict:
    options = BuildOptions(precision=precision,
                           input_shapes={model.input_name: model.shape} if model.input_name else {})
    if precision == "int8":
        if not model.runs:
            return {}
        options.calib = tmp / f"{model.name}.calib.npz"
        np.savez(options.calib, **{model.input_name: np.stack([model.inputs(100 + i) for i in range(4)])})
    t = time.perf_counter()
    report = build(model.path, tmp / f"{model.name}.{precision}.rkbin", options)
    row = {"model": model.name, "precision": precision, "compile_s": round(time.perf_counter() - t, 2),
           "size_mb": round(report.size / 1e6, 2), "ops_npu": report.ops_npu, "ops_cpu": report.ops_cpu,
           "segments": report.segments, "conversions": report.conversions, "tasks": report.npu_tasks}
    if model.runs:
        from rkc import runtime
        x = model.inputs(0)
        want = onnxruntime_outputs(model.path, {model.input_name: x})
        with runtime.load(tmp / f"{model.name}.{precision}.rkbin") as compiled:
            t = time.perf_counter()
            got = compiled.run({model.input_name: x})
            row["run_s"] = round(time.perf_counter() - t, 2)
        row["cosine"] = {k: round(cosine(got[k], v), 6) for k, v in want.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in real_models():
            if args.only and model.name != args.only:
                continue
            for precision in ("fp16", "int8"):
                row = measure(model, precision, Path(tmp))
                if row:
                    rows.append(row)
                    if not args.json:
                        cos = ", ".join(f"{v:.6f}" for v in row.get("cosine", {}).values()) or "-"
                        print(f"{row['model']:22s} {precision:5s} compile {row['compile_s']:6.2f} s  "
                              f"{row['size_mb']:7.2f} MB  NPU ops {row['ops_npu']:4d}  CPU ops {row['ops_cpu']:4d}  "
                              f"segments {row['segments']:3d}  conversions {row['conversions']:3d}  run {row.get('run_s', '-')}  cosine {cos}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
