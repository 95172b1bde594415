"""Load-time checks of what the runtime (not the container format) must trust in
an rkbin: every CPU step's kernel and attributes, and the memory the regions
ask for. Run once by
the loader before any BO is created, so a hostile file is one clear error, not
a numpy exception halfway through a run or an allocation the machine cannot
hold. (ir/program.py checks types and cross-references, ir/access.py the NPU
addresses.)"""

from __future__ import annotations

import os

import numpy as np

from rkc.ir.errors import FormatError, RkcError
from rkc.ir.program import TENSOR_LAYOUTS, Module, Step, TensorInfo
from rkc.ir.types import DType
from rkc.runtime.kernels import BROADCASTING, SHAPE_OF_FIRST, check_binding
from rkc.runtime.llm.kernel_attrs import attribute_problem, output_shape

# attribute -> what it must be; the rank is that of the step's first input
_AXIS = "axis"  # one axis of the input
_AXES = "axes"  # several
_PERM = "perm"
_DTYPE = "dtype name"
_POSITIVE = "positive ints"
_NON_NEGATIVE = "non-negative ints"
ATTRIBUTE_RULES: dict[str, str] = {
    "axis": _AXIS, "axes": _AXES, "perm": _PERM, "to": _DTYPE, "dtype": _DTYPE,
    "kernel_shape": _POSITIVE, "strides": _POSITIVE, "dilations": _POSITIVE, "blocksize": _POSITIVE,
    "group": _POSITIVE, "pads": _NON_NEGATIVE,
}
# ops whose `axis`/`axes` index their output rather than the input (one more dimension)
_OUTPUT_AXES = {"Unsqueeze": 1, "Flatten": 1}
NPU_LAYOUTS = tuple(name for name in TENSOR_LAYOUTS if name.startswith("native"))  # in the NPU's own cube form


def check_module(module: Module) -> None:
    """Raise FormatError naming the first tensor, step or region the runtime cannot trust."""
    tensors = {t.name: t for t in module.tensors}
    for t in module.tensors:
        if t.region is not None and t.layout in NPU_LAYOUTS and not all(d > 0 for d in t.shape):
            raise FormatError(f"tensor {t.name!r} has shape {t.shape} in NPU layout {t.layout!r}: the NPU reads "
                              "and writes no empty cube")
    from rkc.runtime.llm.kernels import KERNELS as LLM_KERNELS  # deferred: the LLM kernels, ~90 ms, for LLM modules

    llm = module.metadata.get("model_kind") == "llm"  # its CPU steps run LLM kernels where one has the name
    stored = {t.name for t in module.tensors if t.region is not None}  # in a BO or host region from the start
    for prog in module.programs:
        _check_dataflow(prog, stored)
        for step in prog.steps:
            if step.kind == "cpu":
                where = f"program {prog.name!r} step {step.name!r}"
                if llm and step.op in LLM_KERNELS:
                    _check_llm_step(where, step, tensors)
                else:
                    _check_cpu_step(where, step, tensors)
                _check_output_shape(where, step, tensors, llm and step.op in LLM_KERNELS)
    _check_memory(module)


def _check_dataflow(prog, stored: set[str]) -> None:
    """Every tensor a step reads that lives in no region is a program input or an
    earlier CPU step's output (else a run would read nothing), and so is every
    output; an NPU step names only tensors in regions."""
    have = set(prog.inputs) | stored
    for step in prog.steps:
        if step.kind == "npu":
            outside = [n for n in [*step.inputs, *step.outputs] if n not in stored]
            if outside:  # the NPU reads and writes BOs only: such a name would never be written
                raise FormatError(f"program {prog.name!r} step {step.name!r} lists {outside[0]!r:.60}, which lives "
                                  "in no region the NPU could touch")
        for name in step.inputs:
            if name and name not in have:
                raise FormatError(f"program {prog.name!r} step {step.name!r} reads {name!r:.60} before any step "
                                  "writes it")
        have.update(step.outputs)
    for name in prog.outputs:
        if name not in have:
            raise FormatError(f"program {prog.name!r} returns {name!r:.60}, which no step writes")


def _check_llm_step(where: str, step: Step, tensors: dict[str, TensorInfo]) -> None:
    problem = attribute_problem(step.op, len(step.inputs), step.attrs)
    if problem is None and not all(step.inputs):
        problem = f"{step.op} has an absent input (an LLM kernel has no optional ones)"
    if problem is None and step.op == "GatherPacked" and step.attrs["packed"] not in tensors:
        problem = f"GatherPacked reads packed weights {step.attrs['packed']!r:.40}, which is no tensor"
    if problem:
        raise FormatError(f"{where}: {problem}")


def _check_output_shape(where: str, step: Step, tensors: dict[str, TensorInfo], llm: bool) -> None:
    """The first output's declared shape is what the op makes of its inputs' declared
    shapes, where that follows from the op alone (elementwise, normalizations, the
    LLM kernels of runtime/llm/kernel_attrs.py)."""
    if not step.outputs or step.outputs[0] not in tensors:
        return
    names = [n for n in step.inputs if n]
    if not names or any(n not in tensors for n in names):
        return
    shapes = [tuple(tensors[n].shape) for n in names]
    if llm:
        try:
            want = output_shape(step.op, shapes, step.attrs)
        except ValueError as exc:
            raise FormatError(f"{where}: {step.op} inputs of shapes {', '.join(map(str, map(list, shapes)))}: "
                              f"{exc}") from None
        if want is None:
            return
    elif step.op in BROADCASTING:
        try:
            want = np.broadcast_shapes(*shapes)
        except ValueError:
            raise FormatError(f"{where}: {step.op} inputs of shapes {', '.join(map(str, map(list, shapes)))} "
                              "do not broadcast") from None
    elif step.op in SHAPE_OF_FIRST:
        want = shapes[0]
    else:
        return
    declared = tensors[step.outputs[0]].shape
    if list(want) != list(declared):
        raise FormatError(f"{where}: {step.op} of inputs shaped {', '.join(map(str, map(list, shapes)))} makes "
                          f"{list(want)}, but output {step.outputs[0]!r} is declared {declared}")


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _check_cpu_step(where: str, step: Step, tensors: dict[str, TensorInfo]) -> None:
    try:
        check_binding(step.op, len(step.inputs), step.attrs, where)
    except RkcError as exc:
        raise FormatError(str(exc)) from None
    first = tensors.get(step.inputs[0]) if step.inputs and step.inputs[0] else None
    rank = len(first.shape) + _OUTPUT_AXES.get(step.op, 0) if first is not None else None
    for name, value in step.attrs.items():
        rule = ATTRIBUTE_RULES.get(name)
        bad = None
        if rule == _AXIS:
            ok = isinstance(value, int) and not isinstance(value, bool)
            bad = None if ok and (rank is None or -rank <= value < rank) else f"not an axis of a rank-{rank} input"
        elif rule == _AXES:
            if value is not None and not (_ints(value) and (rank is None or all(-rank <= a < rank for a in value))):
                bad = f"not axes of a rank-{rank} input"
        elif rule == _PERM:
            if value is not None and not (_ints(value) and (rank is None or sorted(value) == list(range(rank)))):
                bad = f"not a permutation of {rank} axes"
        elif rule == _DTYPE:
            if not isinstance(value, str) or value not in {d.value for d in DType}:
                bad = f"not a dtype ({', '.join(d.value for d in DType)})"
        elif rule == _POSITIVE:
            ok = _ints(value) and all(0 < v < 1 << 31 for v in value) if isinstance(value, list) else \
                isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31
            bad = None if ok else "not positive"
        elif rule == _NON_NEGATIVE:
            if not (_ints(value) and all(0 <= v < 1 << 31 for v in value)):
                bad = "not a list of non-negative ints"
        if bad:
            raise FormatError(f"{where}: {step.op} attribute {name}={value!r:.40}: {bad}")


def available_memory() -> int:
    """Bytes this process can still allocate: MemAvailable where Linux says it,
    else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _check_memory(module: Module) -> None:
    total = sum(r.size for r in module.regions if r.blob is None)  # blobs are mapped from the file already
    total += sum(r.size for r in module.regions if r.blob is not None and r.kind != "host")
    have = available_memory()
    if total > have:
        raise FormatError(f"the regions need {total / 2**20:.0f} MiB, more than the {have / 2**20:.0f} MiB "
                          "of memory available")
