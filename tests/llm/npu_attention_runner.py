"""Run a prefill chunk's attention as compiler/llm/npu_attention.py lowers it
(per KV head: the scores' fp16 GEMM on the NPU, the softmax on the CPU, the
values' fp16 GEMM on the NPU) on a Device: the KV cache written in the
layouts the products read, the chunk's queries written, the two NPU phases
submitted with the simulator's counters checked against the plan's
(tests/perf_agreement.py), the output read back as [T, H * Dv]."""

from __future__ import annotations

import numpy as np

from rkc.compiler.llm.npu_attention import AttentionShape, HeadBuffers, products
from rkc.compiler.npu import api
from rkc.compiler.npu.assemble import assemble
from rkc.compiler.npu.dispatch import emit
from rkc.ir.npu import layout
from rkc.ir.npu.perf import JobCost
from rkc.runtime.device import Job, Task
from rkc.runtime.llm import npu_attention as host
from perf_agreement import assert_jobs_match


def emitted(shape: AttentionShape, kv_heads: int) -> tuple[list[api.EmitResult], list[api.EmitResult]]:
    """Every KV head's scores and values GEMMs, emitted."""
    qk, pv = [], []
    for h in range(kv_heads):
        s, v = products(shape, HeadBuffers.named(f"chunk.h{h}", f"cache.h{h}"), f"attn.h{h}")
        qk.append(emit(s, api.EmitOptions()))
        pv.append(emit(v, api.EmitOptions()))
    return qk, pv


class Phase:
    """One assembled NPU phase (independent products: one chained job per core)."""

    def __init__(self, results: list[api.EmitResult], region: str) -> None:
        self.results = results
        self.asm = assemble(results, region=region, independent=True)

    def extents(self) -> dict[str, int]:
        need: dict[str, int] = {self.asm.region: self.asm.nbytes}
        for r in self.results:
            for name, end in r.extents().items():
                need[name] = max(need.get(name, 0), end)
        return need

    def place(self, bos: dict) -> None:
        entries = self.asm.entries.copy()
        for rel in self.asm.relocations:
            value = bos[rel.target].iova + rel.offset
            e = int(entries[rel.entry])
            entries[rel.entry] = np.uint64((e & ~(0xFFFFFFFF << 16)) | (value << 16))
        bos[self.asm.region].host[:self.asm.nbytes] = entries.view(np.uint8)

    def submit(self, device, bos: dict) -> None:
        base = bos[self.asm.region].iova
        jobs = [Job([Task(base + t.entry * 8, t.count) for t in j.tasks], [bos[b] for b in j.reads],
                    [bos[b] for b in j.writes], j.lane, f"job {i}") for i, j in enumerate(self.asm.jobs)]
        device.run(jobs, chained=True)
        if hasattr(device, "last_jobs"):  # the simulator counted what the plan says it costs
            plan = {ref.entry: r.tasks[t] for r, refs in zip(self.results, self.asm.task_refs)
                    for t, ref in enumerate(refs)}
            planned = [JobCost(j.lane, 1, [plan[t.entry].cost() for t in j.tasks]) for j in self.asm.jobs]
            assert_jobs_match(planned, device.last_jobs, "attention products")


def attend(device, q: np.ndarray, keys: np.ndarray, values: np.ndarray, kpos: np.ndarray, pos: np.ndarray,
           scale: float, slots: int, window: int = 0) -> np.ndarray:
    """Attention of q [T, H, D] at positions pos [T] over the keys/values
    [P, Hkv, D(v)] at positions kpos [P] (the chunk's own among them), stored
    into a cache of `slots` slots (`window`: a ring) before the products run:
    out [T, H * Dv]."""
    t, h, d = q.shape
    p, hkv, dv = values.shape
    run = ChunkRun(device, AttentionShape(t, h // hkv, d, dv, slots), hkv, window)
    for c0 in range(0, p, t):  # stored as chunks of the program's rows would store them
        run.cache.store(keys[c0:c0 + t], values[c0:c0 + t], kpos[c0:c0 + t])
    return run.attend(q, pos, scale)


class ChunkRun:
    """A chunk program's attention of one layer on a device: the two phases
    assembled and their buffers allocated once, the cache (LayerCache over
    the cache buffers' host views) kept across calls."""

    def __init__(self, device, shape: AttentionShape, kv_heads: int, window: int = 0) -> None:
        self.device, self.shape, self.kv_heads, self.window = device, shape, kv_heads, window
        qk, pv = emitted(shape, kv_heads)
        self.phases = Phase(qk, "regcmd.qk"), Phase(pv, "regcmd.pv")
        k_elems, v_elems = host.cache_elements(shape.keys, shape.head_dim, shape.value_dim)
        self.heads = [HeadBuffers.named(f"chunk.h{hh}", f"cache.h{hh}") for hh in range(kv_heads)]
        need: dict[str, int] = {}
        for ph in self.phases:
            for name, end in ph.extents().items():
                need[name] = max(need.get(name, 0), end)
        for b in self.heads:
            for name, elems in ((b.keys, k_elems), (b.values, v_elems),
                                (b.probs, host.probs_elements(shape.query_rows, shape.keys))):
                need[name] = max(need.get(name, 0), 2 * elems)
        self.bos = {name: device.create_bo(layout.align(size, 16)) for name, size in need.items()}
        for bo in self.bos.values():
            device.prepare_cpu_access(bo)
            bo.host[:] = 0
        for ph in self.phases:
            ph.place(self.bos)
        self.cache = host.LayerCache([self.bos[b.keys].host for b in self.heads],
                                     [self.bos[b.values].host for b in self.heads], shape.keys,
                                     shape.head_dim, shape.value_dim, window)
        # (the BOs stay in the CPU's hands between calls; each call hands them to the NPU and back)

    def attend(self, q: np.ndarray, pos: np.ndarray, scale: float) -> np.ndarray:
        device, bos, shape = self.device, self.bos, self.shape
        t, h, _ = q.shape
        g, m, dv = shape.group, shape.query_rows, shape.value_dim
        for hh, b in enumerate(self.heads):
            host.write_queries(q, hh * g, g, bos[b.queries].host.view(np.float16))
        for bo in bos.values():
            device.finish_cpu_access(bo)
        self.phases[0].submit(device, bos)
        qpos = np.repeat(np.asarray(pos, np.int64), g)
        for b in self.heads:
            for name in (b.scores, b.probs):
                device.prepare_cpu_access(bos[name])
            host.softmax_into_probs(bos[b.scores].host.view(np.float32), bos[b.probs].host, shape.keys,
                                    self.cache.covered(shape.keys), qpos, scale, self.window)
            for name in (b.scores, b.probs):
                device.finish_cpu_access(bos[name])
        self.phases[1].submit(device, bos)
        for bo in bos.values():
            device.prepare_cpu_access(bo)
        out = np.empty((t, self.kv_heads, g, dv), np.float32)
        for hh, b in enumerate(self.heads):
            out[:, hh] = host.read_output(bos[b.out].host.view(np.float32), m, dv).reshape(t, g, dv)
        return out.reshape(t, h * dv)
