"""Emitted NPU operations as probe programs.

`place` turns compiler/npu results into a runtime.captured case (buffers by
name, regcmd with relocations, jobs), so the one relocating loader that runs
captured programs on any Device also runs the probes' own programs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.assemble import assemble
from rkc.ir.npu import layout
from rkc.runtime.captured import CapturedCase, CapturedJob, CapturedTask, PlacedCase
from rkc.runtime.device import Device


def _put_feature(f: api.Feature, raw: np.ndarray, values: np.ndarray) -> None:
    if f.dtype == "int4":  # nibble-packed atoms (ir/npu/layout.py), dense
        native = layout.pack_feature_int4(np.asarray(values)).reshape(-1)
        raw[f.offset:f.offset + native.size] = native
        return
    view = layout.feature_view(raw[f.offset:], f.channels, f.height, f.width, api.NUMPY[f.dtype],
                               surface_stride=f.surface_bytes)
    view[...] = layout.pack_feature(np.asarray(values, api.NUMPY[f.dtype]))


def feature_values(f: api.Feature, raw: bytes) -> np.ndarray:
    """[C, H, W] values of `f` from its buffer's bytes."""
    buf = np.frombuffer(raw, np.uint8)
    view = layout.feature_view(buf[f.offset:], f.channels, f.height, f.width, api.NUMPY[f.dtype],
                               surface_stride=f.surface_bytes)
    return layout.unpack_feature(np.ascontiguousarray(view), f.channels)


@dataclass
class Emitted:
    case: CapturedCase
    handles: dict[str, int]  # buffer name -> handle in the case


def place(results: Sequence[api.EmitResult], inputs: dict[str, tuple[api.Feature, np.ndarray]],
          name: str) -> Emitted:
    """A one-submit case holding `results` (assembled, tails linked within each
    job) with `inputs` written before it runs."""
    asm = assemble(list(results))
    if asm.cpu_steps:
        raise ValueError(f"{name}: the program needs CPU steps, a probe must run on the NPU alone")
    sizes: dict[str, int] = {asm.region: asm.nbytes}
    for r in results:
        for buf, end in r.extents().items():
            sizes[buf] = max(sizes.get(buf, 0), end)
    for buf, (f, _) in inputs.items():
        sizes[buf] = max(sizes.get(buf, 0), f.offset + f.nbytes)
    sizes = {b: layout.align(n, 16) for b, n in sizes.items()}
    handles = {b: i + 1 for i, b in enumerate(sorted(sizes))}
    contents: dict[int, bytes] = {handles[asm.region]: asm.blob()}
    for buf, (f, values) in inputs.items():
        raw = np.zeros(sizes[buf], np.uint8)
        _put_feature(f, raw, values)
        contents[handles[buf]] = raw.tobytes()
    for r in results:
        for c in r.constants:
            raw = np.frombuffer(contents.get(handles[c.name], bytes(sizes[c.name])), np.uint8).copy()
            raw[: len(c.data)] = np.frombuffer(c.data, np.uint8)
            contents[handles[c.name]] = raw.tobytes()
    jobs = []
    for job in asm.jobs:
        tasks = []
        for ref in job.tasks:
            relocs = [(rel.entry - ref.entry, handles[rel.target], rel.offset) for rel in asm.relocations
                      if ref.entry <= rel.entry < ref.entry + ref.count]
            tasks.append(CapturedTask(handles[asm.region], ref.entry * 8, asm.entries[ref.entry: ref.entry + ref.count],
                                      relocs))
        jobs.append(CapturedJob(tasks, [handles[b] for b in job.reads], [handles[b] for b in job.writes], job.lane))
    case = CapturedCase(name, {handles[b]: n for b, n in sizes.items()}, [contents], [jobs])
    return Emitted(case, handles)


def run(device: Device, program: Emitted, chained: bool) -> PlacedCase:
    """Place `program` on `device`, run its one submit, leave it placed (free it when done)."""
    placed = PlacedCase(program.case, device)
    device.run(placed.load(0), chained=chained)
    return placed


def timed_runs(device: Device, placed: PlacedCase, runs: int, chained: bool) -> list[float]:
    """Wall seconds of `runs` more runs of `placed`'s one submit on `device`, fastest first."""
    jobs = placed.load(0)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        device.run(jobs, chained=chained)
        times.append(time.perf_counter() - t0)
    return sorted(times)
