"""The graph pipeline (ONNX and IR text; `rkc compile` reaches it through
compiler/driver.compile_model). Its body is the table of contents:

  load -> passes -> quantize -> place [-> mixed precision -> place] -> partition
  -> lower -> memory plan -> assemble -> write (atomically)

Each stage lives in its own module; this file only sequences them and
reports progress and what was done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

from rkc.compiler import emitter_norm, program_steps
from rkc.compiler.emitter_graph import emit_options
from rkc.compiler.npu.api import LocalResponseNorm
from rkc.ir.program import PPU_COMPLETION_KEY
from rkc.compiler.frontend import load_graph
from rkc.compiler.lone_ops import keep_lone_cheap_ops_on_cpu
from rkc.compiler.mixed_precision import choose_fp16, merge_islands, whole_fp16_wins
from rkc.compiler.module_builder import ModuleBuilder
from rkc.compiler.emitter_ops import npu_steps
from rkc.compiler.passes import heads, run_passes
from rkc.compiler.placement import Placement, place_ops
from rkc.compiler.precision import DEFAULT_PRECISION, PRECISIONS
from rkc.compiler.quantize import quantize
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.npu import hw
from rkc.ir.rkbin import write_rkbin

@dataclass
class BuildOptions:
    precision: str = DEFAULT_PRECISION["onnx"]
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    calib: str | Path | None = None
    cpu_only: bool = False  # place every op on the CPU (debugging, references)
    bind: Mapping[str, object] = field(default_factory=dict)  # inputs turned into constants (name -> array)
    cores: int = hw.CORES  # NPU cores the program's tasks are spread over (rkc compile --cores)
    ppu_irq: bool = False  # the target kernel completes PPU tasks (kernel/patches/0005; --kernel-ppu-irq)
    # attention's batched products as NPU GEMMs, split per head: None (the default) where every split
    # product then runs on the NPU (_place), True always (--npu-attention), False never
    npu_attention: bool | None = None
    # inputs taken as uint8 NHWC images: name -> (per-channel mean, std) (rkc compile --image-input)
    image_inputs: Mapping[str, tuple[Sequence[float], Sequence[float]]] = field(default_factory=dict)
    # int8: never the whole program in fp16, even where it models faster (rkc compile --int8-only)
    int8_only: bool = False


@dataclass
class BuildReport:
    source: str
    output: str
    precision: str
    placements: list[Placement]
    segments: int
    cpu_steps: int
    npu_tasks: int
    conversions: int
    size: int
    seconds: float
    stage_seconds: dict[str, float]
    precision_note: str = ""  # why the program's precision is not the one asked for
    ppu: bool = False  # some task runs on the PPU (the kernel must complete PPU tasks)

    @property
    def ops_npu(self) -> int:
        return sum(p.device == "npu" for p in self.placements)

    @property
    def ops_cpu(self) -> int:
        return sum(p.device == "cpu" for p in self.placements)

    @property
    def ops_view(self) -> int:
        return sum(p.device == "view" for p in self.placements)

    def ops_in(self, dtype: str) -> int:
        return sum(p.device == "npu" and p.dtype == dtype for p in self.placements)

    def _dtypes(self) -> str:
        if self.precision != "int8":
            return ""
        return f" ({self.ops_in('int8')} int8, {self.ops_in('fp16')} fp16)"

    def summary(self) -> list[str]:
        return [
            f"compiled {self.source} -> {self.output} ({self.precision}) in {self.seconds:.1f} s",
            f"  ops: {self.ops_npu} on the NPU{self._dtypes()}, {self.ops_view} view(s), {self.ops_cpu} on the CPU",
            f"  steps: {self.segments} NPU segment(s) with {self.npu_tasks} task(s), {self.cpu_steps} CPU op step(s), "
            f"{self.conversions} layout conversion(s)",
            f"  file: {self.size / 1e6:.2f} MB",
        ] + ([f"  precision: {self.precision_note}"] if self.precision_note else [])


Progress = Callable[[str], None]


VIEW_REASON = "no step: its pieces are channel slices of one NPU buffer (producers write their slice)"


def build(source: str | Path, output: str | Path, options: BuildOptions,
          progress: Progress = lambda stage: None) -> BuildReport:
    if options.precision not in PRECISIONS:
        raise UnsupportedError(f"--precision {options.precision!r}: choose from {', '.join(PRECISIONS)}")
    start = time.perf_counter()
    times: dict[str, float] = {}

    def stage(name: str, fn, *args):
        progress(name)
        t = time.perf_counter()
        result = fn(*args)
        times[name] = time.perf_counter() - t
        return result

    graph, placements, groups, precision, note = plan(source, options, stage)
    steps = stage("partition", npu_steps, graph, placements, groups)
    metadata = {"source": Path(source).name, "precision": precision, "producer": "rkc",
                "graph": graph.name, "cores": options.cores}
    ppu = any(g.result.uses_ppu for g in groups.values())
    if ppu:
        metadata[PPU_COMPLETION_KEY] = True  # PPU-only tasks: the loader refuses a kernel without patch 0005
    builder = ModuleBuilder(metadata=metadata)
    stats = stage("lower", program_steps.lower_program, graph, steps, builder, precision, groups)
    for i in stats.views:
        placements[i] = Placement(graph.ops[i], "view", VIEW_REASON)
    module, blobs, _plans = stage("memory plan + assemble", builder.finish)
    size = stage("write", write_rkbin, output, module, blobs)
    return BuildReport(str(source), str(output), precision, placements,
                       segments=sum(s.device == "npu" for s in steps), cpu_steps=stats.cpu_steps,
                       npu_tasks=stats.npu_tasks, conversions=stats.conversions, size=size, seconds=time.perf_counter() - start,
                       stage_seconds=times, precision_note=note, ppu=ppu)


class Plan(NamedTuple):
    graph: Graph  # as compiled (passes, quantization parameters)
    placements: list[Placement]  # where each op runs
    groups: dict  # the NPU groups (compiler/emitter_ops.NpuGroup) by op index
    precision: str  # what the program is lowered in: options.precision, or fp16 (below)
    note: str = ""  # why that differs from options.precision


def plan(source: str | Path, options: BuildOptions, stage=lambda name, fn, *args: fn(*args)) -> Plan:
    """The graph as compiled and where each op runs. A calibrated int8 build whose plan
    (all int8, or mixed) models slower than the whole program in fp16 (`whole_fp16_wins`)
    is lowered in fp16."""
    graph, placements, groups = _place(source, options, options.precision, stage)
    if options.precision == "int8" and options.calib is not None and not options.cpu_only:
        fp16 = stage("mixed precision", choose_fp16, graph, groups, options.calib)
        # a plan is mixed when the SQNR rule puts groups in fp16, or when an LRN (fp16 only:
        # its power is a lookup table) and what reads it after it already are; lookup-table
        # activations' islands alone are not weighed (their plans stay as they were)
        mixed = bool(fp16) or any(g.dtype == "fp16" and isinstance(g.result.op, LocalResponseNorm)
                                  for g in groups.values())
        if mixed:
            emit = emit_options(options.cores, options.ppu_irq)
            if fp16:
                placements, groups = stage("place", place_ops, graph, options.precision, False, fp16, emit)
            # every group in fp16 once, for its fp16 NPU time: the crossings (around the SQNR
            # rule's groups and an LRN's) are weighed against it
            every = {a: "" for a in {g.anchor for g in groups.values()}}
            _, all_fp16 = stage("place", place_ops, graph, options.precision, False, every, emit)
            merged = stage("mixed precision: crossings", merge_islands, graph, groups, all_fp16)
            if merged:
                fp16 = {**fp16, **merged}
                placements, groups = stage("place", place_ops, graph, options.precision, False, fp16, emit)
            placements, groups = stage("place: lone cheap ops", keep_lone_cheap_ops_on_cpu, graph, placements,
                                       groups, options.precision)
            mixed_plan = Plan(graph, placements, groups, options.precision)
            return mixed_plan if options.int8_only else _or_whole_fp16(source, options, stage, mixed_plan)
    placements, groups = stage("place: lone cheap ops", keep_lone_cheap_ops_on_cpu, graph, placements, groups,
                               options.precision)
    planned = Plan(graph, placements, groups, options.precision)
    if options.precision == "int8" and options.calib is not None and not options.cpu_only and not options.int8_only:
        return _or_whole_fp16(source, options, stage, planned)
    return planned


def _or_whole_fp16(source: str | Path, options: BuildOptions, stage, planned: Plan) -> Plan:
    """The int8 plan, or the whole program in fp16 where that models faster (fp16 is
    the more accurate: `whole_fp16_wins`), built from the fp16 passes (HardSwish
    stays one table in its convolution's epilogue, no int8 rewrites)."""
    whole = _place(source, options, "fp16", stage, emitter_norm.normalised_maxima(planned.graph))
    why = stage("mixed precision: whole program", whole_fp16_wins, planned[:3], whole)
    if why:
        return Plan(*whole, "fp16", f"fp16 throughout, int8 asked for: {why}")
    return planned


def _place(source: str | Path, options: BuildOptions, precision: str, stage,
           maxima: list | None = None) -> tuple[Graph, list[Placement], dict]:
    """The graph loaded, rewritten and quantized for `precision`, placed once;
    `maxima`: ranges an int8 build's calibration saw (compiler/emitter_norm.py)."""
    also = "" if precision == options.precision else f"{precision} throughout: "  # the alternative's stages
    extra = {"image_inputs": dict(options.image_inputs)} if options.image_inputs else {}
    graph: Graph = stage(f"{also}load", lambda: load_graph(source, input_shapes=dict(options.input_shapes),
                                                           bind=dict(options.bind), **extra))
    # a calibrated int8 build decomposes ops the DPU has no int8 form for (their parts get scales)
    graph = stage(f"{also}passes", run_passes, graph, precision == "int8" and options.calib is not None,
                  options.npu_attention is not False)
    stage(f"{also}check shapes", require_static, graph)
    graph = stage(f"{also}quantize", quantize, graph, precision, options.calib if precision == "int8" else None)
    if maxima:
        graph.metadata[emitter_norm.CALIBRATED_MAX] = maxima
    emit = emit_options(options.cores, options.ppu_irq)
    placements, groups = stage(f"{also}place", place_ops, graph, precision, options.cpu_only, None, emit)
    if options.npu_attention is None and graph.metadata.get(heads.SPLIT) and any(
            p.op.type == "MatMul" and p.device == "cpu" and all(graph.const_value(t) is None for t in p.op.inputs)
            for p in placements):
        # a head's product the NPU refuses: the split would only add CPU steps to the batched CPU product
        return _place(source, replace(options, npu_attention=False), precision, stage, maxima)
    if also:
        placements, groups = stage(f"{also}place: lone cheap ops", keep_lone_cheap_ops_on_cpu, graph, placements,
                                   groups, precision)
    return graph, placements, groups


def require_static(graph: Graph) -> None:
    for name in graph.inputs:
        t = graph.tensors[name].type
        if not t.is_static:
            dims = "x".join(str(d) if isinstance(d, int) else "?" for d in t.shape)
            raise UnsupportedError(f"input {name!r} has dynamic dimensions [{dims}]: fix them with "
                                   f"--input-shape {name}=" + "x".join(str(d) if isinstance(d, int) else "N"
                                                                         for d in t.shape))
    for name, t in graph.tensors.items():
        if not t.type.is_static:
            raise UnsupportedError(f"tensor {name!r} has a dynamic shape {list(t.type.shape)} even with the "
                                   "inputs fixed (data-dependent shapes are not supported)")
