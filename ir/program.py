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

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rkc.ir.errors import FormatError
from rkc.ir.npu.regcmd import ENTRY_BYTES, PC_AMOUNT_MAX, PC_FETCH_ENTRIES

# "host": constants only CPU steps read; the loader keeps them in host memory (no BO)
REGION_KINDS = ("weights", "regcmd", "scratch", "io", "host")


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
        try:
            raw = json.loads(text)
            return cls(
                regions=[Region(**r) for r in raw["regions"]],
                tensors=[TensorInfo(**t) for t in raw["tensors"]],
                relocations=[Relocation(**r) for r in raw["relocations"]],
                programs=[
                    Program(p["name"], p["inputs"], p["outputs"], [
                        Step(**{**s, "jobs": [Job(**{**j, "tasks": [TaskRef(**t) for t in j["tasks"]]})
                                              for j in s["jobs"]]})
                        for s in p["steps"]])
                    for p in raw["programs"]
                ],
                metadata=raw.get("metadata", {}),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"program description is malformed ({type(exc).__name__}: {exc})") from None

    # -- validation ---------------------------------------------------------------
    def validate(self, blob_sizes: dict[str, int]) -> None:
        """Check every cross-reference; raise FormatError naming the first bad one."""
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
        if sum(r.size for r in self.regions if r.kind != "host") >= 1 << 32:
            raise FormatError("regions do not fit the 4 GiB IOVA window")

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
            if not 0 <= rel.offset < regions[rel.target].size:
                raise FormatError(f"relocation {i} offset {rel.offset} is outside region {rel.target!r}")
        names = set()
        for t in self.tensors:
            if t.name in names:
                raise FormatError(f"tensor {t.name!r} is described twice")
            names.add(t.name)
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

    @staticmethod
    def _validate_step(p: Program, s: Step, regions, names, entries) -> None:
        where = f"program {p.name!r} step {s.name!r}"
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
