"""Re-emit a captured Mesa case with rkc's Mesa-compatible mode and compare.

The capture format is described in ../shared/golden/mesa-rocket/README.md. The
comparison is entry by entry; an entry that carries a buffer address is compared
through the relocations (buffer role + offset) rather than by its absolute value.
Buffers compared byte for byte: each operation's packed weights and corrected
biases, its regcmd buffer size, and the graph input in Mesa's layout.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rkc.compiler.npu import mesa
from rkc.ir.errors import FormatError, RkcError
from rkc.ir.npu.regcmd import decode_entry


@dataclass(frozen=True)
class Mismatch:
    where: str
    what: str
    expected: str
    got: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}: expected {self.expected}, got {self.got}"


@dataclass
class GoldenReport:
    case: str
    status: str  # "match", "mismatch", "skipped"
    entries: int = 0
    buffers: int = 0
    mismatches: list[Mismatch] | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "match"


def load_case(path: str | Path) -> dict:
    try:
        case = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: cannot read a captured case ({exc})") from None
    if not isinstance(case, dict) or case.get("schema") != "rkc-mesa-rocket-golden/1":
        raise FormatError(f"{path}: not a mesa-rocket capture (schema rkc-mesa-rocket-golden/1)")
    return case


def describe_entry_difference(expected: int, got: int) -> tuple[str, str, str]:
    """(what, expected, got) naming block, register and the first differing field."""
    e, g = decode_entry(expected), decode_entry(got)
    if e.register is not None and g.register is e.register:
        for name, value in e.fields.items():
            if g.fields.get(name) != value:
                return (f"{e.block.name} {e.register.name}.{name}", f"{value:#x}", f"{g.fields[name]:#x}")
        return f"{e.block.name} {e.register.name}", f"{expected:#018x}", f"{got:#018x}"
    return "register", f"{e.name} ({expected:#018x})", f"{g.name} ({got:#018x})"


def _bo_bytes(case: dict, handle: int) -> bytes | None:
    for b in case["submits"][0]["bo_contents"]:
        if b["handle"] == handle and b.get("data") is not None:
            return zlib.decompress(base64.b64decode(b["data"]))
    return None


def check_case(case: dict, stop_at_first: bool = True) -> GoldenReport:
    name = case.get("name", "?")
    if case.get("status") != "ok":
        return GoldenReport(name, "skipped", note=f"capture status {case.get('status')}")
    ops = mesa.mesa_operations(case["model"])
    results = [mesa.lower_mesa(op) for op in ops]
    report = GoldenReport(name, "match", mismatches=[])
    bad = report.mismatches

    def fail(where: str, what: str, expected, got) -> bool:
        bad.append(Mismatch(where, what, str(expected), str(got)))
        return stop_at_first

    roles = {b["handle"]: b["role"] for b in case["bos"]}
    sizes = {b["role"]: b["size"] for b in case["bos"]}
    captured_jobs = [job for s in case["submits"] for job in s["jobs"]]
    mine = [(k, r, job) for k, r in enumerate(results) for job in r.jobs]
    if len(captured_jobs) != len(mine):
        fail("submit", "job count", len(captured_jobs), len(mine))
        report.status = "mismatch"
        return report
    linked = [mesa.link_operation(r) for r in results]
    offsets = [mesa.task_offsets(r) for r in results]
    for j, (cjob, (k, result, job)) in enumerate(zip(captured_jobs, mine)):
        op = result.op
        where = f"job {j} ({op.name})"
        if len(cjob["tasks"]) != len(job.tasks):
            if fail(where, "task count", len(cjob["tasks"]), len(job.tasks)):
                break
            continue
        c_in = [roles[h] for h in cjob["in_bo_handles"]]
        my_in = [op.input.buffer] + ([op.add.buffer] if op.add is not None else [])
        if c_in != my_in and fail(where, "in BOs", c_in, my_in):
            break
        c_out = [roles[h] for h in cjob["out_bo_handles"]]
        if c_out != [op.output.buffer] and fail(where, "out BOs", c_out, [op.output.buffer]):
            break
        blob, relocs = linked[k]
        for t_local, (ctask, t) in enumerate(zip(cjob["tasks"], job.tasks)):
            twhere = f"{where} task {t}"
            task = result.tasks[t]
            if ctask["regcmd_count"] != task.count:
                if fail(twhere, "regcmd_count", ctask["regcmd_count"], task.count):
                    break
                continue
            if roles[ctask["regcmd_bo_handle"]] != op.regcmd_buffer or \
                    ctask["regcmd_offset_in_bo"] != offsets[k][t]:
                if fail(twhere, "regcmd placement", (roles[ctask["regcmd_bo_handle"]], ctask["regcmd_offset_in_bo"]),
                        (op.regcmd_buffer, offsets[k][t])):
                    break
            start = offsets[k][t] // 8
            got_entries = blob[start:start + task.count]
            c_rel = {r["entry"]: (r.get("bo_role") or roles[r["bo_handle"]], r["offset_in_bo"])
                     for r in ctask["relocations"]}
            m_rel = {r.entry: (r.buffer, r.offset) for r in relocs[t]}
            for i, (hexval, got) in enumerate(zip(ctask["regcmd"], got_entries)):
                expected, got = int(hexval, 16), int(got)
                report.entries += 1
                if i in c_rel or i in m_rel:
                    if c_rel.get(i) != m_rel.get(i):
                        if fail(f"{twhere} entry {i}", f"address of {decode_entry(expected).name}",
                                c_rel.get(i), m_rel.get(i)):
                            break
                        continue
                    mask = ~(0xFFFFFFFF << 16) & 0xFFFFFFFFFFFFFFFF  # compare target + offset only
                    expected, got = expected & mask, got & mask
                if expected != got:
                    what, e, g = describe_entry_difference(expected, got)
                    if fail(f"{twhere} entry {i}", what, e, g):
                        break
            if bad and stop_at_first:
                break
        if bad and stop_at_first:
            break
    if not (bad and stop_at_first):
        _check_buffers(case, ops, results, sizes, report, fail)
    report.status = "mismatch" if bad else "match"
    return report


def _check_buffers(case, ops, results, sizes, report, fail) -> None:
    by_role = {}
    for b in case["bos"]:
        data = _bo_bytes(case, b["handle"])
        if data is not None:
            by_role[b["role"]] = data
    for op, result in zip(ops, results):
        for const in result.constants:
            expected = by_role.get(const.name)
            report.buffers += 1
            if expected is None:
                if fail(const.name, "buffer", "present in capture", "missing"):
                    return
                continue
            if sizes.get(const.name) != len(const.data):
                if fail(const.name, "buffer size", sizes.get(const.name), len(const.data)):
                    return
                continue
            if expected != const.data:
                i = next(i for i, (a, b) in enumerate(zip(expected, const.data)) if a != b)
                if fail(f"{const.name} byte {i}", "buffer contents", f"{expected[i]:#04x}", f"{const.data[i]:#04x}"):
                    return
        regcmd_size = sum(-(-t.count * 8 // 64) * 64 for t in result.tasks)
        report.buffers += 1
        if sizes.get(op.regcmd_buffer) != regcmd_size:
            if fail(op.regcmd_buffer, "buffer size", sizes.get(op.regcmd_buffer), regcmd_size):
                return
    graph_inputs = case["model"]["graph_inputs"]
    tensors = {t["index"]: t for t in case["model"]["tensors"]}
    for idx in graph_inputs:
        role = f"tensor:{idx}"
        consumer = next((op for op in ops if op.input.buffer == role), None)
        if consumer is None or role not in by_role:
            continue
        x = np.frombuffer(base64.b64decode(tensors[idx]["data_b64"]), np.uint8)
        got = mesa.convert_input(consumer, x)
        report.buffers += 1
        if sizes.get(role) != mesa.input_bytes(consumer):
            if fail(role, "buffer size", sizes.get(role), mesa.input_bytes(consumer)):
                return
        if by_role[role] != got:
            i = next(i for i, (a, b) in enumerate(zip(by_role[role], got)) if a != b)
            if fail(f"{role} byte {i}", "input layout", f"{by_role[role][i]:#04x}", f"{got[i]:#04x}"):
                return
    for op in ops:
        report.buffers += 1
        role = op.output.buffer
        if role in sizes and sizes[role] != mesa.output_bytes(op):
            if fail(role, "buffer size", sizes[role], mesa.output_bytes(op)):
                return


def check_path(path: str | Path, stop_at_first: bool = True) -> GoldenReport:
    case = load_case(path)
    try:
        return check_case(case, stop_at_first)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: malformed capture ({type(exc).__name__}: {exc})") from None
    except RkcError as exc:
        return GoldenReport(case.get("name", str(path)), "mismatch",
                            mismatches=[Mismatch(str(path), "rkc refused the operation", "accepted", str(exc))])


def is_ground_truth(case: dict) -> bool:
    """The fused-ADD captures come from an older Mesa arithmetic (their README)."""
    return case.get("params", {}).get("kind") != "add"


__all__ = ["GoldenReport", "Mismatch", "check_case", "check_path", "load_case", "is_ground_truth"]
