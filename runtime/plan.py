"""A program prepared once at load: an execution plan.

runtime/execute.py interprets a program (tensors looked up by name, layout
conversions through the generic pack/unpack, Job and Task objects rebuilt
for every submit, a dict of live tensors swept after each step). For a
program that runs once per token that bookkeeping is most of the host's
time, so this module decides at load everything that does not change from
one run to the next:

* every tensor gets a slot (an index into one list); constants sit in their
  slot for good;
* a tensor stored in a BO gets a reader and a writer over views made once
  into the BO's host mapping, in its layout (for a GEMM operand the
  [K/C2][rows][C2] atoms seen as [rows][K/C2][C2], so a row-major [M, K] array
  is written or read with one strided numpy assignment, casting on the way:
  an edge Cast is that assignment and nothing else);
* each NPU step's jobs (tasks with their IOVAs) are built once;
* each stretch of CPU steps between two submits takes the BOs it touches with
  one prepare_cpu_access and hands them back with one finish_cpu_access;
* each CPU step's kernel is bound once (`KernelBinder`: an op may bring a
  prepared form that precomputes its constants).

`ProgramPlan.run(feeds)` then walks a flat list of prepared calls. The views
are made while the BO is held, so they stay writable; the plan only touches
them inside the brackets it emits (the contract the simulator enforces on
`bo.host`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.npu import layout
from rkc.ir.npu.regcmd import ENTRY_BYTES
from rkc.ir.program import Program, Step, TensorInfo
from rkc.ir.types import DType
from rkc.ir.npu import geometry
from rkc.runtime import blas
from rkc.runtime.device import Job, Task
from rkc.runtime.execute import from_layout, to_layout

# A prepared kernel: list of input values -> list of output values.
Prepared = Callable[[list], list]
# (step, constant inputs by position or None) -> Prepared
KernelBinder = Callable[[Step, list], Prepared]
# (plan, a stretch of CPU steps, binder, program outputs) -> the stretch's calls, or None
Fuser = Callable[["ProgramPlan", Sequence[Step], KernelBinder, set], "list[Callable[[], None]] | None"]


def _dtype(info: TensorInfo) -> np.dtype:
    return DType(info.dtype).numpy


class BoTensor:
    """Reader and writer of one tensor in a BO, over views made once."""

    def __init__(self, info: TensorInfo, host: np.ndarray) -> None:
        self.info = info
        self.dtype = _dtype(info)
        self.shape = tuple(info.shape)
        self.raw = host[info.offset:info.offset + info.nbytes]
        self.rows_view = None  # GEMM operand: [stored rows, C/C2, C2] over the atoms
        self.flat_view = None  # "row" layout: the values themselves
        self.m = 0
        if info.layout == "row":
            n = int(np.prod(self.shape, dtype=np.int64))
            self.flat_view = self.raw[:n * self.dtype.itemsize].view(self.dtype).reshape(self.shape)
        elif info.layout == "native-gemm":
            k, m, rows, _ = geometry.feature_map(self.shape, info.layout)
            c2 = layout.c2_for(self.dtype.itemsize)
            c1 = -(-k // c2)
            fm = layout.feature_view(self.raw, k, rows, 1, self.dtype)  # [C1, rows, 1, C2]
            self.rows_view = fm[:, :, 0, :].transpose(1, 0, 2)
            self.m, self.k, self.c1, self.c2 = m, k, c1, c2

    @property
    def atoms(self) -> np.ndarray:
        """A GEMM operand's atoms as the BO stores them: [C1, stored rows, C2]."""
        return self.rows_view.transpose(1, 0, 2)

    def reader(self, out_dtype: np.dtype | None = None, fresh: bool = False) -> Callable[[], np.ndarray]:
        """A function returning the tensor as a row-major array (as `out_dtype`,
        default its own), copied out of the BO into a buffer reused by every
        call (a new one each call with `fresh`)."""
        dtype = np.dtype(out_dtype or self.dtype)
        shape = self.shape
        if self.flat_view is not None:
            src = self.flat_view
            if fresh:
                return lambda: src.astype(dtype, copy=True)
            buf = np.empty(shape, dtype)

            def read_row():
                buf[...] = src
                return buf
            return read_row
        if self.rows_view is not None:
            # the interpreter's unpack leaves [M, K] column-major (K atoms outermost);
            # so does this copy, so that every later reduction sums in the same order
            m, k, c1, c2 = self.m, self.k, self.c1, self.c2
            src = self.rows_view[:m].transpose(1, 2, 0)  # [C1, C2, M]

            def new_buffer():
                buf = np.empty((c1 * c2, m), dtype)  # [K, M] rows = [M, K] column-major
                return buf, buf.reshape(c1, c2, m), np.reshape(buf[:k].T, shape)
            copy = _widen_copy(self) if self.dtype == np.float16 and dtype == np.float32 else None
            if copy is None:
                def copy(buf, dst):
                    dst[...] = src
            if fresh:
                def read_fresh():
                    buf, dst, out = new_buffer()
                    copy(buf, dst)
                    return out
                return read_fresh
            buf, dst, out = new_buffer()

            def read_gemm():
                copy(buf, dst)
                return out
            return read_gemm
        info, raw = self.info, self.raw
        if dtype == self.dtype:
            return lambda: from_layout(raw, info)
        return lambda: from_layout(raw, info).astype(dtype)

    def writer(self) -> Callable[[np.ndarray], None]:
        """A function storing a row-major array (any float/int dtype: cast as
        numpy's astype casts) into the tensor, padding rows zeroed."""
        if self.flat_view is not None:
            flat, shape = self.flat_view, self.shape

            def write_row(value):
                flat[...] = np.reshape(value, shape)
            return write_row
        if self.rows_view is not None:
            view, m, k = self.rows_view, self.m, self.k
            cp = self.c1 * self.c2
            if self.dtype == np.float16:
                return _narrowing_writer(self, self._slow_writer(view, m, k, cp))
            return self._slow_writer(view, m, k, cp)
        info, raw = self.info, self.raw

        def write_any(value):
            to_layout(value, info, raw)
        return write_any

    def _slow_writer(self, view, m: int, k: int, cp: int) -> Callable[[np.ndarray], None]:
        """A GEMM operand's writer by numpy's strided casting assignment."""
        body, pad = view[:m], view[m:] if view.shape[0] > m else None
        if cp == k:
            shape3 = body.shape

            def write_gemm(value):
                body[...] = np.reshape(value, shape3)
                if pad is not None:
                    pad[...] = 0
            return write_gemm
        staging = np.zeros((m, cp), self.dtype)  # channels past K stay zero
        lanes = staging.reshape(body.shape)

        def write_padded(value):
            staging[:, :k] = np.reshape(value, (m, k))
            body[...] = lanes
            if pad is not None:
                pad[...] = 0
        return write_padded


class ProgramPlan:
    """One program of a LoadedModel, prepared; `run` executes it."""

    def __init__(self, model, program: Program, bind: KernelBinder, unchecked: frozenset[str] = frozenset(),
                 fusers: Sequence[Fuser] = ()) -> None:
        """`unchecked`: ops whose outputs are stored as they come (the LLM
        kernels, as runtime/llm/engine.py's interpreter stores them); other
        transient outputs get the interpreter's shape check and dtype cast.
        `fusers`: each may take a whole stretch of CPU steps between two NPU
        steps as fewer prepared calls (runtime/llm/fused.py); the first that
        does wins, and a stretch none takes runs step by step."""
        self.model = model
        self.fusers = tuple(fusers)
        self.unchecked = unchecked
        self.program = program
        self.device = model.device
        self.index: dict[str, int] = {}
        self.slots: list[Any] = []
        self._bo_tensors: dict[str, BoTensor] = {}
        self.npu_seconds = [0.0]  # wall time inside submit + wait, all runs
        self._submits: int | None = None
        with self._views_held():
            self.calls: list[Callable[[], None]] = self._build(bind)
        self.input_slots = [self._slot(n) for n in program.inputs]
        self.output_slots = [self._slot(n) for n in program.outputs]

    # -- building -----------------------------------------------------------------------
    def _views_held(self):
        """Hold every BO while the views are made (a view made then stays writable)."""
        plan = self

        class Held:
            def __enter__(self):
                for bo in plan.model.bos.values():
                    plan.device.prepare_cpu_access(bo)

            def __exit__(self, *exc):
                for bo in plan.model.bos.values():
                    plan.device.finish_cpu_access(bo)
        return Held()

    def _slot(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.slots)
            self.slots.append(None)
            info = self.model.tensors.get(name)
            if info is not None and info.region in self.model.host_regions:  # a constant
                raw = self.model.host_regions[info.region][info.offset:info.offset + info.nbytes]
                self.slots[i] = raw.view(_dtype(info)).reshape(info.shape)
        return i

    def _bo_tensor(self, name: str) -> BoTensor | None:
        info = self.model.tensors.get(name)
        if info is None or info.region is None or info.region not in self.model.bos:
            return None
        t = self._bo_tensors.get(name)
        if t is None:
            t = self._bo_tensors[name] = BoTensor(info, self.model.bos[info.region].host)
        return t

    def _build(self, bind: KernelBinder) -> list[Callable[[], None]]:
        calls: list[Callable[[], None]] = []
        stretch: list[Step] = []
        outputs = set(self.program.outputs)
        for name in self.program.inputs:  # feeds that live in a BO are written by run()
            self._slot(name)
            self._bo_tensor(name)
        for step in self.program.steps:
            if step.kind == "cpu":
                stretch.append(step)
                continue
            calls += self._cpu_stretch(stretch, bind, outputs)
            stretch = []
            calls.append(self._npu_call(step))
        calls += self._cpu_stretch(stretch, bind, outputs)
        for name in self.program.outputs:  # outputs left in a BO are read at the end
            bt = self._bo_tensor(name)
            if bt is not None:
                calls += self._bracketed([self.model.bos[bt.info.region]],
                                         [self._read_call(self._slot(name), bt.reader(fresh=True))])
        return calls

    def _bracketed(self, bos, body: list[Callable[[], None]]) -> list[Callable[[], None]]:
        if not bos or not body:
            return body
        device = self.device
        bos = list({id(b): b for b in bos}.values())
        if len(body) == 1:  # (a fused stretch) one call, bracket included: two calls fewer per stretch
            (only,) = body
            prepare, finish = device.prepare_cpu_access, device.finish_cpu_access

            def bracketed():
                for bo in bos:
                    prepare(bo)
                only()
                for bo in bos:
                    finish(bo)
            for name in ("label", "ops"):
                if hasattr(only, name):
                    setattr(bracketed, name, getattr(only, name))
            return [bracketed]

        def take():
            for bo in bos:
                device.prepare_cpu_access(bo)

        def give():
            for bo in bos:
                device.finish_cpu_access(bo)
        take.label = give.label = "CPU access bracket"
        return [take, *body, give]

    def _read_call(self, slot: int, read) -> Callable[[], None]:
        slots = self.slots

        def call():
            slots[slot] = read()
        call.label = "read output"
        return call

    def _cpu_stretch(self, steps: Sequence[Step], bind: KernelBinder, outputs: set) -> list[Callable[[], None]]:
        for fuse in self.fusers:
            fused = fuse(self, steps, bind, outputs)
            if fused is not None:
                return fused
        body: list[Callable[[], None]] = []
        bos = []
        for step in steps:
            call = self._cpu_call(step, bind, outputs, bos)
            call.label = step.op
            body.append(call)
        return self._bracketed(bos, body)

    def _cpu_call(self, step: Step, bind: KernelBinder, outputs: set, bos: list) -> Callable[[], None]:
        slots = self.slots
        getters: list[Callable[[], Any]] = []
        consts: list = []
        from_slots: list[int | None] = []  # per input: its slot when read straight from one
        cast_edge = (step.op == "Cast" and len(step.inputs) == 1 and len(step.outputs) == 1)
        for name in step.inputs:
            if not name:
                getters.append(lambda: None)
                consts.append(None)
                from_slots.append(None)
                continue
            i = self._slot(name)
            bt = self._bo_tensor(name)
            if bt is not None:  # read out of the BO, in this step's stretch
                bos.append(self.model.bos[bt.info.region])
                out_dtype = DType(step.attrs["to"]).numpy if cast_edge and _float_cast(bt.dtype, step) else None
                getters.append(bt.reader(out_dtype, fresh=cast_edge and step.outputs[0] in outputs))
                consts.append(None)
                if out_dtype is not None:  # the reader did the Cast
                    return self._store_call(step.outputs[0], getters[0], None, outputs, bos)
            else:
                getters.append(_slot_getter(slots, i))
                consts.append(slots[i])
                from_slots.append(i)
                continue
            from_slots.append(None)
        if cast_edge and _float_cast(self._in_dtype(step.inputs[0]), step):
            out = self._bo_tensor(step.outputs[0])
            if out is not None:  # the writer does the Cast, straight into the BO
                return self._store_call(step.outputs[0], getters[0], None, outputs, bos)
        kernel = bind(step, consts)
        fast = self._slots_call(step, from_slots, kernel)
        if fast is not None:
            return fast
        return self._store_call(step.outputs, getters, kernel, outputs, bos, step)

    def _slots_call(self, step: Step, from_slots: list, kernel) -> Callable[[], None] | None:
        """The call of an unchecked kernel whose inputs and single output are
        all plain slots (no BO, no missing input): the slots indexed directly,
        with no getter or store functions between (most LLM CPU steps)."""
        if step.op not in self.unchecked or len(step.outputs) != 1 or None in from_slots:
            return None
        name = step.outputs[0]
        if self._bo_tensor(name) is not None:
            return None
        slots, o, label = self.slots, self._slot(name), step.name
        if len(from_slots) == 1:
            (a,) = from_slots

            def call1():
                out = kernel([slots[a]])
                if not out:
                    raise RkcError(f"step {label!r}: kernel gave no output")
                slots[o] = out[0]
            return call1
        ins = tuple(from_slots)

        def call():
            out = kernel([slots[i] for i in ins])
            if not out:
                raise RkcError(f"step {label!r}: kernel gave no output")
            slots[o] = out[0]
        return call

    def _in_dtype(self, name: str):
        info = self.model.tensors.get(name)
        return _dtype(info) if info is not None else None

    def _store_call(self, out_names, getters, kernel, outputs, bos, step: Step | None = None):
        """The call that gets the inputs, runs `kernel` (None: the single input
        is the output) and stores each output (slot, BO or both)."""
        slots = self.slots
        names = [out_names] if isinstance(out_names, str) else list(out_names)
        stores = []
        for name in names:
            i = self._slot(name)
            bt = self._bo_tensor(name)
            info = self.model.tensors.get(name)
            if bt is not None:
                bos.append(self.model.bos[bt.info.region])
                write = bt.writer()  # later readers read the BO
                stores.append(_shape_checked(write, bt.info, step) if kernel is not None and step is not None
                              else write)
            elif info is not None and kernel is not None and step is not None:
                stores.append(_checked_store(slots, i, info, step, cast=step.op not in self.unchecked))
            else:
                stores.append(_slot_store(slots, i))
        if kernel is None:
            get, (store,) = getters, stores

            def copy_call():
                store(get())
            return copy_call
        n_out = len(stores)
        label = step.name if step is not None else "?"

        def call():
            results = kernel([g() for g in getters])
            if len(results) < n_out:
                raise RkcError(f"step {label!r}: kernel gave {len(results)} outputs, the step needs {n_out}")
            for store, value in zip(stores, results):
                store(value)
        return call

    def _npu_call(self, step: Step) -> Callable[[], None]:
        bos = self.model.bos
        jobs = [Job([Task(bos[t.region].iova + t.entry * ENTRY_BYTES, t.count) for t in job.tasks],
                    [bos[r] for r in job.reads], [bos[r] for r in job.writes], job.lane, f"{step.name} job {j}")
                for j, job in enumerate(step.jobs)]
        device = self.device
        chained = bool(step.chained and device.supports_chaining)
        spent, clock = self.npu_seconds, time.perf_counter
        submit = device.prepare_submit(jobs, chained)  # what the device can check once, checked now

        def call():
            t = clock()
            submit()
            spent[0] += clock() - t
        call.npu = True
        call.label = "NPU submit"
        return call

    # -- running ------------------------------------------------------------------------
    def run(self, feeds: Sequence[np.ndarray]) -> list:
        """Program inputs in `program.inputs` order -> its outputs (the output
        values are the plan's own buffers: valid until the next run)."""
        self._feed(feeds)
        slots = self.slots
        with blas.one_thread():  # host kernels' rule (runtime/blas.py)
            for call in self.calls:
                call()
        return [slots[i] for i in self.output_slots]

    def run_host_steps(self, feeds: Sequence[np.ndarray]) -> None:
        """`run` without its NPU submits: every host step runs once, on whatever
        the BOs hold (meaningless results), so each host kernel is compiled (numba)
        before a real run needs it. Nothing is submitted: it costs no device time."""
        self._feed(feeds)
        with blas.one_thread():
            for call in self.calls:
                if not getattr(call, "npu", False):
                    call()

    def _feed(self, feeds: Sequence[np.ndarray]) -> None:
        slots = self.slots
        for name, i, value in zip(self.program.inputs, self.input_slots, feeds):
            bt = self._bo_tensors.get(name)
            if bt is not None:
                bo = self.model.bos[bt.info.region]
                self.device.prepare_cpu_access(bo)
                bt.writer()(value)
                self.device.finish_cpu_access(bo)
            slots[i] = value

    def profile(self, feeds: Sequence[np.ndarray], seconds: dict[str, float], calls: dict[str, int],
                clock: Callable[[], float] = time.perf_counter, by_op: dict[str, list] | None = None) -> list:
        """`run`, adding each prepared call's wall time to `seconds[label]`
        (label: the CPU op, "NPU submit", "CPU access bracket", a fused
        stretch's name, ...). `by_op`: op -> [seconds, calls] per step kind,
        a fused call's time shared evenly by the steps it runs (its `ops`)."""
        slots = self.slots
        for i, value in zip(self.input_slots, feeds):  # feeds of LLM programs are host tensors
            slots[i] = value
        if any(self._bo_tensors.get(n) for n in self.program.inputs):
            return self.run(feeds)
        with blas.one_thread():
            for call in self.calls:
                t = clock()
                call()
                spent = clock() - t
                label = getattr(call, "label", "?")
                seconds[label] = seconds.get(label, 0.0) + spent
                calls[label] = calls.get(label, 0) + 1
                if by_op is not None:
                    ops = getattr(call, "ops", (label,))
                    for op in ops:
                        row = by_op.setdefault(op, [0.0, 0])
                        row[0] += spent / len(ops)
                        row[1] += 1
        return [slots[i] for i in self.output_slots]

    @property
    def submits(self) -> int:
        """NPU submits per run (counted once: the engine asks every run)."""
        if self._submits is None:
            self._submits = sum(1 for c in self.calls if getattr(c, "npu", False))
        return self._submits


def _widen_copy(bt: BoTensor) -> Callable[[np.ndarray, np.ndarray], None]:
    """The copy of an fp16 GEMM operand's atoms into a float32 [K, M] buffer
    (a reader's), widened with numpy's bits (runtime/half.py)."""
    from rkc.runtime import half  # numba: imported by programs with fp16 edges only

    atoms = bt.atoms.view(np.uint16)
    m, k = bt.m, bt.k

    def copy(buf, dst):
        half.widen_atoms(atoms, m, k, buf.view(np.uint32))
    return copy


def _narrowing_writer(bt: BoTensor, slow: Callable[[np.ndarray], None]) -> Callable[[np.ndarray], None]:
    """An fp16 GEMM operand's writer: a float32 [M, K] value rounded straight
    into the atoms (runtime/half.py, numpy's bits); any other value by `slow`."""
    from rkc.runtime import half  # numba: imported by programs with fp16 edges only

    atoms = bt.atoms.view(np.uint16)
    shape, narrow = (bt.m, bt.k), half.narrow_into_atoms

    def write(value):
        if getattr(value, "dtype", None) != np.float32 or value.size != shape[0] * shape[1]:
            return slow(value)
        narrow(np.reshape(value, shape).view(np.uint32), atoms)
    return write


def _float_cast(src: np.dtype | None, step: Step) -> bool:
    """A Cast between float types (numpy's assignment casts exactly as astype)."""
    if src is None:
        return False
    return np.dtype(src).kind == "f" and DType(step.attrs["to"]).numpy.kind == "f"


def _slot_getter(slots: list, i: int):
    return lambda: slots[i]


def _slot_store(slots: list, i: int):
    def store(value):
        slots[i] = value
    return store


def _shape_checked(store: Callable, info: TensorInfo, step: Step) -> Callable:
    """`store` of a kernel's output that must have the declared shape (as the
    interpreter checks: a crafted module could declare one no kernel produces)."""
    shape = tuple(info.shape)

    def checked(value):
        if np.shape(value) != shape:
            raise RkcError(f"step {step.name!r}: {info.name!r} came out {list(np.shape(value))}, "
                           f"the program declares {list(shape)}")
        store(value)
    return checked


def _checked_store(slots: list, i: int, info: TensorInfo, step: Step, cast: bool = True):
    """As the interpreter stores a kernel's output: shape checked, and (`cast`, the
    standard kernels) cast to the declared dtype."""
    dtype = _dtype(info)

    def store(value):
        slots[i] = np.asarray(value).astype(dtype, copy=False) if cast else value
    return _shape_checked(store, info, step)


def standard_binder(step: Step, consts: list) -> Prepared:
    """runtime/kernels' numpy kernel of `step.op`, bound once."""
    from rkc.runtime.kernels import COUNTS_OUTPUTS, kernel_for

    fn, attrs = kernel_for(step.op), dict(step.attrs)
    if step.op in COUNTS_OUTPUTS:
        attrs["n_outputs"] = len(step.outputs)

    def run(inputs):
        result = fn(*inputs, **attrs)
        return list(result) if isinstance(result, tuple) else [result]
    return run
