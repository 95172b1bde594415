"""The rkbin program writer: collects regions, tensors, relocations and
programs into an ir.program.Module plus its blobs. Graph-kind agnostic; the
ONNX build and the LLM build both drive it.

Regions it makes (only those that end up non-empty):
  "weights"  read-only NPU weights, in native layouts (one BO)
  "host"     constants only CPU steps read (kept in host memory)
  "regcmd"   every task's register commands (one BO)
  "scratch"  NPU activations; offsets from the memory plan (one BO)
Several programs may share all of them: programs never run at the same time,
so the scratch plan is per program and the region is as large as the largest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from rkc.compiler.memplan import IOVA_WINDOW, Buffer, MemoryPlan, plan_memory
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu.regcmd import ENTRY_BYTES
from rkc.ir.program import Job, Module, Program, Region, Relocation, Step, TaskRef, TensorInfo
from rkc.ir.spool import SpooledBlob
from rkc.ir.types import DType, Quant

ALIGN = 64  # bytes; every tensor in a region starts at a 64-byte boundary


def _align(v: int, a: int = ALIGN) -> int:
    return -(-v // a) * a


@dataclass
class _Blob:
    parts: list[np.ndarray] = field(default_factory=list)
    size: int = 0
    # written out as it is made, nothing held (ModuleBuilder(spool_dir=...))
    spool: SpooledBlob | None = None
    reserved_end: int = 0  # reserve(): the end the reserved bytes reach

    def add(self, data: np.ndarray, align: int = ALIGN) -> int:
        self._check_reserved()
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        offset = _align(self.size, align)
        if offset > self.size:
            self._append(np.zeros(offset - self.size, np.uint8))
        self._append(raw)
        self.size = offset + raw.size
        return offset

    def reserve(self, nbytes: int, align: int = ALIGN) -> tuple[int, Callable[[np.ndarray], None]]:
        """(offset, write): `nbytes` placed at `offset`, their bytes given to
        `write` in order, block by block (a table encoded in row blocks is never
        whole in memory); the next add() checks that all of them came."""
        self._check_reserved()
        offset = _align(self.size, align)
        if offset > self.size:
            self._append(np.zeros(offset - self.size, np.uint8))
        self.size = offset
        end = self.reserved_end = offset + nbytes

        def write(block: np.ndarray) -> None:
            raw = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
            if self.size + raw.size > end:
                raise ValueError(f"{raw.size} bytes written past the {nbytes} reserved")
            self._append(raw)
            self.size += raw.size

        return offset, write

    def _check_reserved(self) -> None:
        if self.reserved_end > self.size:
            raise ValueError(f"internal: {self.reserved_end - self.size} reserved bytes never written")

    def _append(self, raw: np.ndarray) -> None:
        if self.spool is not None:
            self.spool.append(raw)
        else:
            self.parts.append(raw)

    def bytes(self) -> np.ndarray | SpooledBlob:
        """The parts as one array, each part let go once copied (an LLM's
        weights are not held twice; the one array stays the only part), or
        the spool they were written to."""
        self._check_reserved()
        if self.spool is not None:
            return self.spool
        out = np.empty(self.size, np.uint8)
        pos = 0
        for i, part in enumerate(self.parts):
            out[pos:pos + part.size] = part
            pos += part.size
            self.parts[i] = None
        self.parts = [out]
        return out


def quant_dict(q: Quant | None, payloads: dict[str, np.ndarray] | None = None) -> dict | None:
    """Quantization parameters as JSON-able data for TensorInfo.quant."""
    if q is None:
        return None
    if hasattr(q, "axis"):
        p = payloads or {}
        return {"axis": q.axis, "scale": np.asarray(p.get(q.scale, [])).astype(float).tolist(),
                "zero_point": np.asarray(p.get(q.zero_point, [])).astype(int).tolist()}
    if hasattr(q, "scale"):
        return {"scale": float(q.scale), "zero_point": int(q.zero_point)}
    return {"block": q.ggml_type}


@dataclass(frozen=True)
class PlacedBytes:
    """Stands for bytes a spooling builder has written out: their length and
    digest, no data. A pack cache holds it instead of the packed bytes, so a
    later program placing the same weights again finds them placed."""

    nbytes: int
    digest: str

    def __len__(self) -> int:
        return self.nbytes


class ModuleBuilder:
    def __init__(self, metadata: dict | None = None, spool_dir: str | Path | None = None) -> None:
        """`spool_dir`: the weights and host regions are written to temporary
        files there as they are made (ir/spool.py), not held in memory."""
        self.metadata = dict(metadata or {})
        self.tensors: dict[str, TensorInfo] = {}
        spool = (lambda: SpooledBlob(spool_dir)) if spool_dir is not None else (lambda: None)
        self.weights = _Blob(spool=spool())
        self.host = _Blob(spool=spool())
        self.regcmd = _Blob()
        self.relocations: list[Relocation] = []
        self.programs: list[Program] = []
        self.lifetimes: dict[str, dict[str, list[int]]] = {}  # program -> scratch tensor -> [first, last] step
        self.zero_rows_read: set[str] = set()  # maps read over their zero rows: never lent (_view_buffers)
        # scratch tensor -> (tensor it is part of, byte offset in it): a channel slice of a
        # concatenation or split shares its bytes (add_views); the memory plan places roots only
        self.views: dict[str, tuple[str, int]] = {}
        self.leaves: set[str] = set()  # tensors in views that hold their own values
        self.derived: set[str] = set()  # tensors in views that only gather others'
        # scratch tensor -> its own bytes, before the NPU's channel padding grows it (grow)
        self.declared: dict[str, int] = {}
        # NPU group output -> its rank in the program's write order (mark_written): a slice's
        # padding may lie under the next slice only when that slice is written later
        self.write_rank: dict[str, int] = {}
        self._low: dict[str, int] = {}
        self._weight_digests: dict[str, str] = {}
        # name -> the array last placed under it: a program placing the very same
        # array again (the LLM programs share a pack cache) is not hashed again
        # (an LLM's weights hashed once per program: ~3 s of Gemma 3 270M's fp16 compile)
        self._weight_arrays: dict[str, np.ndarray | bytes] = {}

    # -- tensors ------------------------------------------------------------------
    def _info(self, info: TensorInfo) -> TensorInfo:
        if info.name in self.tensors:
            raise UnsupportedError(f"tensor {info.name!r} is placed twice")
        self.tensors[info.name] = info
        return info

    def host_tensor(self, name: str, shape, dtype: DType, quant: dict | None = None) -> TensorInfo:
        """A tensor that lives in host memory while a program runs (CPU steps, I/O)."""
        return self._info(TensorInfo(name, [int(d) for d in shape], dtype.value, quant=quant))

    def host_const(self, name: str, value: np.ndarray) -> TensorInfo:
        value = np.ascontiguousarray(value)
        offset = self.host.add(value)
        return self._info(TensorInfo(name, list(value.shape), DType.from_numpy(value.dtype).value, "row", "host",
                                     offset, value.nbytes))

    def host_const_blocks(self, name: str, shape, dtype: np.dtype) -> Callable[[np.ndarray], None]:
        """A host constant whose bytes come block by block, in order, through
        the returned function (a table encoded in row blocks, never whole)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        offset, write = self.host.reserve(nbytes)
        self._info(TensorInfo(name, [int(d) for d in shape], DType.from_numpy(dtype).value, "row", "host",
                              offset, nbytes))
        return write

    def weight(self, name: str, packed: np.ndarray | bytes, shape, dtype: DType, layout: str,
               quant: dict | None = None) -> TensorInfo:
        """NPU weights already in their native layout (`packed` holds the bytes).
        Programs that place the same weights under the same name share one copy."""
        if name in self.tensors and self._weight_arrays.get(name) is packed:
            return self.tensors[name]
        if isinstance(packed, PlacedBytes):
            raise UnsupportedError(f"internal: weights {name!r} stand for bytes this builder never placed")
        source, packed = packed, np.frombuffer(packed, np.uint8) if isinstance(packed, bytes) else packed
        digest = hashlib.sha256(memoryview(np.ascontiguousarray(packed)).cast("B")).hexdigest()  # no copy
        if name in self.tensors and self._weight_digests.get(name) == digest:
            return self.tensors[name]
        self._weight_digests[name] = digest
        # spooled: the bytes are written out below, only their stand-in is kept
        self._weight_arrays[name] = source if self.weights.spool is None else \
            PlacedBytes(int(np.asarray(packed).nbytes), digest)
        offset = self.weights.add(packed)
        return self._info(TensorInfo(name, [int(d) for d in shape], dtype.value, layout, "weights", offset,
                                     int(np.asarray(packed).nbytes), quant))

    def placed(self, name: str) -> PlacedBytes | None:
        """The stand-in for weights `name` a spooling builder has written out
        (None otherwise): what a pack cache may hold instead of their bytes."""
        standin = self._weight_arrays.get(name)
        return standin if isinstance(standin, PlacedBytes) else None

    def scratch_tensor(self, program: str, name: str, shape, dtype: DType, layout: str, nbytes: int,
                       quant: dict | None = None) -> TensorInfo:
        """An NPU activation of `program`; `touch` records the steps that use it,
        and the memory plan gives its offset at finish()."""
        info = self._info(TensorInfo(name, [int(d) for d in shape], dtype.value, layout, "scratch", 0,
                                     _align(nbytes, 16), quant))
        self.lifetimes.setdefault(program, {})[name] = []
        self.declared[name] = info.nbytes
        return info

    def mark_written(self, name: str) -> None:
        """`name`'s one writer runs after every tensor marked before it: the caller marks
        NPU groups' outputs as it appends their steps, a segment's in group order. The
        order is the hardware's: steps run in program order, and a segment's jobs, in
        group order, all list the scratch BO as an out-BO, so rocket makes each wait for
        every earlier writer of it (write fences on out-BOs: hw-rocket-and-mesa.md 1.3);
        the simulator and the null device run them in array order."""
        self.write_rank[name] = len(self.write_rank)

    def root(self, name: str) -> tuple[str, int]:
        """The tensor whose bytes `name` is part of, and `name`'s byte offset in it."""
        delta = 0
        while name in self.views:
            name, d = self.views[name]
            delta += d
        return name, delta

    def add_views(self, parts: list[tuple[str, str, int]], derived: list[str]) -> bool:
        """Make each (tensor, whole, offset) of `parts` a slice of `whole` at that byte
        offset, `derived` naming the tensors that only gather others (a concatenation's
        result, a split's pieces). All or nothing: False (and no change) when a slice
        contradicts an earlier one or two tensors holding their own values would share bytes."""
        views = dict(self.views)
        for name, whole, offset in parts:
            (ra, da), (rb, db) = self._root_in(views, name), self._root_in(views, whole)
            if ra == rb:
                if da != db + offset:
                    return False
                continue
            views[ra] = (rb, db + offset - da)
        gathered = self.derived | set(derived)
        leaves = (self.leaves | {x for n, w, _ in parts for x in (n, w)}) - gathered
        if self._overlapping(views, leaves):
            return False
        self.views, self.leaves, self.derived = views, leaves, gathered
        return True

    def _overlapping(self, views: dict[str, tuple[str, int]], leaves: set[str]) -> bool:
        """Whether two tensors holding their own values share bytes, but for a tensor's
        padding past its own bytes (a 16-channel kernel group's last 8 fp16 channels) lying
        under a slice written after it, which overwrites it (`spill_covered`)."""
        spans: dict[str, list[tuple[int, int, str]]] = {}
        for name in leaves:
            r, d = self._root_in(views, name)
            spans.setdefault(r, []).append((d, d + self.tensors[name].nbytes, name))
        for ranges in spans.values():
            ranges.sort()
            for i, a in enumerate(ranges):
                for b in ranges[i + 1:]:
                    if b[0] >= a[1]:
                        break
                    if not self.spill_covered(a, b):
                        return True
        return False

    def spill_covered(self, a: tuple[int, int, str], b: tuple[int, int, str]) -> bool:
        """Whether slice `b` (start, end, name) may overlap slice `a` that starts before it:
        only `a`'s padding reaches `b`, `b`'s writer runs after `a`'s (mark_written) and
        writes whole the bytes of `a`'s padding it lies over (its own start onward)."""
        rank_a, rank_b = self.write_rank.get(a[2]), self.write_rank.get(b[2])
        return (rank_a is not None and rank_b is not None and rank_a < rank_b
                and a[0] + self.declared.get(a[2], a[1] - a[0]) <= b[0])

    @staticmethod
    def _root_in(views: dict[str, tuple[str, int]], name: str) -> tuple[str, int]:
        delta = 0
        while name in views:
            name, d = views[name]
            delta += d
        return name, delta

    def touch(self, program: str, name: str, step: int) -> None:
        """Step `step` of `program` reads or writes scratch tensor `name`."""
        span = self.lifetimes[program][name]
        span[:] = [min(span[0], step), max(span[1], step)] if span else [step, step]

    def grow(self, name: str, nbytes: int) -> None:
        """The NPU touches `nbytes` of tensor `name` (channel or row padding)."""
        info = self.tensors[name]
        info.nbytes = max(info.nbytes, _align(nbytes, 16))

    # -- steps ------------------------------------------------------------------------
    def append_step(self, program: str, steps: list[Step], step: Step) -> None:
        """Append `step` to `program`'s steps, recording which scratch tensors it uses."""
        index = len(steps)
        steps.append(step)
        for name in [*step.inputs, *step.outputs]:
            if name and name in self.lifetimes.get(program, {}):
                self.touch(program, name, index)

    def append_segment(self, program: str, steps: list[Step], lowered) -> None:
        """Append an NPU segment (compiler/emitter_ops.SegmentLowering): its tensors
        grow to what its tasks touch, and its emitter scratch lives for its step."""
        for buffer, end in lowered.extents.items():
            if buffer in self.tensors and self.tensors[buffer].region == "scratch":
                self.grow(buffer, end)
        self.zero_rows_read.update(lowered.zero_rows)
        for name, size in lowered.scratch:
            self.scratch_tensor(program, name, [size], DType.UINT8, "row", size)
        self.append_step(program, steps, lowered.step)
        for name, _ in lowered.scratch:
            self.touch(program, name, len(steps) - 1)

    # -- register commands ----------------------------------------------------------
    def add_regcmd(self, entries: np.ndarray) -> int:
        """Append a task's entries (16-byte aligned); returns its first entry index."""
        offset = self.regcmd.add(np.asarray(entries, dtype="<u8"), align=16)
        return offset // ENTRY_BYTES

    def relocate(self, entry: int, target: str, offset: int = 0) -> None:
        """Regcmd entry `entry` (absolute index in the regcmd region) gets the
        IOVA of `target` + offset, where `target` is a region or a tensor placed
        in a region (resolved at finish(), once the memory plan is known)."""
        self.relocations.append(Relocation("regcmd", entry, target, offset))

    def region_of(self, name: str) -> str:
        """The region a tensor lives in (or `name` itself when it is a region)."""
        info = self.tensors.get(name)
        if info is not None and info.region is not None:
            return info.region
        if name in ("weights", "host", "regcmd", "scratch"):
            return name
        raise UnsupportedError(f"NPU buffer {name!r} was never placed")

    def task(self, entry: int, count: int) -> TaskRef:
        return TaskRef("regcmd", entry, count)

    # -- programs -------------------------------------------------------------------
    def program(self, name: str, inputs: list[str], outputs: list[str], steps: list[Step]) -> Program:
        p = Program(name, inputs, outputs, steps)
        self.programs.append(p)
        return p

    def _view_buffers(self, spans: dict[str, list[int]]) -> list[Buffer]:
        """One buffer per root: over the bytes and steps of every tensor that is part of it."""
        extent: dict[str, list[int]] = {}
        for name, span in spans.items():
            root, delta = self.root(name)
            e = extent.setdefault(root, [delta, delta + self.tensors[name].nbytes, *(span or [1 << 62, -1])])
            e[0], e[1] = min(e[0], delta), max(e[1], delta + self.tensors[name].nbytes)
            if span:
                e[2], e[3] = min(e[2], span[0]), max(e[3], span[1])
        self._low = {root: e[0] for root, e in extent.items()}
        if self._overlapping(self.views, self.leaves):  # a tensor grew past its slice (padding)
            raise UnsupportedError("internal: the NPU writes past a concatenation slice")
        # a map stored with zero rows below it (ir/npu/geometry.py) that a convolution reads
        # with them as its padding: no other tensor may ever write those bytes, so it holds
        # them the whole program (they are zero from the load on: a new BO is zeroed by
        # the kernel, the simulator's and the null device's by numpy, and only the h rows
        # are ever written: by the NPU's writers and the host's packing, which zeroes them)
        first = min((e[2] for e in extent.values() if e[3] >= 0), default=0)
        last = max((e[3] for e in extent.values()), default=-1)
        for name in spans:
            e = extent[self.root(name)[0]]
            if e[3] >= 0 and name in self.zero_rows_read:
                e[2], e[3] = first, last
        return [Buffer(root, e[1] - e[0], e[2], e[3]) for root, e in extent.items() if e[3] >= 0]

    def scratch_bytes(self, program: str) -> int:
        """The scratch one lowered program needs alone (its memory plan's size)."""
        return plan_memory(self._view_buffers(self.lifetimes.get(program, {}))).size

    def mapped_bytes(self) -> int:
        """The NPU regions made so far but the scratch: weights and regcmd."""
        return _align(self.weights.size, 4096) + _align(self.regcmd.size, 4096)

    def finish(self) -> tuple[Module, dict[str, np.ndarray], dict[str, MemoryPlan]]:
        self._weight_arrays.clear()  # the weights region's bytes() lets each part go once copied
        plans = {}
        if len(self.lifetimes) > 1 and self.zero_rows_read:
            raise UnsupportedError("internal: maps kept with zero rows in a module of several programs, "
                                   "which share the scratch bytes")
        for program, spans in self.lifetimes.items():
            unused = [n for n, span in spans.items() if not span and n not in self.views and
                      not any(self.root(v)[0] == n for v in self.views)]
            if unused:
                raise UnsupportedError(f"scratch tensor {unused[0]!r} of program {program!r} is never used")
            buffers = self._view_buffers(spans)
            plans[program] = plan_memory(buffers)
            for name in spans:
                root, delta = self.root(name)
                self.tensors[name].offset = plans[program].offsets[root] + delta - self._low.get(root, 0)
        for rel in self.relocations:  # symbolic targets -> region + offset
            info = self.tensors.get(rel.target)
            if info is not None:
                rel.target, rel.offset = info.region, info.offset + rel.offset
        scratch = max((p.size for p in plans.values()), default=0)
        regions, blobs = [], {}
        used = {t.region for t in self.tensors.values()}
        for region, kind, blob in (("weights", "weights", self.weights), ("host", "host", self.host),
                                   ("regcmd", "regcmd", self.regcmd)):
            if blob.size or region in used:
                blobs[region] = blob.bytes()
                regions.append(Region(region, max(_align(blob.size, 4096), 4096), kind, region))
        if scratch:
            regions.append(Region("scratch", _align(scratch, 4096), "scratch"))
        check_iova_window(regions)
        module = Module(regions, list(self.tensors.values()), self.relocations, self.programs, self.metadata)
        return module, blobs, plans


def check_iova_window(regions: list[Region], window: int = IOVA_WINDOW) -> None:
    """Refuse, at compile time, a module whose NPU regions (all but host
    memory) cannot be mapped together in the NPU's 32-bit IOVA window."""
    mapped = [r for r in regions if r.kind != "host"]
    total = sum(r.size for r in mapped)
    if total >= window:
        sizes = ", ".join(f"{r.name} {r.size / 2**20:.0f} MiB" for r in mapped)
        # the scratch is the largest program's activations: an LLM's longest prefill chunk
        hint = "; smaller prefill chunks (--prefill-chunks) shrink the scratch" if any(
            r.kind == "scratch" for r in mapped) else ""
        raise UnsupportedError(f"the model's NPU buffers need {total / 2**20:.0f} MiB ({sizes}), more than the "
                               f"{window / 2**20:.0f} MiB the NPU's 32-bit IOVA window holds{hint}")


def npu_job(tasks: list[TaskRef], reads: list[str], writes: list[str], lane: int = 0) -> Job:
    return Job(tasks, reads, writes, lane)
