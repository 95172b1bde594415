"""`rkc probe --dram`: the memory bandwidth this machine reaches.

CPU: streaming copy and read over buffers several times the last-level cache,
with 1 and 4 threads (numpy releases the GIL inside a large copy or reduction,
so threads over slices of one buffer stream in parallel). Copy counts the
bytes read plus the bytes written, as STREAM does; read counts the bytes read.
Each figure is the best of a few passes, each pass timed from a barrier that
starts every thread to the end of the last one.

NPU (on a board only): an int8 GEMV whose weights do not fit on chip, so every
run streams them from DRAM; weight bytes over the wall time of a submit (kick
overhead included, small next to a multi-MiB stream). The simulator models
DRAM time, it does not have any, so there the figure is reported as not
measurable.

`bandwidth_from` turns a probe report (or a number) into bytes/s for the
performance model (`rkc inspect --dram-gbps`, bench/ --dram-gbps).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.probe import emitted
from rkc.ir.errors import RkcError

MIB = 1 << 20
DEFAULT_BUFFER_MIB = 256
THREADS = (1, 4)
PASSES = 5
#: the NPU stream: int8 GEMV M=1, weights K x N (16 MiB, 8x the NPU's on-chip buffers)
NPU_K, NPU_N = 4096, 4096
NPU_RUNS = 8
SIM_NOTE = ("not measurable here: no NPU on this machine, and the simulator models DRAM time (ir/npu/perf.py) "
            "instead of having any")


@dataclass
class Stream:
    kind: str  # "copy" or "read"
    threads: int
    bytes_per_pass: int
    best_s: float
    median_s: float

    @property
    def gbps(self) -> float:
        return self.bytes_per_pass / self.best_s / 1e9

    def as_dict(self) -> dict:
        return {"kind": self.kind, "threads": self.threads, "bytes_per_pass": self.bytes_per_pass,
                "best_s": self.best_s, "median_s": self.median_s, "gbps": round(self.gbps, 3),
                "gbps_median": round(self.bytes_per_pass / self.median_s / 1e9, 3)}


def _timed_pass(threads: int, work: Callable[[int], None]) -> float:
    start = threading.Barrier(threads + 1)
    ends = [0.0] * threads
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        start.wait()
        try:
            work(i)
        except BaseException as exc:  # reported below, after every thread is joined
            errors.append(exc)
        ends[i] = time.perf_counter()

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return max(ends) - t0


def cpu_stream(kind: str, threads: int, buffer_bytes: int = DEFAULT_BUFFER_MIB * MIB,
               passes: int = PASSES) -> Stream:
    """Stream `buffer_bytes` (copy: from one buffer into another) split over `threads` slices."""
    words = buffer_bytes // 8
    src = np.ones(words, np.uint64)  # written, so every page is mapped before timing
    dst = np.zeros(words, np.uint64) if kind == "copy" else None
    bounds = [(i * words // threads, (i + 1) * words // threads) for i in range(threads)]
    if kind == "copy":
        def work(i: int) -> None:
            lo, hi = bounds[i]
            np.copyto(dst[lo:hi], src[lo:hi])
        moved = 2 * words * 8
    elif kind == "read":
        def work(i: int) -> None:
            lo, hi = bounds[i]
            np.bitwise_or.reduce(src[lo:hi])  # integer reduction: no FP work, one pass over memory
        moved = words * 8
    else:
        raise ValueError(kind)
    _timed_pass(threads, work)  # warm-up
    times = sorted(_timed_pass(threads, work) for _ in range(passes))
    return Stream(kind, threads, moved, times[0], times[len(times) // 2])


def cpu_bandwidth(buffer_bytes: int = DEFAULT_BUFFER_MIB * MIB, threads: tuple[int, ...] = THREADS,
                  passes: int = PASSES) -> list[Stream]:
    return [cpu_stream(kind, n, buffer_bytes, passes) for kind in ("copy", "read") for n in threads]


def npu_weight_stream(device, k: int = NPU_K, n: int = NPU_N, runs: int = NPU_RUNS) -> dict:
    """Time an int8 GEMV (M=1) whose K x N weights stream from DRAM on every run.

    The result is checked against numpy once, so a wrong program cannot pass for a fast one."""
    m = 1
    rng = np.random.default_rng(20261201)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    A, C = api.Feature.gemm("A", 0, m, k, "int8"), api.Feature.gemm("C", 0, m, n, "int32")
    result = emit(api.Gemm(A, b, C, m, name="dram_stream"), api.EmitOptions())
    apad = np.zeros((api.gemm_rows(m), k), np.int8)
    apad[:m] = a
    program = emitted.place([result], {"A": (A, apad.T[:, :, None])}, "dram_stream")
    placed = emitted.run(device, program, chained=True)
    try:
        raw = placed.read(program.handles[C.buffer])
        got = emitted.feature_values(C, raw)[:, :m, 0].T.astype(np.int64)
        if not np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64)):
            raise RkcError("rkc probe --dram: the NPU weight-stream GEMV gave wrong values; no bandwidth reported")
        times = emitted.timed_runs(device, placed, runs, chained=True)
    finally:
        placed.free()
    weight_bytes = k * n
    return {"measured": True, "program": f"int8 GEMV M=1 K={k} N={n}", "weight_bytes": weight_bytes,
            "runs": runs, "best_s": times[0], "median_s": times[len(times) // 2],
            "gbps": round(weight_bytes / times[0] / 1e9, 3)}


def measure(device=None, buffer_mib: int = DEFAULT_BUFFER_MIB) -> dict:
    """The "dram" section of the probe report; `device`: the board's NPU, None without one."""
    streams = cpu_bandwidth(buffer_mib * MIB)
    npu = npu_weight_stream(device) if device is not None else {"measured": False, "note": SIM_NOTE}
    return {"buffer_bytes": buffer_mib * MIB,
            "convention": "copy counts bytes read + written (STREAM); read counts bytes read; best of "
                          f"{PASSES} passes after a warm-up",
            "cpu": [s.as_dict() for s in streams], "npu": npu}


def lines(section: dict) -> list[str]:
    out = [f"  {'CPU':4} {'kind':5} {'threads':>7} {'GB/s':>7} {'median':>7}"]
    for s in section["cpu"]:
        out.append(f"  {'':4} {s['kind']:5} {s['threads']:7} {s['gbps']:7.2f} {s['gbps_median']:7.2f}")
    npu = section["npu"]
    out.append(f"  NPU  {npu['program']}: {npu['gbps']:.2f} GB/s (best of {npu['runs']})" if npu["measured"]
               else f"  NPU  {npu['note']}")
    return out


def _gbps(figure: object) -> float | None:
    """A figure's GB/s when it is a finite positive number (a report is user input)."""
    gbps = figure.get("gbps") if isinstance(figure, dict) else None
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not 0 < gbps < math.inf:
        return None
    return float(gbps)


def bandwidth_from(value: str) -> tuple[float, str]:
    """`--dram-gbps`: a number of GB/s, or a probe report's measured figure.

    From a report: the NPU weight stream where it was measured (a board), else
    the best CPU read figure (what the CPU reaches; the NPU shares the same
    controller), and which one it is."""
    try:
        gbps = float(value)
    except ValueError:
        pass
    else:
        if not 0 < gbps < math.inf:
            raise RkcError(f"--dram-gbps {value}: must be a positive number of GB/s or a probe report")
        return gbps * 1e9, f"{gbps:g} GB/s (--dram-gbps)"
    try:
        with open(value, encoding="utf-8") as f:
            report = json.load(f)
    except OSError as exc:
        raise RkcError(f"--dram-gbps {value}: neither a number nor a readable probe report ({exc.strerror})")
    except (ValueError, RecursionError):
        raise RkcError(f"--dram-gbps {value}: not a JSON probe report")
    section = report.get("dram") if isinstance(report, dict) else None
    if not isinstance(section, dict):
        raise RkcError(f"--dram-gbps {value}: the report has no DRAM figures (run rkc probe --dram)")
    npu = section.get("npu")
    if isinstance(npu, dict) and npu.get("measured") is True:
        gbps = _gbps(npu)
        if gbps is None:
            raise RkcError(f"--dram-gbps {value}: the report's NPU weight stream has no positive GB/s figure")
        return gbps * 1e9, f"{gbps:g} GB/s, the NPU weight stream in {value}"
    cpu = section.get("cpu")
    reads = [(gbps, s.get("threads")) for s in (cpu if isinstance(cpu, list) else [])
             if isinstance(s, dict) and s.get("kind") == "read" and (gbps := _gbps(s)) is not None]
    if not reads:
        raise RkcError(f"--dram-gbps {value}: the report has no DRAM figures (run rkc probe --dram)")
    gbps, threads = max(reads, key=lambda r: r[0])
    return gbps * 1e9, f"{gbps:g} GB/s, the CPU read with {threads} thread(s) in {value}"
