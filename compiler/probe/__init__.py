"""`rkc probe`: small programs that each test one hardware assumption of the simulator.

Every open hardware question the simulator answers has a reading in
runtime/sim/quirks.py (Q1..Q16). A probe runs one small program on the NPU and
on the simulator configured with the reading under test (its `hypothesis`), and
compares the output bytes: if the board agrees, the reading holds on this
board; if not, the report says which outputs differ and by how much. The
result is a JSON report a user can share (docs/rocket.md).

Without an NPU the probes run against the emulated kernel (whose NPU is the
same simulator): the report then checks the probe programs and the ioctl path,
not the hardware, and says so.

Each probe's program lives in one function of `compiler.probe.programs`; it
takes a Device and returns the bytes to compare. Programs that need the op
emitters (compiler/npu, issue 4) raise ProbeUnavailable until those exist.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from rkc.ir.errors import RkcError, UnsupportedError
from rkc.runtime.device import Device


class ProbeUnavailable(Exception):
    """The probe's program cannot be built in this build or on this machine."""


@dataclass
class ProbeRun:
    """What a program produced: named output bytes, and independent references
    where the program has them: expected bytes (e.g. a capture's) or exact
    values (got, expected), e.g. an int8 product numpy computes."""

    outputs: dict[str, bytes]
    references: dict[str, bytes] = field(default_factory=dict)
    exact: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # (got, reference, tolerance): values within `tolerance` of another program's
    # (e.g. an int8 result next to the fp16 program computing the same function)
    close: dict[str, tuple[np.ndarray, np.ndarray, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    name: str
    question: str  # id in runtime.sim.quirks.QUESTIONS, "" if the probe is about the runtime path
    assumption: str  # the reading under test, one line
    hypothesis: dict  # runtime.sim.quirks.Quirks fields under which the simulator predicts the board
    program: Callable[[Device], ProbeRun]
    if_agree: str  # what agreement means for the simulator
    if_differ: str
    needs_chaining: bool = False
    # False: the simulator has no reading of this program (it refuses it, the
    # question is open): only a board answers, against the program's own
    # references (exact / close), never the simulator's bytes
    simulated: bool = True


@dataclass
class ProbeResult:
    name: str
    question: str
    assumption: str
    status: str  # agree | differ | npu-failed | sim-refused | unavailable | skipped
    detail: str = ""
    conclusion: str = ""
    outputs: dict[str, dict] = field(default_factory=dict)  # name -> {bytes, npu_sha256, sim_sha256}

    def as_dict(self) -> dict:
        return asdict(self)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _compare(npu: ProbeRun, sim: ProbeRun) -> tuple[bool, str, dict]:
    table, problems = {}, []
    for name in sorted(set(npu.outputs) | set(sim.outputs)):
        a, b = npu.outputs.get(name), sim.outputs.get(name)
        table[name] = {"bytes": len(a or b or b""), "npu_sha256": _digest(a) if a is not None else None,
                       "sim_sha256": _digest(b) if b is not None else None}
        if a is None or b is None or len(a) != len(b):
            problems.append(f"{name}: present/size differs")
            continue
        diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
        if len(diff):
            problems.append(f"{name}: {len(diff)} of {len(a)} bytes differ (first at byte {int(diff[0])})")
        ref = npu.references.get(name)
        if ref is not None and a[: len(ref)] != ref:
            problems.append(f"{name}: the NPU output does not match the program's reference")
    problems += _reference_problems(npu)
    return not problems, "; ".join(problems), table


def _reference_problems(npu: ProbeRun) -> list[str]:
    problems = []
    for name, (got, want) in npu.exact.items():
        if got.shape != want.shape or not np.array_equal(got, want):
            wrong = int(np.count_nonzero(got != want)) if got.shape == want.shape else got.size
            problems.append(f"{name}: {wrong} of {want.size} values differ from the exact result")
    for name, (got, want, tolerance) in npu.close.items():
        if got.shape != want.shape:
            problems.append(f"{name}: shape {got.shape}, the reference's {want.shape}")
            continue
        off = np.abs(got.astype(np.float64) - want.astype(np.float64)) > tolerance
        if off.any():
            problems.append(f"{name}: {int(off.sum())} of {want.size} values further than {tolerance:g} from the "
                            f"reference")
    return problems


SIM_REFUSED = "refused by the simulator: needs a board"


def run_probe(probe: Probe, make_npu: Callable[[dict], Device], make_sim: Callable[[dict], Device],
              npu_is_simulator: bool = False) -> ProbeResult:
    """Run `probe` on a device from make_npu(hypothesis) and on the simulator
    from make_sim(hypothesis); compare. `npu_is_simulator`: make_npu's device is
    the emulated kernel (whose NPU is the simulator), not a board."""
    result = ProbeResult(probe.name, probe.question, probe.assumption, "unavailable")
    if not probe.simulated:
        sim = make_sim(probe.hypothesis)
        try:
            probe.program(sim)
        except UnsupportedError as exc:  # the emitter refused to build the program
            result.detail = f"the program cannot be built: {exc}"
            return result
        except RkcError as exc:
            refusal = str(exc)
        else:
            refusal = None  # the simulator models it now: probe it like any other
        finally:
            sim.close()
        if refusal is not None:
            if npu_is_simulator:
                result.status, result.detail = "sim-refused", f"{SIM_REFUSED} ({refusal})"
                return result
            return _run_on_board(probe, make_npu, result, refusal)
    npu = make_npu(probe.hypothesis)
    try:
        if probe.needs_chaining and not npu.supports_chaining:
            result.status = "skipped"
            result.detail = "the kernel has no chained submit (kernel/patches/0003)"
            return result
        try:
            npu_run = probe.program(npu)
        except ProbeUnavailable as exc:
            result.detail = str(exc)
            return result
        except UnsupportedError as exc:  # the emitter refused to build the program
            result.detail = f"the program cannot be built: {exc}"
            return result
        except RkcError as exc:
            result.status, result.detail = "npu-failed", str(exc)
            result.conclusion = probe.if_differ
            return result
    finally:
        npu.close()
    sim = make_sim(probe.hypothesis)
    try:
        sim_run = probe.program(sim)
    except RkcError as exc:
        result.status, result.detail = "sim-refused", f"the simulator refused the program: {exc}"
        return result
    finally:
        sim.close()
    same, detail, result.outputs = _compare(npu_run, sim_run)
    result.status = "agree" if same else "differ"
    result.detail = detail
    result.conclusion = probe.if_agree if same else probe.if_differ
    return result


def _run_on_board(probe: Probe, make_npu: Callable[[dict], Device], result: ProbeResult,
                  refusal: str) -> ProbeResult:
    """A program the simulator refuses, on a board: checked against its own references."""
    npu = make_npu(probe.hypothesis)
    try:
        npu_run = probe.program(npu)
    except RkcError as exc:
        result.status, result.detail, result.conclusion = "npu-failed", str(exc), probe.if_differ
        return result
    finally:
        npu.close()
    problems = _reference_problems(npu_run)
    result.outputs = {name: {"bytes": len(data), "npu_sha256": _digest(data), "sim_sha256": None}
                      for name, data in sorted(npu_run.outputs.items())}
    result.status = "differ" if problems else "agree"
    result.detail = "; ".join(problems + [f"the simulator refuses it ({refusal})"])
    result.conclusion = probe.if_differ if problems else probe.if_agree
    return result
