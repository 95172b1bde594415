"""The host CPU time of a max pool the CPU runs between two NPU feature maps, and the
cost rule's figures fitted to it (compiler/cost.py MAX_POOL_HOST_S: a fixed part and a
part per input element, by dtype).

Each pool is one CPU step of a program on the null device (runtime/null.py), run by
the interpreter as a model's MaxPool step runs (runtime/execute.py `_Run.cpu`: the
step's closure prepared at its first run, its bracket, the kernel on the maps in place,
pool_jit.atoms_pooler's, its result written into the next map), so the fixed part holds the step's own work as well as the
kernel's setup. The shapes are
SqueezeNet's, Inception v1's, ResNet-50's and YOLO's SPPF pools. Figures are this
process's CPU time (the machine is shared), the median of --repeat calls per shape, the
dtypes and shapes alternating in rounds; the fit is least squares.

    python bench/max_pool_host.py [--repeat 200] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np

from rkc.ir.npu import geometry
from rkc.ir.program import Program, Step, TensorInfo
from rkc.runtime.execute import _Run
from rkc.runtime.null import NullDevice

# (channels, height, width, kernel, stride): the pools of the cost rule's note (2026-12-06 "Stop 46")
SHAPES = [(96, 109, 109, 3, 2), (64, 112, 112, 3, 2), (192, 56, 56, 3, 2), (256, 28, 28, 3, 1),
          (480, 28, 28, 3, 2), (512, 14, 14, 3, 1), (832, 14, 14, 3, 2), (832, 7, 7, 3, 1), (128, 20, 20, 5, 1)]


def pool_program(dtype: str, c: int, h: int, w: int, k: int, s: int):
    """(model, program): one MaxPool step from a map in one BO to a map in another."""
    pad = k // 2 if s == 1 else 0
    oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    device = NullDevice()
    itemsize = 1 if dtype == "int8" else 2
    tensors, bos = {}, {}
    for name, shape in (("x", [1, c, h, w]), ("y", [1, c, oh, ow])):
        nbytes = geometry.nbytes(shape, "native", itemsize)
        bos[name] = device.create_bo(nbytes)
        tensors[name] = TensorInfo(name, shape, dtype, "native", name, 0, nbytes)
    step = Step("cpu", "pool", op="MaxPool", inputs=["x"], outputs=["y"],
                attrs={"kernel_shape": [k, k], "strides": [s, s], "pads": [pad] * 4})
    model = SimpleNamespace(tensors=tensors, bos=bos, device=device, host_regions={}, schedules={},
                            prepared_submits={})
    return model, Program("pool", [], [], [step])


def measure(repeat: int, rounds: int) -> list[dict]:
    cases = [(dtype, shape) for shape in SHAPES for dtype in ("int8", "fp16")]
    made = {case: pool_program(case[0], *case[1]) for case in cases}
    times: dict = {case: [] for case in cases}
    for _ in range(rounds):
        for case in cases:
            model, program = made[case]
            run, step = _Run(model, program), program.steps[0]
            run.cpu(step, 0)  # the first run works out the step's plan
            samples = []
            for _ in range(repeat):
                t = time.process_time()
                run.cpu(step, 0)
                samples.append(time.process_time() - t)
            times[case].append(statistics.median(samples))
    return [{"dtype": dtype, "shape": list(shape), "elements": shape[0] * shape[1] * shape[2],
             "seconds": statistics.median(times[(dtype, shape)])} for dtype, shape in cases]


def fit(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Per dtype (fixed seconds, seconds per input element), least squares."""
    out = {}
    for dtype in ("int8", "fp16"):
        mine = [r for r in rows if r["dtype"] == dtype]
        a = np.array([[1.0, r["elements"]] for r in mine])
        (fixed, per), *_ = np.linalg.lstsq(a, np.array([r["seconds"] for r in mine]), rcond=None)
        out[dtype] = (float(fixed), float(per))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    np.seterr(all="ignore")
    rows = measure(args.repeat, args.rounds)
    fitted = fit(rows)
    if args.json:
        print(json.dumps({"pools": rows, "fit": fitted}))
        return
    print("| pool (C x H x W, k/s) | dtype | input elements | host ms (CPU) | fit ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        c, h, w, k, s = r["shape"]
        fixed, per = fitted[r["dtype"]]
        print(f"| {c}x{h}x{w} {k}/{s} | {r['dtype']} | {r['elements']} | {r['seconds'] * 1e3:.3f} | "
              f"{(fixed + per * r['elements']) * 1e3:.3f} |")
    print("MAX_POOL_HOST_S = {" + ", ".join(f'"{d}": ({f * 1e6:.0f}e-6, {p * 1e9:.2f}e-9)'
                                            for d, (f, p) in fitted.items()) + "}")


if __name__ == "__main__":
    main()
