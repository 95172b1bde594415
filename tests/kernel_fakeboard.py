"""Fake board trees for kernel/check-npu (used by test_kernel_check_npu.py): device tree, sysfs, debugfs, /dev.

Each file is laid out where the kernel puts it on a real RK3588 board, with
the same contents (device-tree properties as big-endian cells, sysfs values
as text), below a temporary root that check-npu reads with --root.
"""

from pathlib import Path

MHZ = 1_000_000
VENDOR_OPPS = [(300, 700), (400, 700), (500, 700), (600, 700), (700, 700),
               (800, 750), (900, 800), (1000, 850)]
CORES = [("npu@fdab0000", "fdab0000.npu"), ("npu@fdac0000", "fdac0000.npu"),
         ("npu@fdad0000", "fdad0000.npu")]
RAIL_PHANDLE, OPP_PHANDLE = 0x6A, 0x7B


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

    # sysfs, debugfs, /dev
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
