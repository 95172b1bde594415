"""The kernel/dts overlays compile with dtc and apply with fdtoverlay: the 1 GHz NPU
overlay, and the A76 2.4 GHz one (at the end).

The base tree is tests/kernel/data/rk3588-npu-stub.dts: the labels the
overlay refers to, shaped like rk3588-base.dtsi plus a board rail.  These
tests need the Debian package device-tree-compiler (dtc, fdtoverlay,
fdtget); without it they fail, they do not skip.
"""

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from kernel_fakeboard import MHZ, check_npu, ready_board

REPO = Path(__file__).resolve().parents[2]
DTS_DIR = REPO / "kernel" / "dts"
OVERLAY = DTS_DIR / "rk3588-npu-1ghz-vdd_npu_s0.dtso"
GENERATOR = DTS_DIR / "gen-npu-overlay"
STUB = Path(__file__).resolve().parent / "data" / "rk3588-npu-stub.dts"

CORES = ["/npu@fdab0000", "/npu@fdac0000", "/npu@fdad0000"]
MMUS = ["/iommu@fdab9000", "/iommu@fdac9000", "/iommu@fdad9000"]
RAIL_NODE = "/regulator-vdd-npu-s0"
PD_NODE = "/power-management/power-domain@8"
OPP_NODE = "/opp-table-npu"

# Vendor OPP points (MHz -> mV) the overlay must carry.
VENDOR_OPPS = {300: 700, 400: 700, 500: 700, 600: 700, 700: 700,
               800: 750, 900: 800, 1000: 850}


@pytest.fixture(scope="module")
def dt_tools():
    missing = [t for t in ("dtc", "fdtoverlay", "fdtget") if shutil.which(t) is None]
    if missing:
        pytest.fail("device-tree-compiler is not installed (missing %s); "
                    "install it with: apt-get install -y device-tree-compiler"
                    % ", ".join(missing))


def run(*cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True)


def compile_dt(src, out):
    """dtc -@ src -> out; returns the completed process (stderr = warnings)."""
    return run("dtc", "-@", "-I", "dts", "-O", "dtb", "-o", out, src)


def fdtget(dtb, node, prop, kind="u"):
    res = run("fdtget", "-t", kind, dtb, node, prop)
    assert res.returncode == 0, "fdtget %s %s: %s" % (node, prop, res.stderr)
    return res.stdout.split()


def apply_overlay(tmp_path, base_src, overlay_src):
    base = tmp_path / "base.dtb"
    dtbo = tmp_path / "npu.dtbo"
    merged = tmp_path / "merged.dtb"
    res = compile_dt(base_src, base)
    assert res.returncode == 0, res.stderr
    res = compile_dt(overlay_src, dtbo)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", "dtc warned about the overlay:\n" + res.stderr
    res = run("fdtoverlay", "-i", base, "-o", merged, dtbo)
    return res, merged


def test_overlay_compiles_without_warnings(dt_tools, tmp_path):
    res = compile_dt(OVERLAY, tmp_path / "npu.dtbo")
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", "dtc warned about the overlay:\n" + res.stderr


def test_overlay_applies_to_stub_base(dt_tools, tmp_path):
    res, merged = apply_overlay(tmp_path, STUB, OVERLAY)
    assert res.returncode == 0, res.stderr

    rail = fdtget(merged, RAIL_NODE, "phandle")
    opp_table = fdtget(merged, OPP_NODE, "phandle")
    for core in CORES:
        assert run("fdtget", merged, core, "status").stdout.strip() == "okay", core
        assert fdtget(merged, core, "npu-supply") == rail, core
        assert fdtget(merged, core, "sram-supply") == rail, core
        assert fdtget(merged, core, "operating-points-v2") == opp_table, core
        # 0 = "do not touch this clock": the 200 MHz pin is neutralised.
        assert fdtget(merged, core, "assigned-clock-rates") == ["0"], core
    for mmu in MMUS:
        assert run("fdtget", merged, mmu, "status").stdout.strip() == "okay", mmu
    assert fdtget(merged, PD_NODE, "domain-supply") == rail


def test_opp_table_has_vendor_points(dt_tools, tmp_path):
    res, merged = apply_overlay(tmp_path, STUB, OVERLAY)
    assert res.returncode == 0, res.stderr
    assert fdtget(merged, OPP_NODE, "compatible", "s") == ["operating-points-v2"]
    nodes = run("fdtget", "-l", merged, OPP_NODE).stdout.split()
    assert sorted(nodes) == sorted("opp-%d" % (mhz * 1000000) for mhz in VENDOR_OPPS)
    assert run("fdtget", merged, OPP_NODE, "opp-shared").returncode != 0, \
        "opp-shared would make the cores share one voltage vote"
    for mhz, mv in VENDOR_OPPS.items():
        node = "%s/opp-%d" % (OPP_NODE, mhz * 1000000)
        hi, lo = (int(x) for x in fdtget(merged, node, "opp-hz"))
        assert (hi << 32) | lo == mhz * 1000000, node
        target, vmin, vmax = (int(x) for x in fdtget(merged, node, "opp-microvolt"))
        assert target == vmin == mv * 1000, node
        assert vmax == 950000, node


def test_overlay_needs_the_rail_label(dt_tools, tmp_path):
    """Against a base without the rail label the overlay must not apply."""
    base = tmp_path / "no-rail.dts"
    base.write_text(STUB.read_text().replace("vdd_npu_s0: ", ""))
    res, _ = apply_overlay(tmp_path, base, OVERLAY)
    assert res.returncode != 0


def test_generator_reproduces_rock5b_overlay(tmp_path):
    res = run("sh", GENERATOR, "vdd_npu_s0")
    assert res.returncode == 0, res.stderr
    assert res.stdout == OVERLAY.read_text()


def test_generated_overlay_for_other_rail_applies(dt_tools, tmp_path):
    base = tmp_path / "other-board.dts"
    base.write_text(STUB.read_text()
                    .replace("vdd_npu_s0: ", "vdd_npu: ")
                    .replace("\t\tregulator-name = \"vdd_npu_s0\";",
                             "\t\tregulator-name = \"vdd_npu\";"))
    overlay = tmp_path / "other-board-npu-1ghz.dtso"
    res = run("sh", GENERATOR, "vdd_npu")
    assert res.returncode == 0, res.stderr
    assert "vdd_npu_s0>" not in res.stdout
    overlay.write_text(res.stdout)

    res, merged = apply_overlay(tmp_path, base, overlay)
    assert res.returncode == 0, res.stderr
    rail = fdtget(merged, RAIL_NODE, "phandle")
    for core in CORES:
        assert fdtget(merged, core, "npu-supply") == rail


@pytest.mark.parametrize("bad", ["", "1abc", "vdd-npu", "a b"])
def test_generator_rejects_bad_labels(bad):
    res = run("sh", GENERATOR, bad)
    assert res.returncode == 2
    assert "label" in res.stderr


# kernel/dts/rk3588-a76-2400.dtso: applies to a vendor-shaped base (the A76 OPP tables with
# their speed-bin masks), changes only the 2.4 GHz OPPs' mask, and check-npu reports it applied.
A76_OVERLAY = DTS_DIR / "rk3588-a76-2400.dtso"
A76_STUB = Path(__file__).resolve().parent / "data" / "rk3588-a76-stub.dts"
A76_TABLES = ["/opp-table-cluster1", "/opp-table-cluster2"]


def as_dts(dtb):
    res = run("dtc", "-I", "dtb", "-O", "dts", dtb)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_a76_overlay_compiles_without_warnings(dt_tools, tmp_path):
    res = compile_dt(A76_OVERLAY, tmp_path / "a76.dtbo")
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_a76_overlay_opens_only_the_2400_opp_to_every_bin(dt_tools, tmp_path):
    res, merged = apply_overlay(tmp_path, A76_STUB, A76_OVERLAY)
    assert res.returncode == 0, res.stderr
    for table in A76_TABLES:
        top = table + "/opp-2400000000"
        assert fdtget(merged, top, "opp-supported-hw", "x") == ["f9", "ffff"]  # SoC-version mask kept
        assert fdtget(merged, top, "rkc,overlay", "s") == ["rk3588-a76-2400"]
        assert fdtget(merged, top, "opp-microvolt") == ["1000000", "1000000", "1000000"]  # voltage untouched
        assert fdtget(merged, table + "/opp-2304000000", "opp-supported-hw", "x") == ["f9", "24"]
    # nothing else changes: the merged tree is the base with these lines swapped, twice
    base, merged_lines = Counter(as_dts(tmp_path / "base.dtb")), Counter(as_dts(merged))
    assert {l.strip(): n for l, n in (base - merged_lines).items()} == {"opp-supported-hw = <0xf9 0x80>;": 2}
    assert {l.strip(): n for l, n in (merged_lines - base).items()} == {
        "opp-supported-hw = <0xf9 0xffff>;": 2, 'rkc,overlay = "rk3588-a76-2400";': 2}


def test_a76_overlay_needs_the_vendor_labels(dt_tools, tmp_path):
    base = tmp_path / "no-label.dts"
    base.write_text(A76_STUB.read_text().replace("cluster2_opp_table: ", ""))
    res, _ = apply_overlay(tmp_path, base, A76_OVERLAY)
    assert res.returncode != 0


def test_a76_check_npu_reports_the_applied_overlay(dt_tools, tmp_path):
    """The 2.4 GHz OPP nodes as the merged DTB has them, laid out in a fake tree."""
    res, merged = apply_overlay(tmp_path, A76_STUB, A76_OVERLAY)
    assert res.returncode == 0, res.stderr
    root = tmp_path / "board"
    board = ready_board(root)
    board.cpufreq(volt_sel=(2, 2), overlay=True)
    for table in A76_TABLES:
        node = "%s/opp-2400000000" % table.strip("/")
        cells = fdtget(merged, table + "/opp-2400000000", "opp-supported-hw", "x")
        board._prop(node, "opp-supported-hw", board.cells(*(int(c, 16) for c in cells)))
        mark = fdtget(merged, table + "/opp-2400000000", "rkc,overlay", "s")[0]
        board._prop(node, "rkc,overlay", mark + "\0")
        assert board.cells(2400 * MHZ, width=8) == (root / "sys/firmware/devicetree/base" / node / "opp-hz").read_bytes()
    out = check_npu(root).stdout
    assert "[INFO] A76 overlay     rk3588-a76-2400 applied (opp-table-cluster1, opp-table-cluster2)" in out
    assert "[OK  ] A76 clock       policy4 (cpu4,5): max 2400 MHz" in out
