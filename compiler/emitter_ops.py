"""NPU lowering: graph ops -> NPU groups, and NPU segments -> one NPU program step each.

* `plan_groups` finds every op the NPU can run: an anchor (Conv, Gemm,
  MatMul) plus what folds into its DPU epilogue (a constant per-channel bias
  Add, a residual Add of a same-shaped tensor, ReLU / ReLU6 / Clip; an
  element-wise op takes a ReLU / Clip after it the same way;
  compiler/emitter_graph.py reads them off the graph), builds the emitter
  operation with symbolic buffers (one per tensor, "<tensor>@npu";
  compiler/emitter_builders.py) and emits it once; the builder's or emitter's
  refusal is the reason the op stays on the CPU.
* `lower_segment` assembles the groups of one segment into one regcmd run
  (tails linked, consecutive single-job ops merged into one chained job) and
  records the program step. Tensor copies between host and NPU are made by
  compiler/program_steps.py at segment edges.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field, replace
from typing import Callable

import numpy as np

from rkc.compiler import cost
from rkc.compiler.emitter_builders import BUILDERS
from rkc.compiler.emitter_graph import (lowering, lut_function, epilogue_activation, npu_layout, EMIT_OPTIONS,
                                        CHAINABLE, npu_name, relaid_name, device_dtype, Refused, Tail, epilogue_tails)
from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.assemble import assemble, job_costs, job_groups
from rkc.compiler.partition import partition
from rkc.compiler.quantize import MOVES_VALUES
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.npu import geometry
from rkc.ir.npu.perf import JobCost, PerfModel
from rkc.ir.program import Job, Step, TaskRef
from rkc.ir.types import DType


@dataclass
class NpuGroup:
    anchor: int
    ops: list[int]  # op indices: the anchor, then what its epilogue absorbed
    reads: dict[str, str]  # IR tensor -> NPU layout ("native" / "native-gemm") it is read in
    output: str
    output_layout: str
    result: api.EmitResult
    dtype: str  # what the group computes in: "int8" or "fp16" (mixed int8 programs have both)
    notes: list[str] = field(default_factory=list)
    # a tensor the group reads in another layout than its producer writes (a gate as
    # run-time depthwise weights): the host rewrites it, so the group starts a new segment
    relaid: tuple[str, ...] = ()

    @property
    def segment_kind(self) -> str:
        """Groups of one kind may share a segment (compiler/partition.py)."""
        return f"{self.dtype}, host-relaid reads" if self.relaid else self.dtype

    def npu_name(self, tensor: str, precision: str) -> str:
        """This group's NPU buffer of `tensor` in a program of `precision`."""
        return npu_name(tensor, self.dtype, precision)

    def read_name(self, tensor: str, precision: str) -> str:
        """The NPU buffer this group reads `tensor` from (its host-written copy where relaid)."""
        if tensor in self.relaid:
            return relaid_name(tensor, self.reads[tensor], self.dtype, precision)
        return self.npu_name(tensor, precision)


def _emit(graph: Graph, i: int, tail: Tail, precision: str, program: str,
          options: api.EmitOptions) -> NpuGroup:
    op = graph.ops[i]
    operation = lowering(op).operation
    api_op, reads = BUILDERS[operation](graph, i, tail, precision, program)
    if isinstance(api_op, api.Pool) and api_op.method == "avg":
        # averages stay depthwise convolutions (the DPU divides exactly) even where the PPU completes
        options = replace(options, ppu_completes=False)
    result = emit(api_op, options)
    if result.cpu:
        raise Refused("the emitter needs a CPU finishing step")
    if isinstance(api_op, api.Pool) and api_op.method == "max" and not result.uses_ppu:
        _max_taps_pay(api_op, result)
    layout = "native-gemm" if operation is api.Gemm else npu_layout(graph, tail.output)
    relaid = tuple(t for t, how in reads.items() if how != npu_layout(graph, t))
    return NpuGroup(i, [i, *tail.ops], reads, tail.output, layout, result, device_dtype(precision),
                    list(result.notes), relaid)


def _max_taps_pay(pool: api.Pool, result: api.EmitResult) -> None:
    """A max pool without the PPU is a run of DPU tasks, each writing and re-reading the
    running max (compiler/npu/pool.py): it stays on the NPU only where its modelled NPU
    time is below the host time of the CPU kernel it replaces (compiler/cost.py)."""
    f = pool.input
    npu_s = PerfModel().submission_seconds(result.cost_jobs(CHAINABLE[f.dtype]))
    host_s = cost.max_pool_host_seconds(f.dtype, f.channels * f.height * f.width)
    if npu_s > host_s:
        raise Refused(f"max pooling as DPU taps ({len(result.tasks)} tasks) models {npu_s * 1e3:.3f} ms of NPU "
                      f"time, the CPU kernel ~{host_s * 1e3:.3f} ms (the PPU pools fp16 only, on a kernel "
                      f"completing its tasks: --kernel-ppu-irq)")


def _ew_activation(op) -> bool:
    """ReLU or Clip: what the EW stage applies after an element-wise op."""
    return epilogue_activation(op) == "relu" or op.type == "Clip"


def _passes_values(op) -> bool:
    """A CPU op that hands its input's values on (Concat, Split, MaxPool, Resize...)."""
    return op.type in ("Concat", "Split", "MaxPool", "Resize", "Reshape", "Flatten", "Identity")


def _has_lut(graph: Graph, tail: Tail) -> bool:
    return any(lut_function(graph.ops[j]) is not None for j in tail.ops)


def plan_groups(graph: Graph, precision: str, candidate: Callable[[int], bool],
                fp16_anchors: frozenset[int] | set[int] = frozenset(), options: api.EmitOptions = EMIT_OPTIONS
                ) -> tuple[dict[int, NpuGroup], dict[int, str]]:
    """Groups keyed by every op they cover; reasons for candidates left on the CPU.
    In an int8 program, groups anchored at `fp16_anchors` compute in fp16."""
    users: dict[str, list[int]] = {}
    for j, op in enumerate(graph.ops):
        for name in op.present_inputs():
            users.setdefault(name, []).append(j)
    groups: dict[int, NpuGroup] = {}
    reasons: dict[int, str] = {}
    table_fp16: set[str] = set()  # outputs of int8-program groups in fp16 for a lookup table
    # maps an int8 program holds in fp16 anyway: fp16 groups' outputs, what fp16 anchors read
    fp16_maps: set[str] = {t for a in fp16_anchors for t in graph.ops[a].present_inputs()}
    for i, op in enumerate(graph.ops):
        if _passes_values(op) and any(t in table_fp16 for t in op.present_inputs()):
            table_fp16.update(op.outputs)
        if op.type in MOVES_VALUES and all(t in fp16_maps for t in op.present_inputs()):
            fp16_maps.update(op.outputs)  # slices of one fp16 buffer
        how = lowering(op)
        if how is None or not how.anchors or not candidate(i) or i in groups:
            continue
        if how.operation in (api.Conv2D, api.Gemm, api.ConvTranspose2D):  # the anchors with an epilogue of their own
            gemm = how.operation is api.Gemm
            w = graph.const_value(op.inputs[1])
            if w is None:  # a run-time B (compiler/emitter_matmul.py): only its shape matters here
                w = np.broadcast_to(np.float16(0), graph.tensors[op.inputs[1]].type.shape)
            channels = (w.shape[0] if op.type == "Conv" else w.shape[1] if op.type == "ConvTranspose" else
                        (w.shape[0] if op.type == "Gemm" and op.attrs.get("transB") else w.shape[-1]))
            tails = epilogue_tails(graph, i, users, lambda j: candidate(j) and j not in groups, channels, gemm)
        elif how.operation is api.Elementwise:
            # the EW stage's ReLU / ReLU-X after the combination (a residual block's ReLU
            # when its Add fuses into neither convolution)
            tails = epilogue_tails(graph, i, users, lambda j: candidate(j) and j not in groups and _ew_activation(graph.ops[j]),
                           0, False)
        else:
            tails = [Tail(output=op.outputs[0])]  # no epilogue of its own
        # a group meant for fp16 the emitter cannot build in fp16 stays in the program's dtype
        tries = [(own, tail) for own in dict.fromkeys(("fp16" if i in fp16_anchors else precision, precision))
                 for tail in tails]
        lut_side = precision == "int8" and (_has_lut(graph, tails[0]) or how.operation is api.LocalResponseNorm or
                                            any(t in table_fp16 for t in op.present_inputs()))
        if lut_side:
            # the lookup table is documented on fp16 data only (dpu-lut-activation.md; int8 is
            # hardware question Q22): an int8 group whose epilogue needs one computes in fp16,
            # rather than leave the activation to the CPU; a group reading such a group's
            # output stays in fp16 rather than convert it on the CPU (a tensor a concatenation,
            # split or pool passes on counts as its source's)
            tries.insert(0, ("fp16", tails[0]))
        elif precision == "int8" and op.type == "MatMul" and graph.const_value(op.inputs[1]) is None:
            tries.insert(0, ("fp16", tails[0]))  # a run-time B is multiplied in fp16 only
        elif precision == "int8" and op.type == "MaxPool" and op.inputs[0] in fp16_maps:
            # a max pool of a map held in fp16 anyway (an fp16 group makes it or reads it)
            # pools that copy (the PPU pools fp16 only, Q14), or stays on the CPU, which pools
            # it too: an int8 copy would cost the conversions on top
            tries = [("fp16", tails[0])]
        for own, tail in tries:
            try:
                group = _emit(graph, i, tail, own, precision, options)
            except Refused as exc:
                reasons[i] = str(exc)
                continue
            except UnsupportedError as exc:
                reasons[i] = f"the emitter refuses it: {exc}"
                continue
            for j in group.ops:
                groups[j] = group
            reasons.pop(i, None)
            if lut_side and group.dtype == "fp16":
                table_fp16.add(group.output)
            if precision == "int8" and group.dtype == "fp16":
                fp16_maps.add(group.output)
            break
    return groups, reasons


# -- segments -> program steps ----------------------------------------------------------------
BUSY = PerfModel(kick_overhead_s=0.0)  # a layer's modelled cycles: its tasks on their cores, kicks apart


@dataclass
class SegmentLowering:
    """What compiler/program_steps.py needs back from one segment."""

    step: Step
    scratch: list[tuple[str, int]]  # emitter scratch buffers (name, bytes) live during the step
    extents: dict[str, int]  # symbolic buffer -> bytes the tasks touch
    zero_rows: list[str] = field(default_factory=list)  # maps a window reads over their zero rows


def lower_segment(graph: Graph, groups: list[NpuGroup], builder, name: str, precision: str,
                  independent: bool = False) -> SegmentLowering:
    """`independent`: no group reads what another writes (an LLM segment's
    products): each core's tasks become one job (compiler/npu/assemble.py)."""
    results = [g.result for g in groups]
    chained = all(CHAINABLE[g.dtype] for g in groups)
    asm = assemble(results, region="regcmd", align=64, **_grouping(chained, independent))
    base = builder.add_regcmd(asm.entries)
    for r in results:
        for c in r.constants:
            builder.weight(c.name, c.data, [len(c.data)], DType.UINT8, "packed")
    for rel in asm.relocations:
        if rel.target == asm.region:
            builder.relocate(base + rel.entry, "regcmd", rel.offset + base * 8)
        else:
            builder.relocate(base + rel.entry, rel.target, rel.offset)
    planned = {ref.entry: r.tasks[t] for r, refs in zip(results, asm.task_refs) for t, ref in enumerate(refs)}
    task_costs = [[list(astuple(planned[t.entry].cost())) for t in job.tasks] for job in asm.jobs]
    scratch = [(s.name, s.size) for r in results for s in r.scratch]
    # an emitter's own scratch is placed with the step (ModuleBuilder.append_segment)
    emitter_scratch = {n for n, _ in scratch}

    def region(buffer: str) -> str:
        return "scratch" if buffer in emitter_scratch else builder.region_of(buffer)

    jobs = []
    for job in asm.jobs:
        tasks = [TaskRef("regcmd", base + t.entry, t.count) for t in job.tasks]
        jobs.append(Job(tasks, sorted({region(b) for b in job.reads}), sorted({region(b) for b in job.writes}),
                        job.lane))
    layers = []
    for g in groups:
        counters = g.result.counters
        op = graph.ops[g.anchor]
        layers.append({
            "name": op.name or f"{op.type}:{op.outputs[0]}",
            "op": "+".join(graph.ops[j].type for j in g.ops),
            "macs": int(counters.macs) or cost.op_macs(graph, op),
            "ddr_bytes": sum(t.cost().dma_bytes for t in g.result.tasks),  # regcmd fetches included
            # of those, written by the DPU (the rest is read: features, weights, regcmd)
            "ddr_written": sum(sum(t.counters.dma_write.values()) for t in g.result.tasks),
            "cycles": round(BUSY.submission_seconds(g.result.cost_jobs(chained=True)) * BUSY.clock_hz),
            "dtype": g.dtype,
            "tasks": len(g.result.tasks),
            "notes": g.notes,
        })
    extents: dict[str, int] = {}
    for r in results:
        for buf, end in r.extents().items():
            extents[buf] = max(extents.get(buf, 0), end)
    reads = sorted({g.read_name(t, precision) for g in groups for t in g.reads})
    outputs = sorted({g.npu_name(g.output, precision) for g in groups})
    step = Step(kind="npu", name=name, jobs=jobs, chained=chained, inputs=reads, outputs=outputs,
                stats={"layers": layers, "task_costs": task_costs, "tasks": sum(len(j.tasks) for j in jobs),
                       "kicks_stock": sum(len(j.tasks) for j in jobs),
                       "kicks_chained": len(jobs) if chained else sum(len(j.tasks) for j in jobs)})
    return SegmentLowering(step, scratch, extents, _zero_rows_read(results, builder))


def _grouping(chained: bool, independent: bool) -> dict:
    """How a segment's jobs are formed (compiler/npu/assemble.py): chained, a layer's
    job joins its core's previous one wherever it reads only what that job or earlier
    ones wrote (row bands kept from layer to layer)."""
    return dict(merge_jobs=True, independent=independent, by_dependencies=chained)


def segment_jobs(groups: list[NpuGroup], independent: bool = False) -> list[JobCost]:
    """A segment's jobs as lower_segment submits them, for the performance model."""
    results = [g.result for g in groups]
    chained = all(CHAINABLE[g.dtype] for g in groups)
    return job_costs(results, job_groups(results, **_grouping(chained, independent)), chained)


def segment_groups(ops: list[int], groups: dict[int, NpuGroup]) -> list[NpuGroup]:
    """The groups of a segment (its ops, compiler/partition.py) in the order they run."""
    return [groups[i] for i in ops if groups[i].anchor == i]


def npu_steps(graph: Graph, placements: list, groups: dict[int, NpuGroup]) -> list:
    """The program's steps (compiler/partition.py): segments of NPU groups of one kind,
    CPU ops between them."""
    return partition(graph, lambda i: groups[i].segment_kind if placements[i].device == "npu" else None,
                     lambda i: groups[i].anchor if placements[i].device == "npu" else None)


def plan_npu_seconds(graph: Graph, placements: list, groups: dict[int, NpuGroup],
                     model: PerfModel | None = None) -> float:
    """A placement's modelled NPU time: every segment's jobs as they will be submitted."""
    model = model or PerfModel()
    return sum(model.submission_seconds(segment_jobs(segment_groups(s.ops, groups)))
               for s in npu_steps(graph, placements, groups) if s.device == "npu")


def _zero_rows_read(results: list[api.EmitResult], builder) -> list[str]:
    """The maps of few rows some convolution of the segment reads with the zero rows
    stored below them (`zero_padded_input`): the memory plan must keep those rows zero."""
    kept = set()
    for r in results:
        x = r.op.input if isinstance(r.op, api.Conv2D) else None
        info = builder.tensors.get(x.buffer) if x is not None else None
        # read over its zero rows: the whole stored map (a taller grid of its positions, a
        # view, is row_padded and reads only them)
        if info is not None and geometry.zero_rows(info.shape, info.layout) and not x.row_padded \
                and x.height > info.shape[2]:
            kept.add(x.buffer)
    return sorted(kept)
