"""Layers chained on each core (assemble(by_dependencies=True)): the bytes a task
reads and writes (ir/npu/footprint.py) against brute-force byte sets, the jobs'
order against every dependency of the emitted tasks, and fp16 chains of row-banded
convolutions run as one chained kick per job on the simulator against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rkc.compiler.npu import api
from rkc.compiler.npu.assemble import assemble
from rkc.compiler.npu.dispatch import emit
from rkc.ir.npu.footprint import Span
from rkc.runtime import sim

from npu.emit_cases import conv_reference, fp16_data, needs_fp16_depthwise_writer, run_sim


def _bytes(s: Span) -> set[int]:
    return {s.start + i * s.stride + b for i in range(s.count) for b in range(s.length)}


@settings(max_examples=300, deadline=None)
@given(st.tuples(*[st.integers(0, 200), st.integers(1, 40), st.integers(1, 6), st.integers(0, 60)] * 2),
       st.booleans())
def test_spans_overlap_exactly_when_they_share_a_byte(v, same_buffer):
    a = Span("x", v[0], v[1], v[2], v[3])
    b = Span("x" if same_buffer else "y", *v[4:])
    assert a.overlaps(b) == b.overlaps(a) == bool(same_buffer and _bytes(a) & _bytes(b))


def _conv(x: api.Feature, name: str, out_c: int, k: int, seed: int, stride: int = 1, dw: bool = False):
    h, w = (x.height + 2 * (k // 2) - k) // stride + 1, (x.width + 2 * (k // 2) - k) // stride + 1
    y = api.Feature(f"{name}.out", 0, x.channels if dw else out_c, h, w, "fp16")
    wt = fp16_data((k, k, x.channels) if dw else (out_c, k, k, x.channels), seed, 1 / k)
    pad = (k // 2,) * 4
    op = api.Conv2D(x, wt, y, (stride, stride), pad, dw, None, api.Epilogue(activation="relu"), name)
    return op, wt, pad


def _chain(c: int, h: int, w: int):
    """An inverted-residual-like chain: 1x1 expand, 3x3 depthwise, 1x1 project,
    1x1 expand, 3x3/2 depthwise, 1x1 project."""
    x = api.Feature("x", 0, c, h, w, "fp16")
    ops, f = [], x
    for i, (out_c, k, s, dw) in enumerate([(4 * c, 1, 1, False), (0, 3, 1, True), (c, 1, 1, False),
                                           (4 * c, 1, 1, False), (0, 3, 2, True), (2 * c, 1, 1, False)]):
        op, wt, pad = _conv(f, f"l{i}", out_c, k, 10 + i, s, dw)
        ops.append((op, wt, pad, s, dw))
        f = op.output
    return x, ops


def _brute_dependencies_hold(results, asm) -> None:
    """Every pair of tasks touching a common byte, one of them writing it, runs in
    program order: the earlier one in an earlier job, or earlier in the same job."""
    where = {}  # (result, task) -> (job, position)
    for j, job in enumerate(asm.jobs):
        for p, ref in enumerate(job.tasks):
            for ri, refs in enumerate(asm.task_refs):
                for t, r in enumerate(refs):
                    if r.entry == ref.entry:
                        where[(ri, t)] = (j, p)
    tasks = [(ri, t, res.tasks[t].access) for ri, res in enumerate(results) for t in range(len(res.tasks))]
    sets = {(ri, t): ({(s.buffer, b) for s in a.reads for b in _bytes(s)},
                      {(s.buffer, b) for s in a.writes for b in _bytes(s)}) for ri, t, a in tasks}
    for n, (ri, t, _) in enumerate(tasks):
        for rj, u, _ in tasks[n + 1:]:
            if ri == rj:
                continue
            (r1, w1), (r2, w2) = sets[(ri, t)], sets[(rj, u)]
            if w1 & (r2 | w2) or r1 & w2:
                assert where[(ri, t)] < where[(rj, u)], ((ri, t), (rj, u))


def test_row_bands_chain_on_each_core_and_keep_every_dependency():
    x, ops = _chain(16, 24, 12)
    results = [emit(op) for op, *_ in ops]
    asm = assemble(results, merge_jobs=True, by_dependencies=True)
    _brute_dependencies_hold(results, asm)
    per_layer = sum(len(r.jobs) for r in results)
    assert len(asm.jobs) < per_layer  # the 1x1 layers joined the depthwise layers' jobs
    assert {j.lane for j in asm.jobs} == {0, 1, 2}


def test_a_chained_row_band_program_matches_numpy_on_the_simulator():
    needs_fp16_depthwise_writer()
    x, ops = _chain(16, 24, 12)
    results = [emit(op) for op, *_ in ops]
    xv = fp16_data((16, 24, 12), 1)
    got = run_sim(results, {"x": (x, xv)}, chained=True, by_dependencies=True)
    ref = xv.astype(np.float64)
    for op, wt, pad, s, dw in ops:
        ref = np.maximum(conv_reference(ref.astype(np.float16), wt, (s, s), pad, dw, 0), 0)
        out = got.feature(op.output).astype(np.float64)
        np.testing.assert_allclose(out, ref, rtol=5e-3, atol=5e-3 * max(1.0, np.abs(ref).max()))
        ref = out  # the next layer reads what the NPU stored


def test_a_task_without_known_bytes_is_a_barrier():
    x, ops = _chain(16, 24, 12)
    results = [emit(op) for op, *_ in ops]
    blind = results[2]
    for t in blind.tasks:
        t.access, t.touches = None, []
    asm = assemble(results, merge_jobs=True, by_dependencies=True)
    before = {j for j in range(len(asm.jobs)) for r in asm.task_refs[:2] for ref in r
              if ref.entry in {t.entry for t in asm.jobs[j].tasks}}
    blind_jobs = {j for j in range(len(asm.jobs)) for ref in asm.task_refs[2]
                  if ref.entry in {t.entry for t in asm.jobs[j].tasks}}
    after = {j for j in range(len(asm.jobs)) for r in asm.task_refs[3:] for ref in r
             if ref.entry in {t.entry for t in asm.jobs[j].tasks}}
    assert max(before) < min(blind_jobs) and max(blind_jobs) <= min(after)
