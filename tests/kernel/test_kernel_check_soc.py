"""kernel/check-npu's memory-controller and CPU-clock lines (runtime/rocket/soc.py) on fake trees."""

import os
import shutil
import subprocess
import sys

import pytest

from kernel_fakeboard import A76_OPPS, CHECK_NPU, check_json, check_npu, no_npu_board, ready_board


@pytest.fixture
def fake_root(tmp_path):
    root = tmp_path / "board"
    root.mkdir()
    return root


def topic(res, name):
    found = [l for l in res.stdout.splitlines() if l[7:].startswith(name + " ")]
    assert found, "no %r line in:\n%s" % (name, res.stdout)
    return found


def test_pinned_dmc_and_full_a76_are_ok(fake_root):
    ready_board(fake_root)
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout
    assert topic(res, "DDR devfreq") == ["[OK  ] DDR devfreq     /sys/class/devfreq/dmc: rates 528, 1068, 1560, "
                                         "2400 MHz"]
    assert topic(res, "DDR rate") == ["[OK  ] DDR rate        2400 MHz, its top rate, held there by the "
                                      "performance governor"]
    assert topic(res, "A76 clock") == ["[OK  ] A76 clock       policy4 (cpu4,5): max 2400 MHz",
                                       "[OK  ] A76 clock       policy6 (cpu6,7): max 2400 MHz"]
    assert topic(res, "CPU governor") == ["[OK  ] CPU governor    performance on policy0, policy4, policy6"]
    assert topic(res, "A76 overlay") == ["[INFO] A76 overlay     rk3588-a76-2400 not applied (not needed: this "
                                         "die's speed bin admits 2.4 GHz)"]


def test_no_dmc_device_blames_bl31_and_is_not_ready(fake_root):
    ready_board(fake_root)
    shutil.rmtree(fake_root / "sys/class/devfreq")
    res = check_npu(fake_root)
    assert res.returncode == 1, res.stdout
    (line,) = topic(res, "DDR devfreq")
    assert line.startswith("[FAIL]")
    assert "BL31 probably lacks the DDR services" in line and "rkbin's BL31" in line
    assert "docs/board.md" in line
    assert "NOT READY" in res.stdout


def test_disabled_dmc_node_says_enable_it(fake_root):
    board = ready_board(fake_root)
    shutil.rmtree(fake_root / "sys/class/devfreq")
    board.dt_dmc(enabled=False)
    (line,) = topic(check_npu(fake_root), "DDR devfreq")
    assert line.startswith("[FAIL]") and "node is disabled; enable it" in line


def test_mainline_without_dmc_node_is_a_warning(fake_root):
    """Mainline has no RK3588 DMC driver: nothing to pin, so measure instead."""
    ready_board(fake_root)
    shutil.rmtree(fake_root / "sys/class/devfreq")
    shutil.rmtree(fake_root / "sys/firmware/devicetree/base/dmc")
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout
    (line,) = topic(res, "DDR devfreq")
    assert line.startswith("[WARN]") and "rkc probe --dram" in line


def test_dmc_on_powersave_at_528mhz_fails_with_the_fix(fake_root):
    board = ready_board(fake_root)
    board.dmc(governor="powersave", cur_mhz=528)
    res = check_npu(fake_root)
    assert res.returncode == 1, res.stdout
    assert topic(res, "DDR governor") == [
        "[FAIL] DDR governor    powersave: holds the DDR at its lowest rate, and decode is bound by DDR "
        "bandwidth; echo performance | sudo tee /sys/class/devfreq/dmc/governor"]
    assert topic(res, "DDR rate") == [
        "[WARN] DDR rate        528 MHz of 2400 MHz; it can be held at 2400 MHz for a run: echo performance | "
        "sudo tee /sys/class/devfreq/dmc/governor"]


def test_dmc_ondemand_warns_and_max_freq_cap_is_reported(fake_root):
    board = ready_board(fake_root)
    board.dmc(governor="dmc_ondemand", cur_mhz=1068, max_mhz=1560)
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout
    (gov,) = topic(res, "DDR governor")
    assert gov.startswith("[WARN] DDR governor    dmc_ondemand: the rate follows the load")
    assert topic(res, "DDR rate") == [
        "[WARN] DDR rate        1068 MHz; max_freq caps it at 1560 MHz of 2400 MHz: echo 2400000000 | "
        "sudo tee /sys/class/devfreq/dmc/max_freq"]


def test_dmc_below_top_under_performance_is_reported(fake_root):
    ready_board(fake_root).dmc(governor="performance", cur_mhz=1560)
    (line,) = topic(check_npu(fake_root), "DDR rate")
    assert line.startswith("[WARN] DDR rate        1560 MHz of 2400 MHz under the performance governor")


def test_dmc_that_cannot_be_pinned_fails(fake_root):
    board = ready_board(fake_root)
    board.dmc(governor="dmc_ondemand", cur_mhz=1068, governors="dmc_ondemand powersave")
    (line,) = topic(check_npu(fake_root), "DDR rate")
    assert line.startswith("[FAIL]") and "cannot be held at its top rate" in line


def test_a76_capped_at_2304_by_the_speed_bin(fake_root):
    board = ready_board(fake_root)
    board.cpufreq(volt_sel=(2, 3))
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout  # slower, not broken: a warning
    p4, p6 = topic(res, "A76 clock")
    assert p4.startswith("[WARN] A76 clock       policy4 (cpu4,5): tops out at 2304 MHz, not 2400 MHz: "
                         "hidden by the PVTM speed bin: opp-table-cluster1/opp-2400000000 has "
                         "opp-supported-hw <0xf9 0x80>")
    # the bin follows from which masked OPPs the kernel offers (0x24 -> 2304 offered: volt-sel 2 or 5)
    assert "this die's volt-sel is 2 or 5" in p4
    assert "kernel/dts/rk3588-a76-2400.dtso exposes it" in p4
    assert "policy6 (cpu6,7): tops out at 2352 MHz" in p6 and "volt-sel is 3 or 6" in p6


def test_overlay_applied_is_reported_and_lifts_the_cap(fake_root):
    board = ready_board(fake_root)
    board.soc(overlay=True, volt_sel=(2, 2))
    res = check_npu(fake_root)
    assert [l[:7] for l in topic(res, "A76 clock")] == ["[OK  ] ", "[OK  ] "]
    (line,) = topic(res, "A76 overlay")
    assert line.startswith("[INFO] A76 overlay     rk3588-a76-2400 applied (opp-table-cluster1, "
                           "opp-table-cluster2): the 2.4 GHz OPP is open to every speed bin")


def test_scaling_max_freq_cap_is_not_the_bin(fake_root):
    ready_board(fake_root)
    (fake_root / "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq").write_text("1800000\n")
    p4 = topic(check_npu(fake_root), "A76 clock")[0]
    assert p4 == ("[WARN] A76 clock       policy4 (cpu4,5): scaling_max_freq caps it at 1800 MHz of 2400 MHz: "
                  "echo 2400000 | sudo tee /sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq")


def test_schedutil_governors_warn(fake_root):
    board = ready_board(fake_root)
    board.cpufreq(governor="schedutil")
    (line,) = topic(check_npu(fake_root), "CPU governor")
    assert line.startswith("[WARN] CPU governor    policy0: schedutil; policy4: schedutil; policy6: schedutil")
    assert "echo performance | sudo tee /sys/devices/system/cpu/cpufreq/policy*/scaling_governor" in line


def test_no_cpufreq_warns(fake_root):
    ready_board(fake_root)
    shutil.rmtree(fake_root / "sys/devices/system/cpu/cpufreq")
    (line,) = topic(check_npu(fake_root), "CPU clocks")
    assert line.startswith("[WARN]") and "CONFIG_CPUFREQ_DT" in line


def test_memory_and_cpu_lines_print_without_an_npu(fake_root):
    board = no_npu_board(fake_root)
    board.soc(dmc=False)
    res = check_npu(fake_root)
    assert res.returncode == 3, res.stdout  # no NPU still wins
    assert topic(res, "DDR devfreq")[0].startswith("[FAIL]")
    assert topic(res, "A76 clock")[0].startswith("[OK  ]")


def test_json_carries_the_soc_facts(fake_root):
    board = ready_board(fake_root)
    board.dmc(governor="powersave", cur_mhz=528)
    status, report = check_json(fake_root)
    assert status == 1
    dmc = report["facts"]["soc"]["dmc"]
    assert dmc["governor"] == "powersave" and dmc["cur_hz"] == 528_000_000
    assert dmc["rates_hz"][-1] == 2_400_000_000
    policies = report["facts"]["soc"]["cpufreq"]
    assert [(p["policy"], p["cores"]) for p in policies] == [("policy0", "A55"), ("policy4", "A76"),
                                                             ("policy6", "A76")]


def test_fixture_masks_give_the_seed_boards_caps():
    """Seed 003: volt-sel 2 admits only the 2304 MHz top OPP; its sibling board came up at 2352."""
    tops = {}
    for sel in range(8):
        tops[sel] = max(m for m, hw in A76_OPPS if hw[1] >> sel & 1)
    assert tops == {0: 2256, 1: 2256, 2: 2304, 3: 2352, 4: 2256, 5: 2304, 6: 2352, 7: 2400}


def test_mainline_table_without_masks_needs_no_overlay(fake_root):
    ready_board(fake_root)
    for opp in (fake_root / "sys/firmware/devicetree/base").glob("opp-table-cluster*/opp-*/opp-supported-hw"):
        opp.unlink()
    (line,) = topic(check_npu(fake_root), "A76 overlay")
    assert line.endswith("not applied (not needed: the 2.4 GHz OPP carries no speed-bin mask)")


def test_capped_board_says_plainly_not_applied(fake_root):
    board = ready_board(fake_root)
    board.cpufreq(volt_sel=(2, 2))
    assert topic(check_npu(fake_root), "A76 overlay") == ["[INFO] A76 overlay     rk3588-a76-2400 not applied"]


def test_check_npu_copied_out_of_the_tree_uses_the_installed_rkc(fake_root, tmp_path):
    """On a board check-npu may run outside a checkout; then soc.py comes from the installed rkc."""
    alone = tmp_path / "bin" / "check-npu"
    alone.parent.mkdir()
    alone.write_text(CHECK_NPU.read_text())
    ready_board(fake_root).dmc(governor="powersave", cur_mhz=528)
    res = subprocess.run([sys.executable, str(alone), "--root", str(fake_root)], capture_output=True, text=True,
                         env=dict(os.environ), cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[FAIL] DDR governor    powersave" in res.stdout
