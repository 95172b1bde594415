"""`rkc probe --gemm`: rkc's own large GEMM programs timed on the board, beside
what the performance model (ir/npu/perf.py) says of the same program.

Published int8 GEMM figures run at 10-20 % of the int8 MAC peak (rocket-userspace's
512x3840x4096 at 386 GOP/s, RKLLM's prefill at about 1.1 TOPS; bench/silicon.py),
where the model puts rkc's programs of that work at their DMA limit, 2-4x faster;
no source says which term the model lacks. Timing rkc's own programs of that shape,
int8 and fp16, on one core and on three, measures it: measured over modelled per
precision and core count, the rest of the program held equal. Each program's
result is checked against numpy first, so a wrong program cannot pass for a fast one.
On the simulator nothing is timed (it models time, it has none), as rkc probe --dram.
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.emitter_graph import emit_options
from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.probe import emitted
from rkc.ir.errors import RkcError
from rkc.ir.npu.perf import PerfModel

GEMM = (512, 3840, 4096)  # M, K, N: rocket-userspace's published shape (bench/published.py)
CASES = (("int8", 1), ("int8", 3), ("fp16", 1), ("fp16", 3))  # precision, cores
RUNS = 5
CLOCKS_HZ = (1e9, 600e6)  # the model at the vendor's clock and at rocket-userspace's patched one
SIM_NOTE = ("not measurable here: no NPU on this machine, and the simulator models NPU time (ir/npu/perf.py) "
            "instead of having any")


def gemm_rate(device, precision: str, cores: int, shape: tuple[int, int, int] = GEMM, runs: int = RUNS) -> dict:
    """Time rkc's GEMM program of `shape` on `device` (a kick per task, as stock rocket runs it)."""
    m, k, n = shape
    rng = np.random.default_rng(20261201)
    if precision == "int8":
        a = rng.integers(-128, 128, (m, k)).astype(np.int8)
        b = rng.integers(-128, 128, (k, n)).astype(np.int8)
        out, want = "int32", a.astype(np.int64) @ b.astype(np.int64)
    else:
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
        out, want = "fp32", a.astype(np.float32) @ b.astype(np.float32)
    A, C = api.Feature.gemm("A", 0, m, k, precision), api.Feature.gemm("C", 0, m, n, out)
    result = emit(api.Gemm(A, b, C, m, name=f"gemm_{precision}"), emit_options(cores))
    apad = np.zeros((api.gemm_rows(m), k), a.dtype)
    apad[:m] = a
    program = emitted.place([result], {"A": (A, apad.T[:, :, None])}, f"gemm_{precision}")
    placed = emitted.run(device, program, chained=False)
    try:
        got = emitted.feature_values(C, placed.read(program.handles[C.buffer]))[:, :m, 0].T
        exact = precision == "int8"
        if not (np.array_equal(got.astype(np.int64), want) if exact
                else np.allclose(got, want, rtol=2e-2, atol=2e-2)):
            raise RkcError(f"rkc probe --gemm: the {precision} GEMM on {cores} core(s) gave wrong values; "
                           "no rate reported")
        times = emitted.timed_runs(device, placed, runs, chained=False)
    finally:
        placed.free()
    cost = result.cost_jobs(chained=False)
    modelled = {f"{c / 1e6:.0f}MHz": PerfModel(clock_hz=c).submission_seconds(cost) for c in CLOCKS_HZ}
    ops = 2 * m * k * n
    return {"measured": True, "program": f"{precision} GEMM {m}x{k}x{n} on {cores} core(s), a kick per task",
            "precision": precision, "cores": cores, "ops": ops, "tasks": sum(len(j.tasks) for j in cost),
            "runs": runs, "best_s": times[0], "median_s": times[len(times) // 2],
            "gops": round(ops / times[0] / 1e9, 1),
            "modelled_gops": {clk: round(ops / s / 1e9, 1) for clk, s in modelled.items()}}


def measure(device=None) -> list[dict]:
    """The "gemm" section of the probe report; `device`: the board's NPU, None without one."""
    if device is None:
        return [{"measured": False, "precision": p, "cores": c, "note": SIM_NOTE} for p, c in CASES]
    return [gemm_rate(device, p, c) for p, c in CASES]


def lines(section: list[dict]) -> list[str]:
    out = []
    for r in section:
        head = f"  GEMM {r['precision']} {r['cores']} core(s): "
        if not r["measured"]:
            out.append(head + r["note"])
            continue
        model = ", ".join(f"{v:g} at {clk}" for clk, v in r["modelled_gops"].items())
        out.append(head + f"{r['gops']:g} GOP/s measured (best of {r['runs']}); modelled {model}")
    return out
