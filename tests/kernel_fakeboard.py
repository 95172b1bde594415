"""Fake board trees for kernel/check-npu and `rkc doctor`: device tree, sysfs, debugfs, /dev.

Each file is laid out where the kernel puts it on a real RK3588 board, with
the same contents (device-tree properties as big-endian cells, sysfs values
as text), below a temporary root that check-npu reads with --root.
"""

import json
import subprocess
import sys
from pathlib import Path

CHECK_NPU = Path(__file__).resolve().parents[1] / "kernel" / "check-npu"

MHZ = 1_000_000
VENDOR_OPPS = [(300, 700), (400, 700), (500, 700), (600, 700), (700, 700),
               (800, 750), (900, 800), (1000, 850)]
CORES = [("npu@fdab0000", "fdab0000.npu"), ("npu@fdac0000", "fdac0000.npu"),
         ("npu@fdad0000", "fdad0000.npu")]
RAIL_PHANDLE, OPP_PHANDLE = 0x6A, 0x7B

# The memory controller and CPU clusters, shaped like the vendor-kernel ROCK 5B+ of
# seed report 003 (LPDDR5 trained to 2400 MHz; the lower DDR rates are illustrative).
DMC_RATES_MHZ = (528, 1068, 1560, 2400)
DMC_GOVERNORS = "dmc_ondemand userspace powersave performance simple_ondemand"
# (label, policy, cpus, DT nodes, MIDR_EL1): A55 r2p0 and A76 r4p0
CLUSTERS = [("cluster0", 0, (0, 1, 2, 3), ("cpu@0", "cpu@100", "cpu@200", "cpu@300"), 0x412FD050),
            ("cluster1", 4, (4, 5), ("cpu@400", "cpu@500"), 0x414FD0B0),
            ("cluster2", 6, (6, 7), ("cpu@600", "cpu@700"), 0x414FD0B0)]
A55_OPPS_MHZ = (408, 600, 816, 1008, 1200, 1416, 1608, 1800)
# A76 OPPs (MHz, opp-supported-hw) of the vendor rk3588s.dtsi: the second cell is the
# pvtm-volt-sel mask; above 2208 MHz each bin gets one top OPP.
A76_OPPS = [(408, (0xFF, 0xFFFF)), (816, (0xFF, 0xFFFF)), (1200, (0xFF, 0xFFFF)), (1608, (0xFF, 0xFFFF)),
            (1800, (0xFB, 0xFFFF)), (2016, (0xFB, 0xFFFF)), (2208, (0xF9, 0xFFFF)), (2256, (0xF9, 0x13)),
            (2304, (0xF9, 0x24)), (2352, (0xF9, 0x48)), (2400, (0xF9, 0x80))]
CLUSTER_PHANDLES = {"cluster0": 0x90, "cluster1": 0x91, "cluster2": 0x92}


class FakeBoard:
    def __init__(self, root):
        self.root = Path(root)
        self.dt = self.root / "sys/firmware/devicetree/base"
        self.dt.mkdir(parents=True, exist_ok=True)

    def _write(self, rel, data):
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return path

    def _prop(self, node, name, data):
        self._write(Path("sys/firmware/devicetree/base") / node / name, data)

    @staticmethod
    def cells(*values, width=4):
        return b"".join(v.to_bytes(width, "big") for v in values)

    # device tree
    def dt_rail(self, name="vdd_npu_s0", phandle=RAIL_PHANDLE):
        node = "regulator@42"
        self._prop(node, "regulator-name", name + "\0")
        self._prop(node, "phandle", self.cells(phandle))

    def dt_opp_table(self, points=VENDOR_OPPS, phandle=OPP_PHANDLE):
        node = "opp-table-npu"
        self._prop(node, "compatible", "operating-points-v2\0")
        self._prop(node, "phandle", self.cells(phandle))
        for mhz, mv in points:
            opp = "%s/opp-%d" % (node, mhz * MHZ)
            self._prop(opp, "opp-hz", self.cells(mhz * MHZ, width=8))
            self._prop(opp, "opp-microvolt", self.cells(mv * 1000, mv * 1000, 950000))

    def dt_cores(self, enabled=True, assigned_hz=200 * MHZ, opp_phandle=None,
                 supply_phandle=RAIL_PHANDLE):
        for node, _ in CORES:
            self._prop(node, "compatible", "rockchip,rk3588-rknn-core\0")
            self._prop(node, "status", "okay\0" if enabled else "disabled\0")
            if assigned_hz is not None:
                self._prop(node, "assigned-clock-rates", self.cells(assigned_hz))
            if opp_phandle is not None:
                self._prop(node, "operating-points-v2", self.cells(opp_phandle))
            if supply_phandle is not None:
                self._prop(node, "npu-supply", self.cells(supply_phandle))
                self._prop(node, "sram-supply", self.cells(supply_phandle))

    def dt_dmc(self, enabled=True):
        self._prop("dmc", "compatible", "rockchip,rk3588-dmc\0")
        self._prop("dmc", "status", "okay\0" if enabled else "disabled\0")

    def dt_cpus(self, overlay=False):
        """cpu nodes and their OPP tables; overlay: kernel/dts/rk3588-a76-2400.dtso applied."""
        for label, _, _, nodes, midr in CLUSTERS:
            table = "opp-table-%s" % label
            self._prop(table, "compatible", "operating-points-v2\0")
            self._prop(table, "phandle", self.cells(CLUSTER_PHANDLES[label]))
            points = A76_OPPS if midr == CLUSTERS[1][4] else [(m, (0xFF, 0xFFFF)) for m in A55_OPPS_MHZ]
            for mhz, hw in points:
                opp = "%s/opp-%d" % (table, mhz * MHZ)
                if overlay and mhz == 2400:
                    hw = (hw[0], 0xFFFF)
                    self._prop(opp, "rkc,overlay", "rk3588-a76-2400\0")
                self._prop(opp, "opp-hz", self.cells(mhz * MHZ, width=8))
                self._prop(opp, "opp-supported-hw", self.cells(*hw))
            for node in nodes:
                self._prop("cpus/" + node, "compatible",
                           "arm,cortex-a76\0" if midr == CLUSTERS[1][4] else "arm,cortex-a55\0")
                self._prop("cpus/" + node, "operating-points-v2", self.cells(CLUSTER_PHANDLES[label]))

    # sysfs, debugfs, /dev
    def dmc(self, governor="performance", cur_mhz=2400, rates_mhz=DMC_RATES_MHZ, max_mhz=None,
            governors=DMC_GOVERNORS):
        base = "sys/class/devfreq/dmc/"
        self._write(base + "governor", governor + "\n")
        self._write(base + "available_governors", governors + "\n")
        self._write(base + "available_frequencies", " ".join(str(r * MHZ) for r in rates_mhz) + "\n")
        self._write(base + "cur_freq", "%d\n" % (cur_mhz * MHZ))
        self._write(base + "min_freq", "%d\n" % (rates_mhz[0] * MHZ))
        self._write(base + "max_freq", "%d\n" % ((max_mhz or rates_mhz[-1]) * MHZ))

    def cpufreq(self, governor="performance", volt_sel=(7, 7), overlay=False):
        """cpufreq policies; volt_sel: the PVTM bin of each A76 cluster (7 admits 2400 MHz);
        overlay: kernel/dts/rk3588-a76-2400.dtso admits 2400 MHz for every bin."""
        sels = dict(zip(("cluster1", "cluster2"), volt_sel))
        for label, policy, cpus, nodes, midr in CLUSTERS:
            if label in sels:
                offered = [m for m, hw in A76_OPPS if hw[1] >> sels[label] & 1 or (overlay and m == 2400)]
            else:
                offered = list(A55_OPPS_MHZ)
            base = "sys/devices/system/cpu/cpufreq/policy%d/" % policy
            self._write(base + "related_cpus", " ".join(map(str, cpus)) + "\n")
            self._write(base + "scaling_governor", governor + "\n")
            self._write(base + "scaling_available_frequencies", " ".join(str(m * 1000) for m in offered) + "\n")
            for name in ("cpuinfo_max_freq", "scaling_max_freq", "scaling_cur_freq"):
                self._write(base + name, "%d\n" % (offered[-1] * 1000))
            for cpu, node in zip(cpus, nodes):
                self._write("sys/devices/system/cpu/cpu%d/regs/identification/midr_el1" % cpu, "%#018x\n" % midr)
                link = self.root / ("sys/devices/system/cpu/cpu%d/of_node" % cpu)
                if not link.is_symlink():
                    link.symlink_to(self.dt / "cpus" / node)

    def soc(self, dmc=True, **cpufreq):
        """A vendor-kernel device tree with dmc and cpu OPP tables; dmc devfreq pinned at its top
        rate (dmc=False: none, as with upstream TF-A's BL31); cpufreq on every cluster."""
        self.dt_dmc()
        self.dt_cpus(overlay=cpufreq.get("overlay", False))
        if dmc:
            self.dmc()
        self.cpufreq(**cpufreq)

    def driver(self, cores=3, params=None, runtime_status="active", autosuspend_ms=50):
        self._write("sys/module/rocket/refcnt", "0\n")
        for name, value in (params or {}).items():
            self._write("sys/module/rocket/parameters/" + name, "%s\n" % value)
        drv = "sys/bus/platform/drivers/rocket/"
        for entry in ("bind", "unbind", "uevent"):
            self._write(drv + entry, "")
        for _, device in CORES[:cores]:
            self._write(drv + device + "/power/runtime_status", runtime_status + "\n")
            self._write(drv + device + "/power/autosuspend_delay_ms", "%d\n" % autosuspend_ms)
            self._write(drv + device + "/power/control", "auto\n")

    def accel_node(self):
        self._write("dev/accel/accel0", "")  # a plain file: no ioctl is tried

    def clock(self, hz, name="scmi_clk_npu"):
        self._write("sys/kernel/debug/clk/%s/clk_rate" % name, "%d\n" % hz)

    def regulator(self, uv, name="vdd_npu_s0", index=12):
        base = "sys/class/regulator/regulator.%d/" % index
        self._write(base + "name", name + "\n")
        self._write(base + "microvolts", "%d\n" % uv)
        self._write(base + "state", "enabled\n")
        self._write("sys/class/regulator/regulator.1/name", "vcc5v0_sys\n")


PATCHED_PARAMS = {"npu_freq_mhz": 1000, "hold_power": "Y", "hw_chain": "Y", "shared_vm": "Y"}


def ready_board(root, **driver):
    """Rock 5B with the overlay and the whole patch series, running at 1 GHz."""
    board = FakeBoard(root)
    board.dt_rail()
    board.dt_opp_table()
    board.dt_cores(assigned_hz=0, opp_phandle=OPP_PHANDLE)
    board.driver(params=dict(PATCHED_PARAMS), **driver)
    board.accel_node()
    board.clock(1000 * MHZ)
    board.regulator(850000)
    board.soc()
    return board


def stock_200mhz_board(root):
    """Rock 5B on plain mainline: NPU enabled, clock pinned at 200 MHz."""
    board = FakeBoard(root)
    board.dt_rail()
    board.dt_cores(assigned_hz=200 * MHZ)
    board.driver(params={}, runtime_status="suspended")
    board.accel_node()
    board.clock(200 * MHZ)
    board.regulator(800000)
    return board


def no_npu_board(root):
    """RK3588 board whose device tree leaves the NPU disabled; rocket not loaded."""
    board = FakeBoard(root)
    board.dt_rail()
    board.dt_cores(enabled=False)
    board.clock(200 * MHZ)
    board.regulator(800000)
    return board


def check_npu(root, *args, env=None):
    """Run kernel/check-npu on the tree below root (None: no --root)."""
    cmd = [sys.executable, str(CHECK_NPU)]
    if root is not None:
        cmd += ["--root", str(root)]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env)


def lines(res, level):
    return [l for l in res.stdout.splitlines() if l.startswith("[%-4s]" % level)]


def check_json(root, *args):
    res = check_npu(root, "--json", *args)
    return res.returncode, json.loads(res.stdout)
