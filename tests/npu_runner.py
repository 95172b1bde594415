"""Run emitted NPU operations on a Device (the simulator in tests): allocate one
BO per buffer, fill inputs and constants, apply the relocations, submit the
assembled jobs, run the CPU steps, read features back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.npu.assemble import assemble
from rkc.compiler.npu.cpu_finish import run_cpu_step
from rkc.ir.npu import layout
from rkc.ir.npu.perf import JobCost
from perf_agreement import assert_jobs_match
from rkc.runtime.device import Job, Task


def feature_array(f: api.Feature, raw: np.ndarray) -> np.ndarray:
    """[C, H, W] values of feature `f` from the bytes of its buffer."""
    view = layout.feature_view(raw[f.offset:], f.channels, f.height, f.width, api.NUMPY[f.dtype],
                               surface_stride=f.surface_bytes)
    return layout.unpack_feature(np.ascontiguousarray(view), f.channels)


def put_feature(f: api.Feature, raw: np.ndarray, values: np.ndarray) -> None:
    if f.dtype == "int4":  # nibble-packed atoms (ir/npu/layout.py), dense
        native = layout.pack_feature_int4(np.asarray(values)).reshape(-1)
        raw[f.offset:f.offset + native.size] = native
        return
    native = layout.pack_feature(np.asarray(values, api.NUMPY[f.dtype]))
    view = layout.feature_view(raw[f.offset:], f.channels, f.height, f.width, api.NUMPY[f.dtype],
                               surface_stride=f.surface_bytes)
    view[...] = native


@dataclass
class Run:
    device: object
    bos: dict
    kicks: int = 0

    def bytes_of(self, name: str) -> np.ndarray:
        bo = self.bos[name]
        self.device.prepare_cpu_access(bo)
        data = bo.host.copy()
        self.device.finish_cpu_access(bo)
        return data

    def feature(self, f: api.Feature) -> np.ndarray:
        return feature_array(f, self.bytes_of(f.buffer))


def run(results, device, inputs: dict[str, tuple[api.Feature, np.ndarray]] | None = None,
        sizes: dict[str, int] | None = None, chained: bool = False, merge_jobs: bool = False,
        guard: int = 0, independent: bool = False, by_dependencies: bool = False) -> Run:
    """`inputs`: buffer -> (feature, values) written before the run; `sizes`:
    minimum buffer sizes; `guard` extra bytes past every buffer's extent;
    `merge_jobs`, `independent`, `by_dependencies`: as assemble() groups the jobs."""
    results = list(results)
    asm = assemble(results, merge_jobs=merge_jobs, independent=independent, by_dependencies=by_dependencies)
    need: dict[str, int] = dict(sizes or {})
    for r in results:
        for name, end in r.extents().items():
            need[name] = max(need.get(name, 0), end)
    for name, (f, _) in (inputs or {}).items():
        need[name] = max(need.get(name, 0), f.offset + f.nbytes)
    need[asm.region] = asm.nbytes
    bos = {name: device.create_bo(layout.align(size + guard, 16)) for name, size in need.items()}
    for bo in bos.values():  # the CPU fills them: its writes need the bracket (rocket PREP_BO/FINI_BO)
        device.prepare_cpu_access(bo)
    for name, (f, values) in (inputs or {}).items():
        put_feature(f, bos[name].host, values)
    for r in results:
        for c in r.constants:
            bos[c.name].host[:len(c.data)] = np.frombuffer(c.data, np.uint8)
    entries = asm.entries.copy()
    for rel in asm.relocations:
        value = bos[rel.target].iova + rel.offset
        e = int(entries[rel.entry])
        entries[rel.entry] = np.uint64((e & ~(0xFFFFFFFF << 16)) | (value << 16))
    bos[asm.region].host[:asm.nbytes] = entries.view(np.uint8)
    for bo in bos.values():
        device.finish_cpu_access(bo)
    base = bos[asm.region].iova
    done = 0
    plan = {ref.entry: r.tasks[t] for r, refs in zip(results, asm.task_refs) for t, ref in enumerate(refs)}
    steps = list(asm.cpu_steps)
    runner = Run(device, bos)

    def flush(upto: int) -> None:
        nonlocal done
        if upto <= done:
            return
        jobs = [Job([Task(base + t.entry * 8, t.count) for t in j.tasks],
                    [bos[b] for b in j.reads], [bos[b] for b in j.writes], j.lane, f"job {i}")
                for i, j in enumerate(asm.jobs[done:upto], start=done)]
        device.run(jobs, chained=chained)
        if hasattr(device, "last_jobs"):  # the simulator: its counters must be the plan's (tests/perf_agreement.py)
            planned = [JobCost(j.lane, 1 if chained else len(j.tasks), [plan[t.entry].cost() for t in j.tasks])
                       for j in asm.jobs[done:upto]]
            assert_jobs_match(planned, device.last_jobs, "emitted ops")
        done = upto

    for step, after in steps:
        flush(max(after) + 1 if after else done)

        def write(f, values, run=runner):
            raw = run.bytes_of(f.buffer)
            put_feature(f, raw, values)
            bo = bos[f.buffer]
            device.prepare_cpu_access(bo)
            bo.host[:] = raw
            device.finish_cpu_access(bo)

        run_cpu_step(step, runner.feature, write)
    flush(len(asm.jobs))
    return runner
