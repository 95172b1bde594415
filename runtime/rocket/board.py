"""What a board says about its NPU: accel nodes, bound cores, clock, rail, IOMMU,
the kernel/ patch markers. Read-only, below a root directory so tests can point
it at a fake tree.

The paths are the ones kernel/check-npu reads (the full 1 GHz readiness check
lives there); `rkc doctor` and `rkc probe` report the subset the runtime cares
about, plus what the device itself finds when it opens the node.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from rkc.runtime.rocket import soc
from rkc.runtime.rocket.kernel import KernelInterface, LinuxKernel
from rkc.runtime.rocket.nodes import NodeInfo, scan_nodes

DRIVER_SYSFS = "sys/bus/platform/drivers/rocket"
PARAMS_SYSFS = "sys/module/rocket/parameters"
CLOCK_DEBUGFS = "sys/kernel/debug/clk"
REGULATORS = "sys/class/regulator"
#: the NPU clock in debugfs: the SCMI "npu" clock on RK3588 mainline (seed 000 REPLICATION.md)
CLOCK_NAMES = ("scmi_clk_npu", "clk_npu")
DEFAULT_RAIL = "vdd_npu_s0"
#: module parameters the kernel/ patches add: 0001 npu_freq_mhz, 0002 hold_power, 0003 hw_chain,
#: 0004 shared_vm
PARAMS = ("npu_freq_mhz", "hold_power", "hw_chain", "shared_vm")
_DRIVER_DIR_ENTRIES = {"bind", "unbind", "uevent", "module", "new_id", "remove_id"}
TARGET_HZ = 1_000_000_000
RATE_SLACK_HZ = 10_000_000  # SCMI rounds rates


@dataclass
class Core:
    device: str  # e.g. fdab0000.npu
    iommu_group: str | None  # None: not behind an IOMMU
    runtime_status: str | None


@dataclass
class BoardFacts:
    root: str
    nodes: list[NodeInfo] = field(default_factory=list)
    module_loaded: bool = False
    cores: list[Core] = field(default_factory=list)
    clock_name: str | None = None
    clock_hz: int | None = None
    rail_name: str = DEFAULT_RAIL
    rail_uv: int | None = None
    params: dict[str, str | None] = field(default_factory=dict)
    soc: dict = field(default_factory=dict)  # memory controller and CPU clusters (soc.gather)

    @property
    def rocket_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes if n.is_rocket]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["nodes"] = [{"path": n.path, "driver": str(n.driver) if n.driver else None, "error": n.error}
                      for n in self.nodes]
        return d


_text, _int = soc.read_text, soc.read_int


def gather(root: str = "/", kernel: KernelInterface | None = None, rail: str = DEFAULT_RAIL) -> BoardFacts:
    kernel = kernel or LinuxKernel(os.path.join(root, "dev", "accel"))
    facts = BoardFacts(root, nodes=scan_nodes(kernel), rail_name=rail)
    facts.module_loaded = os.path.isdir(os.path.join(root, "sys/module/rocket"))
    facts.params = {p: _text(root, PARAMS_SYSFS, p) for p in PARAMS}
    facts.soc = soc.gather(root)

    bound = os.path.join(root, DRIVER_SYSFS)
    if os.path.isdir(bound):
        for entry in sorted(os.listdir(bound)):
            if entry in _DRIVER_DIR_ENTRIES:
                continue
            group = os.path.join(bound, entry, "iommu_group")
            facts.cores.append(Core(entry, os.path.basename(os.path.realpath(group)) if os.path.exists(group)
                                    else None, _text(root, DRIVER_SYSFS, entry, "power", "runtime_status")))

    clk = os.path.join(root, CLOCK_DEBUGFS)
    if os.path.isdir(clk):
        names = sorted(os.listdir(clk))
        others = [n for n in names if "npu" in n and not n.startswith(("aclk", "hclk", "pclk"))]
        for name in [n for n in CLOCK_NAMES if n in names] + others:
            rate = _int(root, CLOCK_DEBUGFS, name, "clk_rate")
            if rate is not None:
                facts.clock_name, facts.clock_hz = name, rate
                break

    regs = os.path.join(root, REGULATORS)
    if os.path.isdir(regs):
        for entry in sorted(os.listdir(regs)):
            if _text(root, REGULATORS, entry, "name") == rail:
                facts.rail_uv = _int(root, REGULATORS, entry, "microvolts")
                break
    return facts
