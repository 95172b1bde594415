"""`rkc doctor`'s board inspection: what rkc will use to talk to the NPU, and
whether this machine has one.

On any machine: the rocket UAPI as the runtime encodes it (request numbers and
struct sizes, next to the sizes the UAPI header defines). On a board: the rocket
node and driver version, the NPU cores, their clock (below 1 GHz points to
kernel/), the NPU rail, the IOMMU, whether the chained-submit,
shared-address-space and interrupt-mask (PPU completion) patches are there, what the runtime device finds when it
opens the node, and a one-line verdict. Then, NPU or not, the memory
controller and CPU clocks that decide decode speed (runtime/rocket/soc.py,
shared with kernel/check-npu) and a second verdict for them. The full 1 GHz
readiness check of a
board is kernel/check-npu; the CLI command is compiler/cli/doctor.py.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

from rkc.ir.errors import RkcError
from rkc.runtime.rocket import soc, uapi
from rkc.runtime.rocket.board import RATE_SLACK_HZ, TARGET_HZ, BoardFacts, gather
from rkc.runtime.rocket.device import RocketDevice
from rkc.runtime.rocket.kernel import KernelInterface, LinuxKernel

OK, INFO, WARN, FAIL = "OK", "INFO", "WARN", "FAIL"


@dataclass
class Report:
    facts: BoardFacts
    checks: list[tuple[str, str, str]] = field(default_factory=list)
    device: dict | None = None
    no_npu: str | None = None  # the reason, when there is no usable NPU
    verdict: str = ""
    soc_checks: list[tuple[str, str, str]] = field(default_factory=list)
    soc_verdict: str = ""


def uapi_lines() -> list[str]:
    lines = [f"  {'ioctl / struct':42} {'request':>10} {'size':>5} {'UAPI':>5}"]
    for e in uapi.ABI:
        size = ctypes.sizeof(e.struct)
        mark = "ok" if size == e.uapi_size and (e.uapi_request in (None, e.request)) else "MISMATCH"
        lines.append(f"  {e.name:42} {e.request:#010x} {size:5} {e.uapi_size:5}  {mark}")
    for name, struct, size in uapi.NESTED_STRUCTS:
        mark = "ok" if ctypes.sizeof(struct) == size else "MISMATCH"
        lines.append(f"  {'struct ' + name:42} {'':>10} {ctypes.sizeof(struct):5} {size:5}  {mark}")
    lines.append(f"  chained kicks: job_struct_size {uapi.JOB_STRUCT_SIZE_V11} with DRM_ROCKET_JOB_CHAIN when the "
                 f"driver reports >= {'.'.join(map(str, uapi.CHAIN_VERSION))} (kernel/patches/0003), "
                 f"else {uapi.JOB_STRUCT_SIZE_V10} and one kick per task")
    lines.append(f"  PPU completion: DRM_ROCKET_JOB_IRQ_MASK with irq_mask {uapi.IRQ_MASK_VALID:#x} when the driver "
                 f"reports >= {'.'.join(map(str, uapi.IRQ_MASK_VERSION))} (kernel/patches/0005), else PPU-only "
                 f"tasks are refused before submit")
    return lines


def _mhz(hz: int) -> str:
    return f"{hz / 1e6:g} MHz"


def build_report(root: str = "/", kernel: KernelInterface | None = None) -> Report:
    kernel = kernel or LinuxKernel(os.path.join(root, "dev", "accel"))
    facts = gather(root, kernel)
    r = Report(facts)
    add = r.checks.append

    rocket = facts.rocket_nodes
    if not facts.nodes:
        r.no_npu = "no /dev/accel node (is the rocket module loaded? modprobe rocket)"
    elif not rocket:
        seen = ", ".join(f"{os.path.basename(n.path)}: {n.driver.name if n.driver else n.error}" for n in facts.nodes)
        r.no_npu = f"no /dev/accel node is driven by rocket ({seen})"
    if rocket:
        n = rocket[0]
        add((OK, "rocket node", f"{n.path}: {n.driver}"))
    else:
        add((FAIL, "rocket node", r.no_npu))

    cores = facts.cores
    if cores:
        add((OK, "NPU cores", f"{len(cores)} bound to rocket ({', '.join(c.device for c in cores)})"))
        missing = [c.device for c in cores if c.iommu_group is None]
        if missing:
            add((FAIL, "IOMMU", f"no IOMMU group for {', '.join(missing)}: enable the rknn_mmu nodes in the "
                                f"device tree (kernel/dts)"))
        else:
            add((OK, "IOMMU", "every core is behind an IOMMU (groups "
                              f"{', '.join(sorted({c.iommu_group for c in cores}))})"))
    elif rocket:
        add((WARN, "NPU cores", "none listed under /sys/bus/platform/drivers/rocket"))

    if facts.clock_hz is None:
        target = facts.params.get("npu_freq_mhz")
        also = f"; the OPP patch targets {target} MHz (rocket.npu_freq_mhz)" if target else ""
        add((INFO, "NPU clock", f"unknown: not readable in debugfs (run as root with debugfs mounted){also}"))
    elif facts.clock_hz < TARGET_HZ - RATE_SLACK_HZ:
        add((WARN, "NPU clock", f"{facts.clock_name} at {_mhz(facts.clock_hz)}, below 1 GHz: kernel/README.md "
                                f"(patches 0001 + the OPP overlay) runs it at 1 GHz"))
    else:
        add((OK, "NPU clock", f"{facts.clock_name} at {_mhz(facts.clock_hz)}"))

    if facts.rail_uv is None:
        add((INFO, "NPU rail", f"regulator {facts.rail_name} not found in /sys/class/regulator"))
    else:
        add((OK, "NPU rail", f"{facts.rail_name} at {facts.rail_uv / 1000:g} mV"))

    chain_param = facts.params.get("hw_chain")
    chained = bool(rocket) and rocket[0].driver.version >= uapi.CHAIN_VERSION
    if chained:
        add((OK, "chained submit", f"present (driver {rocket[0].driver.major}.{rocket[0].driver.minor}"
                                   f"{', hw_chain=' + chain_param if chain_param else ''})"))
    elif rocket:
        add((INFO, "chained submit", "absent: one kick per task (kernel/patches/0003 adds it)"))

    # the driver version says the patch is there; whether this process's fds
    # really share a space is what the runtime device checks at open (lanes)
    shared_param = facts.params.get("shared_vm")
    if rocket and rocket[0].driver.version >= uapi.SHARED_VM_VERSION:
        version = f"driver {rocket[0].driver.major}.{rocket[0].driver.minor}"
        if shared_param == "N":
            add((INFO, "shared space", f"switched off ({version}, shared_vm=N): every fd has its own NPU "
                                       f"address space, so one core at a time"))
        else:
            add((OK, "shared space", f"present ({version}{', shared_vm=' + shared_param if shared_param else ''})"))
    elif rocket:
        add((INFO, "shared space", "absent: every fd has its own NPU address space, so one core at a "
                                   "time (kernel/patches/0004 adds it)"))

    if rocket and rocket[0].driver.version >= uapi.IRQ_MASK_VERSION:
        add((OK, "PPU completion", f"present (driver {rocket[0].driver.major}.{rocket[0].driver.minor}): "
                                   f"PPU-only tasks complete, so max pooling can run on the NPU "
                                   f"(rkc compile --kernel-ppu-irq)"))
    elif rocket:
        add((INFO, "PPU completion", "absent: tasks end on the DPU interrupt only, so max pooling stays on "
                                     "the CPU (kernel/patches/0005 adds a job-level interrupt mask)"))

    if rocket:
        try:
            with RocketDevice(rocket[0].path, kernel=kernel, quiet=True) as dev:
                r.device = dev.describe()
            lanes = r.device["lanes"]
            add((OK if lanes > 1 else INFO, "runtime device",
                 f"{lanes} lane(s){': ' + r.device['lane_note'] if r.device['lane_note'] else ''}"))
            add((INFO, "job checks", r.device["job_checks"]))
        except RkcError as exc:
            r.no_npu = str(exc)
            add((FAIL, "runtime device", str(exc)))

    if r.no_npu:
        r.verdict = f"no NPU: {r.no_npu}"
    else:
        notes = [m.split(":")[0] if level == FAIL else m for level, _, m in r.checks if level in (WARN, FAIL)]
        clock = f", {_mhz(facts.clock_hz)}" if facts.clock_hz else ""
        summary = (f"rocket {rocket[0].driver.major}.{rocket[0].driver.minor} at {rocket[0].path}, "
                   f"{len(cores)} core(s){clock}, {'chained kicks' if chained else 'one kick per task'}")
        r.verdict = f"NPU ready: {summary}" if not notes else f"NPU usable ({summary}), but: {'; '.join(notes)}"

    r.soc_checks = soc.judge(facts.soc)
    failed = sorted({t for level, t, _ in r.soc_checks if level == FAIL})
    warned = sorted({t for level, t, _ in r.soc_checks if level == WARN} - set(failed))
    if failed:
        r.soc_verdict = f"memory and CPUs: not ready to measure ({', '.join(failed + warned)}: see above)"
    elif warned:
        r.soc_verdict = f"memory and CPUs: measurable, but see {', '.join(warned)} above"
    else:
        r.soc_verdict = "memory and CPUs: ready to measure"
    return r
