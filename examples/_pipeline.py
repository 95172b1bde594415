"""What every example does after building its model: compile with `rkc
compile`, run with `rkrun` on the simulator (or the NPU), compare with
onnxruntime. Kept tiny so each example reads top to bottom."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent


def rkc(*args: str) -> None:
    print("$ rkc", " ".join(args), flush=True)
    subprocess.run([str(BIN / "rkc"), *args], check=True)


def rkrun(*args: str) -> None:
    print("$ rkrun", " ".join(args), flush=True)
    subprocess.run([str(BIN / "rkrun"), *args], check=True)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def compile_run_compare(model_path: Path, feeds: dict[str, np.ndarray], out: Path, *compile_args: str) -> float:
    """Compile, run, compare every output with onnxruntime; returns the worst cosine."""
    import onnxruntime as ort

    rkbin = out / (model_path.stem + ".rkbin")
    inputs, outputs = out / (model_path.stem + ".in.npz"), out / (model_path.stem + ".out.npz")
    np.savez(inputs, **feeds)
    rkc("compile", str(model_path), "-o", str(rkbin), *compile_args)
    rkc("inspect", str(rkbin), "--dot", str(out / (model_path.stem + ".dot")))
    rkrun(str(rkbin), "--inputs", str(inputs), "--outputs", str(outputs))
    got = dict(np.load(outputs))
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    worst = 1.0
    for name, ref in want.items():
        c = cosine(got[name], ref)
        worst = min(worst, c)
        print(f"{name}: cosine vs onnxruntime {c:.6f}, max abs error {np.abs(got[name] - ref).max():.3g}")
    return worst
