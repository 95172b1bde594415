"""Captured regcmd cases (../shared/golden) as relocatable programs for any Device.

A capture holds buffers at the addresses a fake kernel handed out. A real
rocket kernel chooses its own IOVAs, so instead of recreating those addresses
this module creates one BO per captured buffer wherever the device puts it and
rewrites every address entry listed in the capture's `relocations` (and every
regcmd address of the job lists) to the new BO + offset. The same code then
feeds the simulator, the rocket device over the emulated kernel, or a board.

Both formats are read: `rkc-mesa-rocket-golden/1` (submits[].bo_contents) and
`rkc-gemm-golden/1` (buffers[].snapshots). See their README.md files.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ir.errors import FormatError
from ir.npu import regcmd
from runtime.device import BufferObject, Device, Job, Task


@dataclass
class CapturedTask:
    regcmd_bo: int  # captured handle
    regcmd_offset: int
    entries: np.ndarray  # as captured (old addresses)
    relocations: list[tuple[int, int, int]]  # (entry index, captured handle, offset in BO)
    reference: tuple[int, int, bytes] | None = None  # (handle, offset, bytes the task must write)


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
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def task_count(self) -> int:
        return sum(len(j.tasks) for s in self.submits for j in s)


def _unpack(blob: dict) -> bytes:
    if blob.get("encoding") != "zlib+base64":
        raise FormatError(f"unknown buffer encoding {blob.get('encoding')!r}")
    return zlib.decompress(base64.b64decode(blob["data"]))


def load_case(path: str | Path) -> CapturedCase:
    path = Path(path)
    try:
        case = json.loads(path.read_text())
        schema = case.get("schema", "")
        if schema.startswith("rkc-mesa-rocket-golden"):
            return _load_mesa(case)
        if schema.startswith("rkc-gemm-golden"):
            return _load_gemm(case)
    except (ValueError, KeyError, TypeError, zlib.error) as exc:
        raise FormatError(f"{path}: not a captured regcmd case ({type(exc).__name__}: {exc})") from None
    raise FormatError(f"{path}: unknown capture schema {case.get('schema')!r}")


def _tasks(job: dict) -> list[CapturedTask]:
    out = []
    for t in job["tasks"]:
        ref = t.get("reference_output")
        out.append(CapturedTask(
            t["regcmd_bo_handle"], t["regcmd_offset_in_bo"],
            np.array([int(h, 16) for h in t["regcmd"]], dtype=np.uint64),
            [(r["entry"], r["bo_handle"], r["offset_in_bo"]) for r in t["relocations"]],
            (ref["bo_handle"], ref["offset_in_bo"], _unpack(ref)) if ref and ref.get("data") else None))
    return out


def _load_mesa(case: dict) -> CapturedCase:
    tensors = {t["index"]: t for t in case["model"]["tensors"]}
    sizes = {b["handle"]: b["size"] for b in case.get("bos", [])}
    contents, submits = [], []
    for s in case.get("submits", []):
        loaded = {}
        for c in s["bo_contents"]:
            if "data" in c:
                loaded[c["handle"]] = _unpack(c)
            else:
                loaded[c["handle"]] = base64.b64decode(tensors[c["same_bytes_as_model_tensor"]]["data_b64"])
        contents.append(loaded)
        submits.append([CapturedJob(_tasks(j), j["in_bo_handles"], j["out_bo_handles"]) for j in s["jobs"]])
    return CapturedCase(case["name"], sizes, contents, submits, case)


def _load_gemm(case: dict) -> CapturedCase:
    buffers, submits = case.get("buffers", []), case.get("submits", [])  # rejected shapes have neither
    sizes = {b["handle"]: b["size"] for b in buffers}
    contents = [{} for _ in submits]
    for b in buffers:
        for snap in b.get("snapshots") or []:
            contents[snap["submit"]][b["handle"]] = _unpack(snap)
    jobs = [[CapturedJob(_tasks(j), j["in_bo_handles"], j["out_bo_handles"]) for j in s["jobs"]] for s in submits]
    return CapturedCase(case["name"], sizes, contents, jobs, case)


class PlacedCase:
    """A captured case with its buffers created on `device`."""

    def __init__(self, case: CapturedCase, device: Device) -> None:
        self.case, self.device = case, device
        self.bos: dict[int, BufferObject] = {}
        for handle, size in case.sizes.items():
            self.bos[handle] = device.create_bo(size)

    def free(self) -> None:
        for bo in self.bos.values():
            self.device.free_bo(bo)
        self.bos = {}

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

    def read(self, handle: int) -> bytes:
        bo = self.bos[handle]
        self.device.prepare_cpu_access(bo)
        data = bo.host[: self.case.sizes[handle]].tobytes()  # devices may round a BO up
        self.device.finish_cpu_access(bo)
        return data
