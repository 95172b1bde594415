"""Run one program of a loaded rkbin: steps in order.

* CPU step: gather its inputs (host tensors, host constants, or NPU tensors
  read back through the device with prepare/finish_cpu_access and converted
  from their native layout), run the numpy kernel (runtime/kernels), store
  the outputs (host, or written into a BO in the tensor's layout). A step at
  a feature map's edge, or one that pools or resizes feature maps, runs on the
  native layout itself (runtime/feature_edges.py).
* NPU step: submit its jobs (tasks resolved to IOVAs) and wait, through the
  device's prepared submit (Device.prepare_submit), made at the step's first run.
* An edge out of a feature map through float32 host tensors nothing else reads,
  element-wise steps and an edge back into a feature map (int8 <-> fp16 in a
  mixed-precision program; an int8 ReLU left on the CPU) run as one recoding
  between the feature maps (feature_edges.run_chain).
* What does not change between runs (each tensor's last reader, what dies after
  each step, a Relayout's moves) is decided at load (`prepare_program`); which steps
  the native paths decline, and the fused passes' tables, at the first run.

Host tensors are freed after their last reader.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.npu import geometry
from rkc.ir.npu.regcmd import ENTRY_BYTES
from rkc.ir.program import Program, Step, TensorInfo
from rkc.ir.types import DType
from rkc.runtime import blas, feature_edges, image_edges, logits_edges, native_maps, relayout_edges
from rkc.runtime.device import Job, Task
from rkc.runtime.kernels import NO_PRODUCTS, run_kernel


# ops whose result is their first input's elements in the same order, reshaped (row-major host tensors)
VIEW_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity"})


class InputError(RkcError):
    """The inputs given to a program do not match what it expects."""


@dataclass
class RunStats:
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    npu_seconds: float = 0.0
    submits: int = 0
    step_seconds: list[float] = field(default_factory=list)


def _dtype(info: TensorInfo) -> np.dtype:
    return _numpy_dtype(info.dtype)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(name: str) -> np.dtype:
    return DType(name).numpy  # (the enum's lookup cost ~1.5 us, several times a step)


class _Schedule:
    """What a program's runs share, decided once (at load for an ONNX model, else at
    its first run): each tensor's last reader, the host tensors to free after each
    step, the Relayouts' moves (prepare_program), and, at the first run, the steps whose
    native-layout path (feature_edges) declined them, which later runs take
    straight to the interpreter's path (a decline depends only on the program
    and its constants; the interpreter's path is right for any step)."""

    def __init__(self, program: Program) -> None:
        last: dict[str, int] = {}
        for i, step in enumerate(program.steps):
            for name in step.inputs:
                if name:
                    last[name] = i
        for name in program.outputs:
            last[name] = len(program.steps)
        self.last_use = last
        outputs = set(program.outputs)
        self.dead: list[tuple[str, ...]] = [() for _ in program.steps]
        for i, step in enumerate(program.steps):  # a tensor no step reads dies where it is made
            for name in step.outputs:
                if name and name not in outputs and name not in last:
                    self.dead[i] += (name,)
        for name, i in last.items():
            if name not in outputs:
                self.dead[i] += (name,)
        read = {name for step in program.steps for name in step.inputs if name}
        self.unread_outputs = frozenset(outputs - read)  # outputs only the caller reads
        self.no_native: set[int] = set()  # steps feature_edges.run_step declined
        self.program = program
        self.no_fused: set[int] = set()  # steps that start no fused pass feature_edges accepts
        # first step -> its fused pass, worked out at the first run; None: the steps are no such pass
        self.chains: dict[int, tuple | None] = {}  # (its chain's steps, feature_edges.chain_plan)
        self.images: dict[int, tuple | None] = {}  # (its steps, image_edges.image_plan)
        self.tails: dict[int, tuple[int, Callable[[object], None]] | None] = {}  # (last step, logits_plan's closure)
        self.native_plans: dict[int, tuple] = {}  # id(step) -> what feature_edges worked out at the first run
        self.views: dict[int, tuple[int, ...]] = {}  # step -> its output's shape: a reshape of a host tensor
        self.fed: tuple | None = None  # ((name, shape, dtype), ...) of the inputs, from the first checked run
        # per fp16_outputs: step -> the closure feature_edges prepared for it (`note_direct`), and the steps looked at
        self.direct: dict[bool, dict[int, Callable[[object], bool]]] = {False: {}, True: {}}
        self.looked: dict[bool, set[int]] = {False: set(), True: set()}

    def note_direct(self, run: "_Run", step: Step, index: int) -> None:
        """After the step's first unobserved run through `_Run.cpu` (no fused pass starts at
        it: `fused_end` declined it for good), keep the closure the native path prepared for
        it, if any, for run_program to call straight: the same call `_Run.cpu` reaches
        through the view, fp16-output, decline and run_step checks (~2-3 us a step, load 4)."""
        key = bool(run.fp16_outputs)
        self.looked[key].add(index)
        prepared = self.native_plans.get(native_maps.prepared_key(run, step))
        if prepared is not None and index in self.no_fused and index not in self.views:
            self.direct[key][index] = prepared

    def note_feeds(self, tensors: Mapping[str, TensorInfo]) -> None:
        """Keep each input's shape and dtype (after a run whose feeds check_feeds accepted)."""
        if self.fed is None:
            self.fed = tuple((n, tuple(tensors[n].shape), _dtype(tensors[n])) for n in self.program.inputs)

    def ready_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict | None:
        """The feeds as they are when each is an array of its input's exact shape and dtype
        and there are no others (what check_feeds would accept unchanged), else None:
        check_feeds' sets, conversions and messages cost ~3-5 us of a ~50 us inference."""
        fed = self.fed
        if fed is None or len(feeds) != len(fed):
            return None
        ready = {}
        for name, shape, dtype in fed:
            value = feeds.get(name)
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return None
            ready[name] = value
        return ready

    def note_view(self, index: int, step: Step, model) -> None:
        """Take the step as a reshape of its first input from now on (`views`) when it is one
        whatever the run: an op that only reshapes, from a host tensor to a host tensor of its
        dtype, its other inputs (a Reshape's shape, axes) absent or the program's constants.
        Its first run went through the kernel, which checked the declared shape."""
        tensors = model.tensors
        src, dst = tensors.get(step.inputs[0]), tensors.get(step.outputs[0]) if len(step.outputs) == 1 else None
        if src is None or dst is None or src.region is not None or dst.region is not None \
                or src.dtype != dst.dtype or dst.layout != "row":
            return
        if all(not n or (n in tensors and tensors[n].region in model.host_regions) for n in step.inputs[1:]):
            self.views[index] = tuple(int(d) for d in dst.shape)

    def fused_end(self, run: "_Run", i: int) -> int | None:
        """Run the steps from `i` as one pass (feature_edges: a recoding chain, or a
        learned upsampling quantized into its map; a classifier's logits tail: logits_edges)
        if they are one; the index of
        the last step it ran, or None (nothing ran)."""
        if i in self.no_fused:
            return None
        steps, outputs = self.program.steps, self.program.outputs
        if i not in self.images and steps[i].op == "Transpose":  # the model's uint8 image into its first map
            end = image_edges.image_chain_end(steps, i, self.last_use, outputs,
                                              lambda n: native_maps.in_bo(run, run.model.tensors.get(n)))
            if end is not None:
                run.one_thread()  # (the plans run the reference kernels once)
            plan = None if end is None else image_edges.image_plan(run, list(steps[i:end + 1]))
            self.images[i] = None if plan is None else (list(steps[i:end + 1]), plan)
        image = self.images.get(i)
        if image is not None and image_edges.run_image(run, *image):
            return i + len(image[0]) - 1
        if i not in self.tails:
            end = logits_edges.logits_chain_end(steps, i, self.last_use, outputs)
            tail = None if end is None else logits_edges.logits_plan(run, list(steps[i:end + 1]))
            self.tails[i] = None if tail is None else (end, tail)
        tail = self.tails[i]
        if tail is not None:  # a classifier's logits, Flatten and Softmax
            end, run_tail = tail
            run_tail(run)
            return end
        if i not in self.chains:
            end = feature_edges.chain_end(steps, i, self.last_use, outputs)
            if end is not None:
                run.one_thread()
            plan = None if end is None else feature_edges.chain_plan(run, list(steps[i:end + 1]))
            self.chains[i] = None if plan is None else (list(steps[i:end + 1]), plan)
        chain = self.chains[i]
        if chain is not None:
            if feature_edges.run_chain(run, *chain):
                return i + len(chain[0]) - 1
        else:  # a learned upsampling quantized into its map
            step = steps[i]
            if i + 1 < len(steps) and step.outputs and self.last_use.get(step.outputs[0]) == i + 1 \
                    and step.outputs[0] not in outputs:
                run.one_thread()  # (its products, or a pair's tables)
                if feature_edges.run_pair(run, step, steps[i + 1]):
                    return i + 1
        self.no_fused.add(i)
        return None


class _Run:
    def __init__(self, model, program: Program, fp16_outputs: bool = False) -> None:
        self.model = model
        self.program = program
        self.fp16_outputs = fp16_outputs
        self.env: dict[str, np.ndarray] = {}
        schedule = model.schedules.get(id(program))
        if schedule is None:
            schedule = model.schedules[id(program)] = _Schedule(program)
        self.schedule = schedule
        self.last_use = schedule.last_use
        self.blas = None  # blas.one_thread(), entered by one_thread(); run_program leaves it

    def one_thread(self) -> None:
        """BLAS on one thread until the run ends (host kernels' rule, runtime/blas.py), from
        the first step that may reach a numpy product: a run of native passes (numba kernels,
        the prepared submits) and kernels.NO_PRODUCTS alone never sets it (setting and
        restoring cost ~4 us a run). A caller that runs the steps itself holds
        blas.one_thread() around them and sets `blas` to it first."""
        if self.blas is None:
            self.blas = blas.one_thread()
            self.blas.__enter__()

    # -- tensor access ------------------------------------------------------------------
    def read(self, name: str) -> np.ndarray:
        if name in self.env:
            return self.env[name]
        info = self.model.tensors[name]
        if info.region is None:
            raise RkcError(f"program {self.program.name!r} reads {name!r} before any step wrote it")
        if info.region in self.model.host_regions:
            raw = self.model.host_regions[info.region][info.offset:info.offset + info.nbytes]
            return raw.view(_dtype(info)).reshape(info.shape)
        bo = self.model.bos[info.region]
        self.model.device.prepare_cpu_access(bo)
        raw = bo.host[info.offset:info.offset + info.nbytes]
        value = from_layout(raw, info)
        self.model.device.finish_cpu_access(bo)
        return value

    def write(self, name: str, value: np.ndarray) -> None:
        info = self.model.tensors.get(name)
        if info is None or info.region is None:
            self.env[name] = value
            return
        bo = self.model.bos[info.region]
        self.model.device.prepare_cpu_access(bo)
        to_layout(value, info, bo.host[info.offset:info.offset + info.nbytes])
        self.model.device.finish_cpu_access(bo)

    def keeps_fp16(self, step: Step) -> bool:
        """Whether `step` is an fp16 tensor's widening to float32 into an output only the
        caller reads, and the caller asked for fp16 outputs: the output is the NPU's fp16
        values, which the float32 ones are exactly, at half the bytes."""
        if not (self.fp16_outputs and step.op == "Cast" and step.outputs[0] in self.schedule.unread_outputs):
            return False
        src, dst = self.model.tensors.get(step.inputs[0]), self.model.tensors.get(step.outputs[0])
        return src is not None and dst is not None and src.dtype == "fp16" and dst.dtype == "fp32"

    # -- steps --------------------------------------------------------------------------
    def cpu(self, step: Step, index: int = -1) -> None:
        prepared = self.schedule.native_plans.get(native_maps.prepared_key(self, step))
        if prepared is not None and prepared(self):  # worked out at its first run (feature_edges.run_step)
            return  # (before the checks below: ~2-4 us of a YOLO output step's ~10-15 around its kernel)
        view = self.schedule.views.get(index)
        if view is not None:  # a reshape of a host tensor, checked at the first run
            self.env[step.outputs[0]] = self.env[step.inputs[0]].reshape(view)
            return
        if self.keeps_fp16(step):
            if not feature_edges.run_step(self, step):
                self.env[step.outputs[0]] = self.read(step.inputs[0])  # row-major fp16, as the program lays it out
            return
        if index not in self.schedule.no_native:
            if feature_edges.run_step(self, step):  # on the native layout, no conversion around it
                return
            if index >= 0:
                self.schedule.no_native.add(index)
        if step.op not in NO_PRODUCTS:
            self.one_thread()
        inputs = [self.read(n) if n else None for n in step.inputs]
        outputs = run_kernel(step.op, inputs, step.attrs, len(step.outputs))
        if len(outputs) < len(step.outputs):
            raise RkcError(f"step {step.name!r}: kernel {step.op} gave {len(outputs)} outputs, "
                           f"the step needs {len(step.outputs)}")
        for name, value in zip(step.outputs, outputs):
            info = self.model.tensors.get(name)
            if info is not None:
                # a kernel's result must match the module's declaration, in the env and in a BO
                # alike: a crafted module could otherwise declare a shape no kernel produces
                value = np.asarray(value)
                if list(value.shape) != list(info.shape):
                    raise RkcError(f"step {step.name!r}: {name!r} came out {list(value.shape)}, "
                                   f"the program declares {info.shape}")
                if info.region is None:
                    value = value.astype(_dtype(info), copy=False)
            self.write(name, value)
        if index >= 0 and step.op in VIEW_OPS:
            self.schedule.note_view(index, step, self.model)

    def npu(self, step: Step) -> None:
        # the step's submit is prepared at its first run (jobs built, what cannot change checked once:
        # Device.prepare_submit, as runtime/plan.py does): the BOs live as long as the model
        prepared = self.model.prepared_submits
        run = prepared.get(id(step))
        if run is None:
            device = self.model.device
            run = prepared[id(step)] = device.prepare_submit(
                _jobs(step, self.model.bos), chained=step.chained and device.supports_chaining)
        run()


def _jobs(step: Step, bos) -> list[Job]:
    jobs = []
    for j, job in enumerate(step.jobs):
        tasks = [Task(bos[t.region].iova + t.entry * ENTRY_BYTES, t.count) for t in job.tasks]
        jobs.append(Job(tasks, [bos[r] for r in job.reads], [bos[r] for r in job.writes], job.lane,
                        f"{step.name} job {j}"))
    return jobs


def from_layout(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    """Bytes of a tensor in a BO -> logical row-major array."""
    dtype = _dtype(info)
    if info.layout == "row":
        n = int(np.prod(info.shape, dtype=np.int64))
        return raw[:n * dtype.itemsize].view(dtype).reshape(info.shape).copy()
    if info.layout.startswith("native"):
        return geometry.unpack(raw, info.shape, info.layout, dtype)
    raise RkcError(f"tensor {info.name!r} has unknown layout {info.layout!r}")


def to_layout(value: np.ndarray, info: TensorInfo, raw: np.ndarray) -> None:
    value = np.asarray(value, dtype=_dtype(info)).reshape(info.shape)
    packed = value if info.layout == "row" else None
    if info.layout.startswith("native"):
        packed = geometry.pack(value, info.layout)
    if packed is None:
        raise RkcError(f"tensor {info.name!r} has unknown layout {info.layout!r}")
    data = packed.reshape(-1).view(np.uint8)
    raw[:data.size] = data


def check_feeds(program: Program, tensors: Mapping[str, TensorInfo], feeds: Mapping[str, np.ndarray]) -> dict:
    extra = sorted(set(feeds) - set(program.inputs))
    if extra:
        raise InputError(f"unknown input(s) {', '.join(extra)} (the model takes: {', '.join(program.inputs)})")
    ready = {}
    for name in program.inputs:
        if name not in feeds:
            raise InputError(f"missing input {name!r} (the model takes: {', '.join(program.inputs)})")
        info = tensors[name]
        value = np.asarray(feeds[name])
        if list(value.shape) != list(info.shape):
            raise InputError(f"input {name!r} has shape {list(value.shape)}, the model expects {info.shape}")
        want = _dtype(info)
        same_family = value.dtype.kind == want.kind or (value.dtype.kind in "iu" and want.kind in "iu"
                                                        and np.can_cast(value.dtype, want, casting="safe"))
        if value.dtype != want and not same_family:
            raise InputError(f"input {name!r} is {value.dtype}, the model expects {want}")
        ready[name] = value.astype(want, copy=False)
    return ready


def prepare_program(model, program: Program) -> None:
    """Make the program's schedule and its Relayout steps' moves at load rather than in the
    user's first run: both depend only on the program and its constants (YOLO11n's nine
    Relayouts: ~20 ms of CPU)."""
    run = _Run(model, program)
    for step in program.steps:
        if step.kind == "cpu" and step.op == "Relayout":
            relayout_edges.prepare_relayout(run, step)


def run_program(model, program: Program, feeds: Mapping[str, np.ndarray], observe=None, fp16_outputs: bool = False):
    """`observe(step, read)`, if given, runs after every step; `read(name)` returns
    any tensor the step wrote (NPU tensors as stored: int8 / fp16 values).
    `fp16_outputs`: an output the program widens from an fp16 tensor comes back as
    that float16 array (`_Run.keeps_fp16`); the others as the program declares them."""
    run = _Run(model, program, fp16_outputs)
    stats = RunStats()
    ready = run.schedule.ready_feeds(feeds)
    if ready is None:
        ready = check_feeds(program, model.tensors, feeds)
        run.schedule.note_feeds(model.tensors)
    for name, value in ready.items():
        run.write(name, value)
    start = time.perf_counter()
    steps, skip, schedule = program.steps, -1, run.schedule
    clock = time.perf_counter
    direct, looked = (schedule.direct[bool(fp16_outputs)], schedule.looked[bool(fp16_outputs)]) \
        if observe is None else ({}, None)
    times, dead, env = stats.step_seconds, schedule.dead, run.env
    try:  # host kernels' rule (runtime/blas.py: BLAS's spinning pool cost 6x), set once a run where needed
        for i, step in enumerate(steps):
            if i > skip:
                t = clock()
                prepared = direct.get(i)
                on_cpu = step.kind == "cpu"
                if prepared is not None and prepared(run):  # (False: not this run's inputs: the path below)
                    pass
                elif on_cpu:
                    # an edge out of a feature map whose float32 result only feeds element-wise steps and an
                    # edge back into one (int8 <-> fp16 in a mixed-precision program, a ReLU left on the CPU)
                    # is one pass; observed runs keep every tensor
                    end = schedule.fused_end(run, i) if observe is None else None
                    if end is not None:
                        skip = end
                    else:
                        run.cpu(step, i)
                        if looked is not None and i not in looked:
                            schedule.note_direct(run, step, i)
                else:
                    run.npu(step)
                    stats.submits += 1
                dt = clock() - t
                if observe is not None:
                    observe(step, run.read)
                times.append(dt)
                if on_cpu:
                    stats.cpu_seconds += dt
                else:
                    stats.npu_seconds += dt
            else:  # done with an earlier step's fused pass
                times.append(0.0)
            for name in dead[i]:  # host tensors past their last reader (_Schedule.dead)
                env.pop(name, None)
    finally:
        if run.blas is not None:
            run.blas.__exit__(None, None, None)
    outputs = _handed_out(run, program.outputs, ready.values())
    stats.seconds = time.perf_counter() - start
    return outputs, stats


def _handed_out(run: _Run, names, feeds) -> dict[str, np.ndarray]:
    """The program's outputs, each the caller's own array: copied unless this
    run made it (an array owning its memory, not a feed, not another output)."""
    taken = {id(v) for v in feeds}
    outputs = {}
    for name in names:
        value = run.read(name)
        if not isinstance(value, np.ndarray) or value.base is not None or id(value) in taken:
            value = np.array(value)
        taken.add(id(value))
        outputs[name] = value
    return outputs
