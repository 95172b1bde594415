"""What an rkbin holds, as plain data: regions, tensors, relocations, programs.

* A **region** becomes one buffer object at load time: the read-only weights,
  the regcmd arrays, activation scratch. Its initial bytes (if any) come from a
  named blob of the file. A "host" region (constants only CPU steps read)
  stays in host memory and never takes IOVA space.
* A **relocation** says: the 64-bit regcmd entry `entry` of region `region`
  carries in its value field (bits 47..16) the IOVA of `target` plus `offset`.
  The file never holds a raw address; the loader writes every one.
* A **tensor** lives either in a region (NPU side, with its layout) or on the
  host (CPU side, `region` is None).
* A **program** is an ordered list of steps: an NPU step submits jobs of tasks
  (a segment), a CPU step runs one numpy kernel. An rkbin can hold several
  programs sharing regions (an LLM's prefill chunks and decode).

`Module.validate()` checks every cross-reference; the rkbin reader calls it
before anything reaches a device.
"""

from __future__ import annotations

import functools
import json
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from rkc.ir.errors import FormatError
from rkc.ir.npu import geometry
from rkc.ir.npu.regcmd import ENTRY_BYTES, PC_AMOUNT_MAX, PC_FETCH_ENTRIES
from rkc.ir.types import DType

# "host": constants only CPU steps read; the loader keeps them in host memory (no BO)
REGION_KINDS = ("weights", "regcmd", "scratch", "io", "host")
# "row": C order; "packed": raw bytes the NPU decodes (weights); "native*": ir/npu/geometry.py
TENSOR_LAYOUTS = ("row", "packed", "native", "native-gemm", "native-weights")
STEP_KINDS = ("npu", "cpu")
PAGE = 4096  # a BO takes whole pages of IOVA space
MAX_JSON_DEPTH = 64  # far deeper than any module; bounds the recursion of checking it


@dataclass
class Region:
    name: str
    size: int
    kind: str
    blob: str | None = None  # blob with the initial contents (weights, regcmd)


@dataclass
class Relocation:
    region: str  # regcmd region holding the entry
    entry: int  # index of the 64-bit entry in that region
    target: str  # region whose IOVA is written
    offset: int = 0  # byte offset added to the target's IOVA


@dataclass
class TaskRef:
    region: str  # regcmd region
    entry: int  # first entry of the task
    count: int  # entries, tail included


@dataclass
class Job:
    tasks: list[TaskRef]
    reads: list[str] = field(default_factory=list)  # regions read (in-BOs)
    writes: list[str] = field(default_factory=list)  # regions written (out-BOs)
    lane: int = 0  # which core queue (fd) the job goes to


@dataclass
class TensorInfo:
    name: str
    shape: list[int]
    dtype: str
    layout: str = "row"  # "row" (C order) or an NPU layout name, e.g. "nc1hwc2"
    region: str | None = None  # None: host tensor
    offset: int = 0
    nbytes: int = 0
    quant: dict[str, Any] | None = None


@dataclass
class Step:
    kind: str  # "npu" or "cpu"
    name: str
    jobs: list[Job] = field(default_factory=list)  # npu
    chained: bool = False  # npu: tails link the tasks of each job
    op: str = ""  # cpu: kernel name
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # macs, bytes, modelled cycles...


@dataclass
class Program:
    name: str
    inputs: list[str]
    outputs: list[str]
    steps: list[Step]


#: Module.metadata key: the program has PPU-only tasks (max pooling, rkc compile --kernel-ppu-irq),
#: which only a kernel that ends tasks on the PPU interrupt completes (kernel/patches/0005)
PPU_COMPLETION_KEY = "needs_ppu_completion"


@dataclass
class Module:
    regions: list[Region] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    relocations: list[Relocation] = field(default_factory=list)
    programs: list[Program] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    # -- lookups ----------------------------------------------------------------
    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise FormatError(f"no region {name!r}")

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise FormatError(f"no tensor {name!r}")

    def program(self, name: str) -> Program:
        for p in self.programs:
            if p.name == name:
                return p
        raise FormatError(f"no program {name!r} (have: {', '.join(p.name for p in self.programs)})")

    # -- serialisation ------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Module":
        """Parse and type-check every field (an rkbin is untrusted input)."""
        try:
            raw = json.loads(text)
        except RecursionError:
            raise FormatError("program description is nested too deeply") from None
        except ValueError as exc:
            raise FormatError(f"program description is not JSON ({exc})") from None
        return _build(cls, raw, "module")

    # -- validation ---------------------------------------------------------------
    def validate(self, blob_sizes: dict[str, int]) -> None:
        """Check every cross-reference and range; raise FormatError naming the first bad one."""
        if not self.programs:
            raise FormatError("the module has no programs")
        regions = {}
        for r in self.regions:
            if r.name in regions:
                raise FormatError(f"region {r.name!r} is defined twice")
            if r.kind not in REGION_KINDS:
                raise FormatError(f"region {r.name!r} has unknown kind {r.kind!r}")
            if not 0 < r.size < 1 << 32:
                raise FormatError(f"region {r.name!r} has size {r.size}, outside the 32-bit IOVA window")
            if r.blob is not None:
                if r.blob not in blob_sizes:
                    raise FormatError(f"region {r.name!r} refers to missing blob {r.blob!r}")
                if blob_sizes[r.blob] > r.size:
                    raise FormatError(f"blob {r.blob!r} ({blob_sizes[r.blob]} B) exceeds region {r.name!r}")
            regions[r.name] = r
        mapped = sum(-(-r.size // PAGE) * PAGE for r in self.regions if r.kind != "host") + PAGE  # + guard page
        if mapped > 1 << 32:
            raise FormatError(f"regions need {mapped} bytes of NPU address space (whole pages, a guard page at "
                              "0), more than the 4 GiB IOVA window")

        def entries(region: str, what: str) -> int:
            if region not in regions:
                raise FormatError(f"{what} refers to missing region {region!r}")
            if regions[region].kind != "regcmd":
                raise FormatError(f"{what} points into {regions[region].kind} region {region!r}, not regcmd")
            return regions[region].size // ENTRY_BYTES

        for i, rel in enumerate(self.relocations):
            n = entries(rel.region, f"relocation {i}")
            if not 0 <= rel.entry < n:
                raise FormatError(f"relocation {i} entry {rel.entry} is outside region {rel.region!r}")
            if rel.target not in regions:
                raise FormatError(f"relocation {i} targets missing region {rel.target!r}")
            if regions[rel.target].kind == "host":
                raise FormatError(f"relocation {i} targets host region {rel.target!r}, which has no NPU address")
            if not 0 <= rel.offset < regions[rel.target].size:
                raise FormatError(f"relocation {i} offset {rel.offset} is outside region {rel.target!r}")
        names = set()
        for t in self.tensors:
            if t.name in names:
                raise FormatError(f"tensor {t.name!r} is described twice")
            names.add(t.name)
            _check_tensor(t)
            if t.region is not None:
                if t.region not in regions:
                    raise FormatError(f"tensor {t.name!r} lives in missing region {t.region!r}")
                if t.offset < 0 or t.offset + t.nbytes > regions[t.region].size:
                    raise FormatError(f"tensor {t.name!r} ({t.nbytes} B at {t.offset}) overruns region {t.region!r}")
        programs = set()
        for p in self.programs:
            if p.name in programs:
                raise FormatError(f"program {p.name!r} is defined twice")
            programs.add(p.name)
            for name in [*p.inputs, *p.outputs]:
                if name not in names:
                    raise FormatError(f"program {p.name!r} names unknown tensor {name!r}")
            for s in p.steps:
                self._validate_step(p, s, regions, names, entries)
        self._validate_all_regions_used(regions)

    def _validate_all_regions_used(self, regions: dict) -> None:
        """A region without contents that nothing refers to only costs memory (a
        file could ask for gigabytes of scratch that way): refused."""
        used = {t.region for t in self.tensors} | {r.target for r in self.relocations} | \
            {r.region for r in self.relocations}
        for p in self.programs:
            for s in p.steps:
                for job in s.jobs:
                    used |= {*job.reads, *job.writes, *(t.region for t in job.tasks)}
        for name, r in regions.items():
            if name not in used and r.blob is None:
                raise FormatError(f"region {name!r} ({r.size} B) is used by no tensor, relocation or task")

    @staticmethod
    def _validate_step(p: Program, s: Step, regions, names, entries) -> None:
        where = f"program {p.name!r} step {s.name!r}"
        if s.kind not in STEP_KINDS:
            raise FormatError(f"{where} has unknown kind {s.kind!r}")
        if s.kind == "cpu":
            if not s.op:
                raise FormatError(f"{where} has no kernel")
            for name in [*s.inputs, *s.outputs]:
                if name and name not in names:
                    raise FormatError(f"{where} names unknown tensor {name!r}")
            return
        if s.kind != "npu":
            raise FormatError(f"{where} has unknown kind {s.kind!r}")
        if not s.jobs:
            raise FormatError(f"{where} has no jobs")
        for j, job in enumerate(s.jobs):
            if not job.tasks:
                raise FormatError(f"{where} job {j} has no tasks")
            for name in [*job.reads, *job.writes]:
                if name not in regions:
                    raise FormatError(f"{where} job {j} lists missing region {name!r}")
            for t, task in enumerate(job.tasks):
                n = entries(task.region, f"{where} job {j} task {t}")
                if task.count <= 0 or task.entry < 0 or task.entry + task.count > n:
                    raise FormatError(f"{where} job {j} task {t} (entries {task.entry}+{task.count}) "
                                      f"is outside region {task.region!r}")
                if (task.entry * ENTRY_BYTES) % 16:
                    raise FormatError(f"{where} job {j} task {t} does not start 16-byte aligned")
                if (task.count + 1) // PC_FETCH_ENTRIES - 1 > PC_AMOUNT_MAX:
                    raise FormatError(f"{where} job {j} task {t} is too long for the 16-bit PC amount")


def _check_tensor(t: TensorInfo) -> None:
    if t.dtype not in {d.value for d in DType}:
        raise FormatError(f"tensor {t.name!r} has unknown dtype {t.dtype!r}")
    if t.layout not in TENSOR_LAYOUTS:
        raise FormatError(f"tensor {t.name!r} has unknown layout {t.layout!r} (known: {', '.join(TENSOR_LAYOUTS)})")
    if any(d < 0 for d in t.shape) or len(t.shape) > 8:
        raise FormatError(f"tensor {t.name!r} has shape {t.shape}: dimensions must be >= 0, at most 8 of them")
    if t.offset < 0 or t.nbytes < 0:
        raise FormatError(f"tensor {t.name!r} has offset {t.offset} / nbytes {t.nbytes}: negative")
    if t.region is not None and t.layout in ("row", "packed"):
        want = DType(t.dtype).itemsize
        for d in t.shape:
            want *= d
        if t.nbytes != want:
            raise FormatError(f"tensor {t.name!r} declares {t.nbytes} bytes, but {t.shape} x {t.dtype} is {want}")
    elif t.region is not None:
        try:
            want = geometry.nbytes(t.shape, t.layout, DType(t.dtype).itemsize)
        except ValueError as exc:
            raise FormatError(f"tensor {t.name!r}: {exc}") from None
        if t.nbytes < want:  # more is fine: a producer may pad channels further (int8 C2 = 16)
            raise FormatError(f"tensor {t.name!r} declares {t.nbytes} bytes, but {t.shape} {t.dtype} in layout "
                              f"{t.layout} takes {want}")


# -- typed construction from JSON ------------------------------------------------------
def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _value(tp, value, where: str, depth: int):
    """`value` checked against the annotation `tp` (and built if a dataclass)."""
    if depth > MAX_JSON_DEPTH:
        raise FormatError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep")
    origin = typing.get_origin(tp)
    if tp is Any:
        _bounded_depth(value, where, depth)
        return value
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", ())):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _value(inner[0], value, where, depth)
    if origin is list:
        if not isinstance(value, list):
            raise FormatError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_value(item, v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise FormatError(f"{where}: expected an object, got {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {k: _value(item, v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(tp, type) and hasattr(tp, "__dataclass_fields__"):
        return _build(tp, value, where, depth + 1)
    if tp is bool:
        if not isinstance(value, bool):
            raise FormatError(f"{where}: expected true/false, got {value!r:.40}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FormatError(f"{where}: expected an integer, got {value!r:.40}")
        if not -(1 << 63) <= value < 1 << 63:
            raise FormatError(f"{where}: {value} does not fit 64 bits")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise FormatError(f"{where}: expected a string, got {value!r:.40}")
        return value
    raise FormatError(f"{where}: cannot check a field of type {_type_name(tp)}")  # a bug in the table


def _bounded_depth(value, where: str, depth: int) -> None:
    stack = [(value, depth)]
    while stack:
        v, d = stack.pop()
        if d > MAX_JSON_DEPTH:
            raise FormatError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)


@functools.cache
def _schema(cls) -> tuple[dict, dict]:
    """A dataclass's resolved annotations and fields, once per class (resolving
    them per object was most of the time reading an LLM rkbin's module)."""
    return typing.get_type_hints(cls), {f.name: f for f in fields(cls)}


def _build(cls, raw, where: str, depth: int = 0):
    if not isinstance(raw, dict):
        raise FormatError(f"{where}: expected an object, got {type(raw).__name__}")
    hints, known = _schema(cls)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise FormatError(f"{where}: unknown field {unknown[0]!r}")
    values = {}
    for name, f in known.items():
        if name not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                raise FormatError(f"{where}: missing field {name!r}")
            continue
        label = f"{where} {raw['name']!r}" if isinstance(raw.get("name"), str) and name != "name" else where
        values[name] = _value(hints[name], raw[name], f"{label}.{name}", depth)
    return cls(**values)
