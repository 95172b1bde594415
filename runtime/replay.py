"""Replay a captured regcmd case on the simulator and compare with its reference.

Two capture formats (../shared/golden/*/README.md):

* ``rkc-mesa-rocket-golden/1``: Mesa's rocket driver, one convolution (or
  conv + ADD) per file with every BO at submit time and, for single
  convolutions, an onnxruntime reference output (uint8 NHWC, 2 LSB tolerance).
* ``rkc-gemm-golden/1``: rocket-userspace GEMMs with per-task references in
  the NPU output layout and the row-major product (int8 exact; fp32 output
  within a normalised error max|diff| / max|ref| <= 2e-4, the generator's own
  gate; fp16 output within that plus one fp16 ulp of output rounding).

The replay recreates every BO at its captured IOVA, fills it, submits the
captured jobs exactly as captured (one kick per task, like stock rocket) and
reads the outputs back through ir/npu/layout.py. Nothing but the capture's own
fields is used; the tile geometry used to compose a GEMM result comes from the
capture's documented `tile` records and the task's own DPU registers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ir.errors import FormatError
from ir.npu import layout
from ir.npu.regcmd import decode
from runtime.device import Job, Task

MESA = "rkc-mesa-rocket-golden/1"
GEMM = "rkc-gemm-golden/1"
FP32_OUT_TOLERANCE = 2e-4  # the generator's gate (normalised error, fp32 accumulation in any order)
# fp16 output adds its own rounding: the NPU rounds an fp32 sum, the reference a
# float64 sum, so an element may differ by one fp16 ulp (<= 2**-10 of max|ref|)
FP16_OUT_TOLERANCE = FP32_OUT_TOLERANCE + 2.0 ** -10


@dataclass
class Check:
    what: str
    max_error: float
    tolerance: float
    unit: str = ""

    @property
    def ok(self) -> bool:
        return self.max_error <= self.tolerance

    def line(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (f"  {self.what}: max error {self.max_error:.4g}{self.unit} "
                f"(tolerance {self.tolerance:g}{self.unit}) {verdict}")


@dataclass
class ReplayReport:
    name: str
    schema: str
    status: str = "pass"  # pass | fail | ran-no-reference | not-replayable
    note: str = ""
    checks: list[Check] = field(default_factory=list)
    tasks: int = 0
    modelled_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status in ("pass", "ran-no-reference", "not-replayable")

    @property
    def max_error(self) -> float:
        return max((c.max_error for c in self.checks), default=0.0)

    def lines(self) -> list[str]:
        head = f"{self.name} [{self.schema}]: {self.status}"
        if self.note:
            head += f" ({self.note})"
        out = [head]
        out += [c.line() for c in self.checks]
        if self.tasks:
            out.append(f"  {self.tasks} tasks, modelled {self.modelled_seconds * 1e6:.1f} us")
        return out


def load_case(path: str | Path) -> dict:
    path = Path(path)
    try:
        case = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a readable JSON capture ({exc})") from None
    if not isinstance(case, dict) or case.get("schema") not in (MESA, GEMM):
        raise FormatError(f"{path}: not a captured regcmd case (schema {case.get('schema')!r}; "
                          f"expected {MESA} or {GEMM})" if isinstance(case, dict) else f"{path}: not a capture")
    return case


def replay(path: str | Path, device_factory: Callable | None = None) -> ReplayReport:
    case = load_case(path)
    if device_factory is None:
        from runtime.sim import SimDevice
        device_factory = SimDevice
    dev = device_factory()
    try:
        if case["schema"] == MESA:
            return _replay_mesa(case, dev)
        return _replay_gemm(case, dev)
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        raise FormatError(f"{path}: malformed capture ({type(exc).__name__}: {exc})") from None
    finally:
        dev.close()


def _unpack_blob(b64: str, compressed: bool) -> bytes:
    raw = base64.b64decode(b64)
    return zlib.decompress(raw) if compressed else raw


def _fill(dev, bo, data: bytes, sha256: str | None, what: str) -> None:
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise FormatError(f"{what}: contents do not match their sha256")
    if len(data) > bo.size:
        raise FormatError(f"{what}: {len(data)} bytes do not fit the {bo.size}-byte BO")
    dev.prepare_cpu_access(bo)
    bo.host[:len(data)] = np.frombuffer(data, np.uint8)
    dev.finish_cpu_access(bo)


def _read(dev, bo, start: int, nbytes: int) -> np.ndarray:
    """A copy of BO bytes [start, start + nbytes), read the way the CPU must."""
    dev.prepare_cpu_access(bo)
    data = bo.host[start:start + nbytes].copy()
    dev.finish_cpu_access(bo)
    return data


def _jobs(submit: dict, bos: dict) -> list[Job]:
    jobs = []
    for j, job in enumerate(submit["jobs"]):
        tasks = [Task(int(t["regcmd_dma"], 16), int(t["regcmd_count"])) for t in job["tasks"]]
        jobs.append(Job(tasks, [bos[h] for h in job["in_bo_handles"]], [bos[h] for h in job["out_bo_handles"]],
                        lane=0, label=f"submit {submit['index']} job {j}"))
    return jobs


def _run(dev, jobs: list[Job], report: ReplayReport) -> None:
    dev.run(jobs)
    report.tasks += sum(len(j.tasks) for j in jobs)
    report.modelled_seconds = dev.counters.modelled_seconds


# -- Mesa captures ------------------------------------------------------------
def _replay_mesa(case: dict, dev) -> ReplayReport:
    report = ReplayReport(case["name"], MESA)
    if case.get("status") != "ok":
        report.status = "not-replayable"
        report.note = f"capture status {case.get('status')!r}: the driver compiled nothing"
        return report
    tensors = {t["index"]: t for t in case["model"]["tensors"]}
    info = {b["handle"]: b for b in case["bos"]}
    bos = {}
    for submit in case["submits"]:
        for content in submit["bo_contents"]:
            h = content["handle"]
            if h not in bos:
                bos[h] = dev.create_bo_at(int(info[h]["dma_address"], 16), int(content["size"]))
            if "data" in content:
                data = _unpack_blob(content["data"], content.get("encoding") == "zlib+base64")
            else:
                data = base64.b64decode(tensors[content["same_bytes_as_model_tensor"]]["data_b64"])
            _fill(dev, bos[h], data, content.get("sha256"), f"BO {h}")
        _run(dev, _jobs(submit, bos), report)
    ref = case.get("reference_output")
    if ref is None:
        report.status, report.note = "ran-no-reference", "no reference output in the capture"
        return report
    out_role = f"tensor:{ref['tensor_index']}"
    out_handle = next(b["handle"] for b in case["bos"] if b["role"] == out_role)
    _, h, w, c = ref["shape"]
    expected = np.frombuffer(base64.b64decode(ref["data_b64"]), np.uint8).reshape(h, w, c)
    nbytes = layout.feature_bytes(c, h, w, 1)
    native = _read(dev, bos[out_handle], 0, nbytes).view(np.int8).reshape(-1, h, w, 16)
    got = (layout.unpack_feature(native, c).astype(np.int16) + 0x80).transpose(1, 2, 0)
    err = float(np.abs(got.astype(np.int32) - expected.astype(np.int32)).max())
    report.checks.append(Check("output vs reference (uint8 NHWC)", err, float(ref.get("tolerance_lsb", 2)),
                               " LSB"))
    report.status = "pass" if all(ch.ok for ch in report.checks) else "fail"
    return report


# -- rocket-userspace GEMM captures --------------------------------------------
_NP = {"int32": np.int32, "fp32": np.float32, "float32": np.float32, "fp16": np.float16, "float16": np.float16,
       "int8": np.int8}


def _surf_stride(regcmd: list[str]) -> int:
    for d in decode(int(x, 16) for x in regcmd):
        if d.register is not None and d.register.name == "DPU_DST_SURF_STRIDE":
            return d.value
    raise ValueError("task writes no DPU_DST_SURF_STRIDE")


def _tile_to_rows(raw: np.ndarray, m: int, n: int, stride: int) -> np.ndarray:
    """An output tile in the NPU layout (ceil(n/C2), m, C2) with surface stride
    `stride` bytes -> [m, n]."""
    item = raw.dtype.itemsize
    c2 = 16 // item
    surfaces = -(-n // c2)
    view = np.lib.stride_tricks.as_strided(raw, shape=(surfaces, m, c2),
                                           strides=(stride, 16, item))
    return view.transpose(1, 0, 2).reshape(m, surfaces * c2)[:, :n]


def _replay_gemm(case: dict, dev) -> ReplayReport:
    report = ReplayReport(case["name"], GEMM)
    if case.get("status") != "ok":
        report.status = "not-replayable"
        report.note = f"capture status {case.get('status')!r}: the library refused the shape"
        return report
    params = case["params"]
    bos = {b["handle"]: dev.create_bo_at(int(b["dma_address"], 16), int(b["size"])) for b in case["buffers"]}
    out_dtype = params["out_dtype"]
    m_run, n_all = params["M_as_run"], params["N"]
    acc_dtype = np.int64 if out_dtype == "int32" else np.float64
    total = np.zeros((m_run, n_all), acc_dtype)
    partial16 = np.zeros((m_run, n_all), np.float32) if out_dtype == "fp16" else None
    worst_task = 0.0
    for submit in case["submits"]:
        for b in case["buffers"]:
            for snap in b.get("snapshots") or []:
                if snap["submit"] == submit["index"]:
                    _fill(dev, bos[b["handle"]],
                          _unpack_blob(snap["data"], snap.get("encoding") == "zlib+base64"),
                          snap.get("sha256"), f"buffer {b['handle']}")
        _run(dev, _jobs(submit, bos), report)
        for job in submit["jobs"]:
            for t in job["tasks"]:
                ref = t["reference_output"]
                bo = bos[ref["bo_handle"]]
                dt = np.dtype(_NP[ref["dtype"]])
                tile = t["tile"]
                stride = _surf_stride(t["regcmd"])
                c2 = 16 // dt.itemsize
                span = max(ref["nbytes"], (-(-tile["Ntile"] // c2) - 1) * stride + tile["Mtile"] * 16)
                data = _read(dev, bo, ref["offset_in_bo"], span)
                expect = np.frombuffer(_unpack_blob(ref["data"], ref.get("encoding") == "zlib+base64"), dt)
                worst_task = max(worst_task, _gemm_error(data[:ref["nbytes"]].view(dt), expect, out_dtype))
                rows = _tile_to_rows(data.view(dt), tile["Mtile"], tile["Ntile"], stride)
                m0, n0 = tile["m0"], tile["n0"]
                total[m0:m0 + tile["Mtile"], n0:n0 + tile["Ntile"]] += rows.astype(acc_dtype)
                if partial16 is not None:
                    partial16[m0:m0 + tile["Mtile"], n0:n0 + tile["Ntile"]] += rows.astype(np.float32)
    tol = {"int32": 0.0, "fp32": FP32_OUT_TOLERANCE, "fp16": FP16_OUT_TOLERANCE}[out_dtype]
    unit = "" if out_dtype == "int32" else " (normalised)"
    report.checks.append(Check("every task's output vs its reference", worst_task, tol, unit))
    rm = case["reference_output"]["row_major"]
    shape = tuple(rm["shape"])
    if out_dtype == "fp16" and "composed_from_tasks" in rm:
        comp = rm["composed_from_tasks"]
        expect = np.frombuffer(_unpack_blob(comp["data"], comp.get("encoding", rm.get("encoding")) == "zlib+base64"),
                               _NP[comp.get("dtype", rm["dtype"])]).reshape(shape)
        got = partial16[:shape[0]].astype(np.float16)
        what = "product composed from the tasks vs composed_from_tasks"
    else:
        expect = np.frombuffer(_unpack_blob(rm["data"], rm.get("encoding") == "zlib+base64"),
                               _NP[rm["dtype"]]).reshape(shape)
        got = total[:shape[0]]
        if out_dtype == "int32":
            got = got.astype(np.int32)
        what = "whole product vs row-major reference"
    report.checks.append(Check(what, _gemm_error(np.asarray(got), expect, out_dtype), tol, unit))
    report.status = "pass" if all(ch.ok for ch in report.checks) else "fail"
    return report


def _gemm_error(got: np.ndarray, expect: np.ndarray, out_dtype: str) -> float:
    got = np.asarray(got).reshape(-1)
    expect = np.asarray(expect).reshape(-1)
    if out_dtype == "int32":
        return float(np.abs(got.astype(np.int64) - expect.astype(np.int64)).max(initial=0))
    g = got.astype(np.float64)
    e = expect.astype(np.float64)
    if not np.all(np.isfinite(g)):
        return float("inf")
    scale = np.abs(e).max(initial=0.0)
    diff = np.abs(g - e).max(initial=0.0)
    return float(diff / scale) if scale > 0 else float(diff)


def run_cli(path: str) -> int:
    """`rkrun --replay CASE.json`: print the comparison, 0 only within tolerance."""
    import click

    report = replay(path)
    for line in report.lines():
        click.echo(line)
    return 0 if report.passed else 1
