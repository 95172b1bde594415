"""Captured regcmd cases (../shared/golden) as relocatable programs for any Device.

A capture holds buffers at the addresses a fake kernel handed out. A real
rocket kernel chooses its own IOVAs, so instead of recreating those addresses
this module creates one BO per captured buffer wherever the device puts it and
rewrites every address entry listed in the capture's `relocations` (and every
regcmd address of the job lists) to the new BO + offset. The same code then
feeds the simulator, the rocket device over the emulated kernel, or a board:
`rkrun --replay` (runtime/replay.py), the rocket tests and `rkc probe`.

Both formats are read: `rkc-mesa-rocket-golden/1` (submits[].bo_contents) and
`rkc-gemm-golden/1` (buffers[].snapshots). See their README.md files. Every
buffer is checked against its recorded sha256 as it is loaded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.npu import regcmd
from rkc.runtime.device import BufferObject, Device, Job, Task

MESA = "rkc-mesa-rocket-golden/1"
GEMM = "rkc-gemm-golden/1"


@dataclass(frozen=True)
class TaskReference:
    """What a task must leave in a buffer (GEMM captures: its tile in the NPU layout)."""

    handle: int  # captured handle of the buffer
    offset: int
    data: bytes
    dtype: str  # int32 | fp32 | fp16


@dataclass
class CapturedTask:
    regcmd_bo: int  # captured handle
    regcmd_offset: int
    entries: np.ndarray  # as captured (old addresses)
    relocations: list[tuple[int, int, int]]  # (entry index, captured handle, offset in BO)
    reference: TaskReference | None = None
    tile: dict | None = None  # GEMM captures: m0, n0, Mtile, Ntile, ... of the task's tile


@dataclass
class CapturedJob:
    tasks: list[CapturedTask]
    in_handles: list[int]
    out_handles: list[int]
    lane: int = 0  # captures have none; emitted programs spread jobs over lanes


@dataclass
class CapturedCase:
    name: str
    sizes: dict[int, int]  # captured handle -> size
    contents: list[dict[int, bytes]]  # per submit: handle -> bytes to load before it
    submits: list[list[CapturedJob]]
    raw: dict = field(repr=False, default_factory=dict)  # the capture as read (references, roles, params)
    schema: str = ""
    status: str = "ok"  # the capture's status: anything but "ok" compiled nothing to run

    @property
    def task_count(self) -> int:
        return sum(len(j.tasks) for s in self.submits for j in s)


def decode_blob(blob: dict, what: str) -> bytes:
    """The bytes of a captured blob (`data` in `encoding`), checked against its sha256."""
    encoding = blob.get("encoding")
    if encoding != "zlib+base64":
        raise FormatError(f"{what}: unknown encoding {encoding!r}")
    data = zlib.decompress(base64.b64decode(blob["data"], validate=True))
    return _checked(data, blob, what)


def _checked(data: bytes, blob: dict, what: str) -> bytes:
    want = blob.get("sha256")
    if want is not None and hashlib.sha256(data).hexdigest() != want:
        raise FormatError(f"{what}: contents do not match their sha256")
    return data


def load_case(path: str | Path) -> CapturedCase:
    """Read a capture; FormatError (one line, naming the file) for anything else."""
    path = Path(path)
    try:
        case = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a readable JSON capture ({exc})") from None
    schema = case.get("schema") if isinstance(case, dict) else None
    loader = _LOADERS.get(schema) if isinstance(schema, str) else None
    if loader is None:
        raise FormatError(f"{path}: not a captured regcmd case (schema {schema!r}; expected {MESA} or {GEMM})")
    try:
        return loader(case)
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, zlib.error, binascii.Error) as exc:
        raise FormatError(f"{path}: malformed capture ({type(exc).__name__}: {exc})") from None


def _tasks(job: dict) -> list[CapturedTask]:
    out = []
    for t in job["tasks"]:
        ref = t.get("reference_output")
        reference = None
        if ref and ref.get("data"):
            data = decode_blob(ref, f"task reference in buffer {ref['bo_handle']}")
            if ref.get("nbytes", len(data)) != len(data):
                raise FormatError(f"task reference: {len(data)} bytes, the capture says {ref['nbytes']}")
            reference = TaskReference(ref["bo_handle"], ref["offset_in_bo"], data, ref["dtype"])
        out.append(CapturedTask(
            t["regcmd_bo_handle"], t["regcmd_offset_in_bo"],
            np.array([int(h, 16) for h in t["regcmd"]], dtype=np.uint64),
            [(r["entry"], r["bo_handle"], r["offset_in_bo"]) for r in t["relocations"]],
            reference, t.get("tile")))
    return out


def _load_mesa(case: dict) -> CapturedCase:
    tensors = {t["index"]: t for t in case["model"]["tensors"]}
    sizes = {b["handle"]: b["size"] for b in case.get("bos", [])}
    contents, submits = [], []
    for s in case.get("submits", []):
        loaded = {}
        for c in s["bo_contents"]:
            what = f"BO {c['handle']}"
            if "data" in c:
                loaded[c["handle"]] = decode_blob(c, what)
            else:  # Teflon's upload: the model tensor's raw bytes
                tensor = base64.b64decode(tensors[c["same_bytes_as_model_tensor"]]["data_b64"], validate=True)
                loaded[c["handle"]] = _checked(tensor, c, what)
        contents.append(loaded)
        submits.append([CapturedJob(_tasks(j), j["in_bo_handles"], j["out_bo_handles"]) for j in s["jobs"]])
    return _validated(CapturedCase(case["name"], sizes, contents, submits, case, MESA, case.get("status", "ok")))


def _load_gemm(case: dict) -> CapturedCase:
    buffers, submits = case.get("buffers", []), case.get("submits", [])  # rejected shapes have neither
    sizes = {b["handle"]: b["size"] for b in buffers}
    contents = [{} for _ in submits]
    for b in buffers:
        for snap in b.get("snapshots") or []:
            contents[snap["submit"]][b["handle"]] = decode_blob(snap, f"buffer {b['handle']}")
    jobs = [[CapturedJob(_tasks(j), j["in_bo_handles"], j["out_bo_handles"]) for j in s["jobs"]] for s in submits]
    return _validated(CapturedCase(case["name"], sizes, contents, jobs, case, GEMM, case.get("status", "ok")))


def _validated(case: CapturedCase) -> CapturedCase:
    """Every handle, offset and length the case uses lies inside a captured
    buffer, so placing and running it cannot fail on the capture's own account."""
    def inside(handle: int, start: int, nbytes: int, what: str) -> None:
        if handle not in case.sizes:
            raise FormatError(f"{what}: no buffer with handle {handle}")
        if start < 0 or start + nbytes > case.sizes[handle]:
            raise FormatError(f"{what}: bytes [{start}, {start + nbytes}) are outside buffer {handle} "
                              f"({case.sizes[handle]} bytes)")

    for s, loaded in enumerate(case.contents):
        for handle, data in loaded.items():
            inside(handle, 0, len(data), f"submit {s}: contents of buffer {handle}")
    for s, jobs in enumerate(case.submits):
        for j, job in enumerate(jobs):
            for handle in (*job.in_handles, *job.out_handles):
                inside(handle, 0, 0, f"submit {s} job {j}")
            for i, t in enumerate(job.tasks):
                what = f"submit {s} job {j} task {i}"
                inside(t.regcmd_bo, t.regcmd_offset, 8 * len(t.entries), f"{what} regcmd")
                for entry, handle, offset in t.relocations:
                    if not 0 <= entry < len(t.entries):
                        raise FormatError(f"{what}: relocation of entry {entry} outside its {len(t.entries)} entries")
                    inside(handle, offset, 0, f"{what} relocation of entry {entry}")
                if t.reference is not None:
                    inside(t.reference.handle, t.reference.offset, len(t.reference.data), f"{what} reference")
    return case


_LOADERS = {MESA: _load_mesa, GEMM: _load_gemm}


class PlacedCase:
    """A captured case with its buffers created on `device`."""

    def __init__(self, case: CapturedCase, device: Device) -> None:
        self.case, self.device = case, device
        self.bos: dict[int, BufferObject] = {}
        try:
            for handle, size in case.sizes.items():
                self.bos[handle] = device.create_bo(size)
        except BaseException:
            self.free()
            raise

    def free(self) -> None:
        for bo in self.bos.values():
            self.device.free_bo(bo)
        self.bos = {}

    def __enter__(self) -> "PlacedCase":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def relocated(self, task: CapturedTask) -> np.ndarray:
        entries = task.entries.copy()
        for index, handle, offset in task.relocations:
            e = int(entries[index])
            address = self.bos[handle].iova + offset
            entries[index] = np.uint64((e & ~(0xFFFFFFFF << 16)) | (address << 16))
        return entries

    def load(self, s: int, link_tails: bool = False) -> list[Job]:
        """Write what submit `s` found in memory, relocate its regcmds, hand
        everything to the NPU; -> its jobs. With `link_tails`, each task's tail
        is pointed at the next task of its job (for a hardware-chained kick;
        captures of stock rocket leave the link slots empty)."""
        dirty = set()  # BOs the CPU holds (PREP_BO) while it writes them

        def hold(handle: int) -> BufferObject:
            if handle not in dirty:
                self.device.prepare_cpu_access(self.bos[handle])
                dirty.add(handle)
            return self.bos[handle]

        for handle, data in self.case.contents[s].items():
            hold(handle).host[: len(data)] = np.frombuffer(data, np.uint8)
        jobs = []
        for j, cj in enumerate(self.case.submits[s]):
            programs = [(t.regcmd_bo, t.regcmd_offset, self.relocated(t)) for t in cj.tasks]
            tasks = [Task(self.bos[h].iova + offset, len(entries)) for h, offset, entries in programs]
            if link_tails:
                for (_, _, entries), nxt in zip(programs, tasks[1:]):
                    regcmd.link_tail(entries, nxt.regcmd_iova, nxt.regcmd_count)
            for h, offset, entries in programs:
                raw = entries.astype("<u8").view(np.uint8)
                hold(h).host[offset: offset + raw.nbytes] = raw
            jobs.append(Job(tasks, [self.bos[h] for h in cj.in_handles], [self.bos[h] for h in cj.out_handles],
                            lane=cj.lane, label=f"{self.case.name} submit {s} job {j}"))
        for handle in sorted(dirty):
            self.device.finish_cpu_access(self.bos[handle])
        return jobs

    def read(self, handle: int, start: int = 0, nbytes: int | None = None) -> bytes:
        """Bytes [start, start + nbytes) of a buffer (default: to its captured
        size; a device may round a BO up, and reads may reach into that rounding)."""
        bo = self.bos[handle]
        end = self.case.sizes[handle] if nbytes is None else start + nbytes
        if end > bo.size:
            raise FormatError(f"{self.case.name}: reading bytes [{start}, {end}) of buffer {handle}, "
                              f"a {bo.size}-byte BO")
        self.device.prepare_cpu_access(bo)
        data = bo.host[start:end].tobytes()
        self.device.finish_cpu_access(bo)
        return data
