"""Replay a captured regcmd case on a Device and compare with its reference.

Two capture formats (../shared/golden/*/README.md):

* ``rkc-mesa-rocket-golden/1``: Mesa's rocket driver, one convolution (or
  conv + ADD) per file with every BO at submit time and, for single
  convolutions, an onnxruntime reference output (uint8 NHWC, 2 LSB tolerance).
* ``rkc-gemm-golden/1``: rocket-userspace GEMMs with per-task references in
  the NPU output layout and the row-major product (int8 exact; fp32 output
  within a normalised error max|diff| / max|ref| <= 2e-4, the generator's own
  gate; fp16 output within that plus one fp16 ulp of output rounding).

The case is loaded by runtime/captured.py as a relocatable program: one BO per
captured buffer wherever the device puts it, every address entry rewritten
through the capture's relocations. So the same replay runs on the simulator,
on the rocket device over the emulated kernel, and on a board (`rkrun --replay
CASE.json --device rocket`). The captured jobs run as captured (one kick per
task, like stock rocket) and the outputs are read back through
ir/npu/layout.py. Nothing but the capture's own fields is used; the tile
geometry used to compose a GEMM result comes from the capture's documented
`tile` records and the task's own DPU registers.

The captured IOVAs themselves are never recreated: every address register of
every capture is listed in its relocations with the captured value (checked in
tests/sim/test_golden_replay.py), so the relocated program at the captured
addresses would be the captured program bit for bit, and running it elsewhere
shows that no address outside the relocations matters.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rkc.ir.errors import FormatError
from rkc.ir.npu import layout
from rkc.ir.npu.regcmd import decode
from rkc.runtime.captured import MESA, CapturedCase, PlacedCase, decode_blob, load_case
from rkc.runtime.device import Device

FP32_OUT_TOLERANCE = 2e-4  # the generator's gate (normalised error, fp32 accumulation in any order)
# fp16 output adds its own rounding: the NPU rounds an fp32 sum, the reference a
# float64 sum, so an element may differ by one fp16 ulp (<= 2**-10 of max|ref|)
FP16_OUT_TOLERANCE = FP32_OUT_TOLERANCE + 2.0 ** -10
GEMM_TOLERANCE = {"int32": 0.0, "fp32": FP32_OUT_TOLERANCE, "fp16": FP16_OUT_TOLERANCE}


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
    device: str = "?"
    status: str = "pass"  # pass | fail | ran-no-reference | not-replayable
    note: str = ""
    checks: list[Check] = field(default_factory=list)
    tasks: int = 0
    modelled_seconds: float = 0.0  # the simulator's performance model; 0 on a board

    @property
    def passed(self) -> bool:
        return self.status in ("pass", "ran-no-reference", "not-replayable")

    @property
    def max_error(self) -> float:
        return max((c.max_error for c in self.checks), default=0.0)

    def lines(self) -> list[str]:
        head = f"{self.name} [{self.schema}] on {self.device}: {self.status}"
        if self.note:
            head += f" ({self.note})"
        out = [head]
        out += [c.line() for c in self.checks]
        if self.tasks:
            timing = f", modelled {self.modelled_seconds * 1e6:.1f} us" if self.modelled_seconds else ""
            out.append(f"  {self.tasks} tasks{timing}")
        return out


def replay(case: CapturedCase | str | Path, device: Device | None = None) -> ReplayReport:
    """Run `case` on `device` (default: a fresh simulator, closed afterwards) and
    compare with its references. A device the caller passes stays open."""
    if not isinstance(case, CapturedCase):
        case = load_case(case)
    own = device is None
    if own:
        from rkc.runtime.sim import SimDevice  # deferred: the simulator, for a caller that brings no device
        device = SimDevice()
    try:
        compare = _replay_mesa if case.schema == MESA else _replay_gemm
        report = ReplayReport(case.name, case.schema, device.kind)
        if case.status != "ok":
            report.status = "not-replayable"
            report.note = f"capture status {case.status!r}: nothing was compiled to run"
            return report
        try:
            compare(case, device, report)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise FormatError(f"{case.name}: malformed capture ({type(exc).__name__}: {exc})") from None
        return report
    finally:
        if own:
            device.close()


def _run_submits(case: CapturedCase, placed: PlacedCase, report: ReplayReport, after_submit=None) -> None:
    """Every submit of the capture, in order, each as captured (one kick per task)."""
    device = placed.device
    start = device.counters.modelled_seconds
    for s in range(len(case.submits)):
        device.run(placed.load(s))
        report.tasks += sum(len(j.tasks) for j in case.submits[s])
        if after_submit is not None:
            after_submit(s)
    report.modelled_seconds = device.counters.modelled_seconds - start


def _finish(report: ReplayReport) -> None:
    report.status = "pass" if all(ch.ok for ch in report.checks) else "fail"


# -- Mesa captures ------------------------------------------------------------
def _replay_mesa(case: CapturedCase, device: Device, report: ReplayReport) -> None:
    ref = case.raw.get("reference_output")
    with PlacedCase(case, device) as placed:
        _run_submits(case, placed, report)
        if ref is None:
            report.status, report.note = "ran-no-reference", "no reference output in the capture"
            return
        out_role = f"tensor:{ref['tensor_index']}"
        out_handle = next(b["handle"] for b in case.raw["bos"] if b["role"] == out_role)
        _, h, w, c = ref["shape"]
        native = np.frombuffer(placed.read(out_handle, 0, layout.feature_bytes(c, h, w, 1)), np.int8)
    expected = np.frombuffer(base64.b64decode(ref["data_b64"], validate=True), np.uint8).reshape(h, w, c)
    got = (layout.unpack_feature(native.reshape(-1, h, w, 16), c).astype(np.int16) + 0x80).transpose(1, 2, 0)
    err = float(np.abs(got.astype(np.int32) - expected.astype(np.int32)).max())
    report.checks.append(Check("output vs reference (uint8 NHWC)", err, float(ref.get("tolerance_lsb", 2)),
                               " LSB"))
    _finish(report)


# -- rocket-userspace GEMM captures --------------------------------------------
_NP = {"int32": np.int32, "fp32": np.float32, "float32": np.float32, "fp16": np.float16, "float16": np.float16,
       "int8": np.int8}


def _surf_stride(entries: np.ndarray) -> int:
    for d in decode(entries):
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


def _replay_gemm(case: CapturedCase, device: Device, report: ReplayReport) -> None:
    params = case.raw["params"]
    out_dtype = params["out_dtype"]
    tol = GEMM_TOLERANCE[out_dtype]
    m_run, n_all = params["M_as_run"], params["N"]
    acc_dtype = np.int64 if out_dtype == "int32" else np.float64
    total = np.zeros((m_run, n_all), acc_dtype)
    partial16 = np.zeros((m_run, n_all), np.float32) if out_dtype == "fp16" else None
    worst_task = 0.0

    def check_tasks(s: int) -> None:
        """Each task's tile, read right after its submit (later submits reuse the slots)."""
        nonlocal worst_task
        for job in case.submits[s]:
            for t in job.tasks:
                ref, tile = t.reference, t.tile
                if ref is None or tile is None:
                    raise ValueError(f"submit {s}: a task without its reference_output or tile")
                dt = np.dtype(_NP[ref.dtype])
                stride = _surf_stride(t.entries)
                c2 = 16 // dt.itemsize
                span = max(len(ref.data), (-(-tile["Ntile"] // c2) - 1) * stride + tile["Mtile"] * 16)
                data = np.frombuffer(placed.read(ref.handle, ref.offset, span), np.uint8)
                expect = np.frombuffer(ref.data, dt)
                worst_task = max(worst_task, _gemm_error(data[:len(ref.data)].view(dt), expect, out_dtype))
                rows = _tile_to_rows(data.view(dt), tile["Mtile"], tile["Ntile"], stride)
                m0, n0 = tile["m0"], tile["n0"]
                total[m0:m0 + tile["Mtile"], n0:n0 + tile["Ntile"]] += rows.astype(acc_dtype)
                if partial16 is not None:
                    partial16[m0:m0 + tile["Mtile"], n0:n0 + tile["Ntile"]] += rows.astype(np.float32)

    with PlacedCase(case, device) as placed:
        _run_submits(case, placed, report, check_tasks)
    unit = "" if out_dtype == "int32" else " (normalised)"
    report.checks.append(Check("every task's output vs its reference", worst_task, tol, unit))
    rm = case.raw["reference_output"]["row_major"]
    shape = tuple(rm["shape"])
    if out_dtype == "fp16" and "composed_from_tasks" in rm:
        comp = rm["composed_from_tasks"]
        blob = dict(comp, encoding=comp.get("encoding", rm.get("encoding")))
        expect = np.frombuffer(decode_blob(blob, "composed_from_tasks"), _NP[comp.get("dtype", rm["dtype"])])
        got = partial16[:shape[0]].astype(np.float16)
        what = "product composed from the tasks vs composed_from_tasks"
    else:
        expect = np.frombuffer(decode_blob(rm, "row_major reference"), _NP[rm["dtype"]])
        got = total[:shape[0]]
        if out_dtype == "int32":
            got = got.astype(np.int32)
        what = "whole product vs row-major reference"
    report.checks.append(Check(what, _gemm_error(np.asarray(got), expect.reshape(shape), out_dtype), tol, unit))
    _finish(report)


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


def run_cli(path: str, device: str = "auto", cores: int = 3, **device_options) -> int:
    """`rkrun --replay CASE.json [--device ...] [--cores N]`: print the comparison,
    0 only within tolerance. The capture is read before any device opens;
    `device_options` go to runtime.devices.open_device (tests pass an emulated kernel)."""
    import click  # deferred: click and the devices (the simulator, the rocket driver) serve `rkrun --replay` only

    from rkc.runtime.devices import open_device

    case = load_case(path)
    with open_device(device, cores=cores, **device_options) as dev:
        report = replay(case, dev)
    for line in report.lines():
        click.echo(line)
    return 0 if report.passed else 1
