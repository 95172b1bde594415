"""The floor of an inference's host time on the null device: what one NPU segment costs
the host with nothing else around it, against what the runtime spends on it.

examples/mlp.py (fp16) starts with one segment between two edge casts: its input Cast
into the first GEMM's fp16 atoms, the segment, the Cast of its [4, 128] result out. Timed
(this process's CPU time, the median of --repeat calls, the forms alternating in rounds):

* the prepared submit and wait alone (runtime/null.py: the per-call checks);
* the least any runtime must do: the input rounded into its BO, the submit, the output
  widened out of its BO, each BO held for the CPU while it is touched (Python calling
  runtime/half.py's compiled loops);
* run_program of that segment alone, fed and read in its fp16 GEMM layout (no CPU step);
* run_program of [Cast, segment, Cast] (float32 in and out: a one-segment model);
* the whole example (`LoadedModel.run`, 2 segments and its LayerNorm on the CPU).

    python bench/host_floor.py [--repeat 1000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def forms(model) -> dict:
    from rkc.ir.program import Program
    from rkc.runtime import half
    from rkc.runtime.execute import _jobs, run_program

    prog = model.module.programs[0]
    cast_in, npu, cast_out = prog.steps[:3]
    assert (cast_in.op, npu.kind, cast_out.op) == ("Cast", "npu", "Cast"), [s.op or s.kind for s in prog.steps[:3]]
    seg = Program("segment", [cast_in.outputs[0]], [cast_out.inputs[0]], [npu])
    edged = Program("edged", [cast_in.inputs[0]], [cast_out.outputs[0]], [cast_in, npu, cast_out])
    x32 = np.random.default_rng(0).standard_normal(model.tensors[cast_in.inputs[0]].shape).astype(np.float32)
    x16 = x32.astype(np.float16)
    device = model.device
    submit = device.prepare_submit(_jobs(npu, model.bos), chained=npu.chained and device.supports_chaining)
    t_in, t_out = model.tensors[cast_in.outputs[0]], model.tensors[cast_out.inputs[0]]
    bo_in, bo_out = model.bos[t_in.region], model.bos[t_out.region]
    (m, k), (m2, n) = t_in.shape[-2:], t_out.shape[-2:]

    def atoms(bo, t, rows_of):
        c2 = 8  # fp16 lanes of a 16-byte atom
        return bo.host[t.offset:t.offset + t.nbytes].view(np.uint16).reshape(-(-rows_of[1] // c2), -1, c2)

    def minimal():
        device.prepare_cpu_access(bo_in)
        half.narrow_into_atoms(x32.view(np.uint32), atoms(bo_in, t_in, (m, k)))
        device.finish_cpu_access(bo_in)
        submit()
        out = np.empty((m2, n), np.float32)
        device.prepare_cpu_access(bo_out)
        half.widen_atoms(atoms(bo_out, t_out, (m2, n)), m2, n, out.T.view(np.uint32))
        device.finish_cpu_access(bo_out)
        return out

    return {"prepared submit + wait": submit,
            "minimal: input in, submit + wait, output out": minimal,
            "run_program: the segment alone (fp16 GEMM layout in and out)":
                lambda: run_program(model, seg, {seg.inputs[0]: x16}),
            "run_program: Cast, segment, Cast (float32 in and out)":
                lambda: run_program(model, edged, {edged.inputs[0]: x32}),
            "LoadedModel.run: the whole example": lambda: model.run({prog.inputs[0]: x32})}


def measure(calls: dict, repeat: int, rounds: int) -> dict[str, float]:
    clock = time.process_time
    samples = {k: [] for k in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            call()
            times = []
            for _ in range(repeat):
                t = clock()
                call()
                times.append(clock() - t)
            samples[name].append(statistics.median(times))
    empty = []
    for _ in range(repeat):
        t = clock()
        empty.append(clock() - t)
    return {"(the clock's own two reads)": statistics.median(empty),
            **{k: statistics.median(v) for k, v in samples.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    import mlp
    import onnx

    from rkc import runtime
    from rkc.compiler.build import BuildOptions, build

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(mlp.build_model(), f"{tmp}/mlp.onnx")
        build(Path(f"{tmp}/mlp.onnx"), Path(f"{tmp}/mlp.rkbin"), BuildOptions(precision="fp16"))
        with runtime.load(f"{tmp}/mlp.rkbin", device="null") as model:
            figures = measure(forms(model), args.repeat, args.rounds)
    for name, seconds in figures.items():
        print(f"{seconds * 1e6:9.2f} us  {name}")


if __name__ == "__main__":
    main()
