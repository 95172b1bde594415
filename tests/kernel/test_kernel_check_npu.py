"""kernel/check-npu against fake board trees (see kernel_fakeboard.py)."""

import os

import pytest

from kernel_fakeboard import (CHECK_NPU, MHZ, FakeBoard, PATCHED_PARAMS, check_json, check_npu, lines,
                              no_npu_board, ready_board, stock_200mhz_board)


@pytest.fixture
def fake_root(tmp_path):
    root = tmp_path / "board"
    root.mkdir()
    return root


def test_ready_board_exits_0(fake_root):
    ready_board(fake_root)
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert lines(res, "FAIL") == []
    out = res.stdout
    assert "verdict: READY for 1 GHz" in out
    assert "scmi_clk_npu at 1000 MHz" in out
    assert "vdd_npu_s0 at 850 mV" in out
    assert "8 points, 300 MHz-1000 MHz" in out
    assert "3 cores probed" in out
    assert "/dev/accel/accel0" in out
    assert "chained submit  present (hw_chain=Y)" in out
    assert "shared space    present (shared_vm=Y): the files of one process share" in out
    assert "active: fdab0000.npu, fdac0000.npu, fdad0000.npu" in out


def test_ready_board_json_reports_every_fact(fake_root):
    ready_board(fake_root)
    status, report = check_json(fake_root)
    assert status == report["exit_status"] == 0
    facts = report["facts"]
    assert facts["clock"] == {"name": "scmi_clk_npu", "hz": 1000 * MHZ}
    assert facts["rail"]["uv"] == 850000
    assert len(facts["driver"]["cores"]) == 3
    assert [p["hz"] for p in facts["device_tree"][0]["opp"]][-1] == 1000 * MHZ
    assert facts["driver"]["params"] == {k: str(v) for k, v in PATCHED_PARAMS.items()}
    assert report["chain_supported"] is True
    assert report["shared_vm_supported"] is True and report["shared_vm_enabled"] is True


def test_200mhz_stock_board_is_not_ready(fake_root):
    stock_200mhz_board(fake_root)
    res = check_npu(fake_root)
    assert res.returncode == 1, res.stdout
    fails = "\n".join(lines(res, "FAIL"))
    assert "scmi_clk_npu at 200 MHz, not 1 GHz" in fails
    assert "OPP table" in fails and "none on npu@fdab0000" in fails
    assert "assigned-clock-rates" in fails
    assert "OPP patch       absent" in fails
    assert "SError guard    absent" in fails
    assert "chained submit  absent" in res.stdout
    assert "shared space    absent: every file has its own NPU address space" in res.stdout
    assert "suspended: fdab0000.npu" in res.stdout
    assert "NOT READY" in res.stdout


def test_board_without_npu_exits_3(fake_root):
    no_npu_board(fake_root)
    res = check_npu(fake_root)
    assert res.returncode == 3, res.stdout
    assert "none enabled" in res.stdout
    assert "rocket is not loaded" in res.stdout
    assert "no accel node" in res.stdout
    assert "verdict: NO NPU" in res.stdout


def test_empty_root_is_no_npu(fake_root):
    res = check_npu(fake_root)
    assert res.returncode == 3
    assert "not readable" in res.stdout


def test_1ghz_on_boot_voltage_is_unsafe(fake_root):
    board = ready_board(fake_root)
    board.regulator(700000)
    res = check_npu(fake_root)
    assert res.returncode == 4, res.stdout
    assert "UNSAFE: vdd_npu_s0 at 700 mV while the clock runs 1000 MHz (needs 850 mV)" in res.stdout


def test_low_voltage_while_all_cores_suspended_is_fine(fake_root):
    """Suspended cores drop their supply vote; the gated clock may read 1 GHz."""
    board = ready_board(fake_root, runtime_status="suspended")
    board.regulator(700000)
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout


def test_one_hour_autosuspend_counts_as_serror_guard(fake_root):
    ready_board(fake_root)
    FakeBoard(fake_root).driver(params={"npu_freq_mhz": 1000}, autosuspend_ms=3600000)
    os.remove(fake_root / "sys/module/rocket/parameters/hold_power")
    os.remove(fake_root / "sys/module/rocket/parameters/hw_chain")
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout
    assert "autosuspend delay >= 1 h" in res.stdout
    assert "chained submit  absent" in res.stdout


def test_shared_vm_switched_off_is_reported_but_does_not_block_1ghz(fake_root):
    ready_board(fake_root)
    (fake_root / "sys/module/rocket/parameters/shared_vm").write_text("N\n")
    status, report = check_json(fake_root)
    assert status == 0
    assert report["shared_vm_supported"] is True and report["shared_vm_enabled"] is False
    res = check_npu(fake_root)
    assert "shared space    present but switched off (shared_vm=N)" in res.stdout


def test_series_up_to_0003_has_no_shared_space(fake_root):
    ready_board(fake_root)
    os.remove(fake_root / "sys/module/rocket/parameters/shared_vm")
    status, report = check_json(fake_root)
    assert status == 0
    assert report["chain_supported"] is True and report["shared_vm_supported"] is False
    assert any(c["topic"] == "shared space" and c["message"].startswith("absent")
               for c in report["checks"])


def test_driver_version_1_2_alone_means_shared_space(fake_root):
    """On a board the version comes from DRM_IOCTL_VERSION on the node."""
    mod = load_check_npu()
    ready_board(fake_root)
    os.remove(fake_root / "sys/module/rocket/parameters/shared_vm")
    for version, present in (((1, 1), False), ((1, 2), True), ((2, 0), True)):
        facts = mod.gather(str(fake_root))
        facts["driver"]["accel"][0]["version"] = {"name": "rocket", "major": version[0],
                                                  "minor": version[1]}
        checks, status = mod.judge(facts)
        shared = [m for _, t, m in checks if t == "shared space"]
        assert shared and shared[0].startswith("present") == present, (version, shared)
        assert "rocket %d.%d" % version in [m for _, t, m in checks if t == "/dev/accel"][0]


def test_hold_power_switched_off_is_not_ready(fake_root):
    ready_board(fake_root)
    (fake_root / "sys/module/rocket/parameters/hold_power").write_text("N\n")
    res = check_npu(fake_root)
    assert res.returncode == 1
    assert "switched off" in res.stdout


def test_opp_table_without_1ghz_or_with_low_voltage_is_not_ready(fake_root):
    board = ready_board(fake_root)
    board.dt_opp_table(points=[(300, 700), (1000, 800)])
    res = check_npu(fake_root)
    assert res.returncode == 1
    assert "runs 1 GHz at 800 mV, below the vendor 850 mV" in res.stdout


def test_capped_module_parameter_is_not_ready(fake_root):
    board = ready_board(fake_root)
    board.driver(params={"npu_freq_mhz": 800, "hold_power": "Y"})
    board.clock(800 * MHZ)
    board.regulator(750000)
    res = check_npu(fake_root)
    assert res.returncode == 1
    assert "rocket.npu_freq_mhz=800 caps the clock" in res.stdout


def test_unreadable_debugfs_warns_but_does_not_block(fake_root):
    ready_board(fake_root)
    os.remove(fake_root / "sys/kernel/debug/clk/scmi_clk_npu/clk_rate")
    res = check_npu(fake_root)
    assert res.returncode == 0, res.stdout
    assert any("clock" in l and "unknown" in l for l in lines(res, "WARN"))


def test_root_from_environment(fake_root):
    stock_200mhz_board(fake_root)
    env = dict(os.environ, CHECK_NPU_ROOT=str(fake_root))
    res = check_npu(None, env=env)
    assert res.returncode == 1
    assert "root %s" % fake_root in res.stdout


def test_rail_name_option(fake_root):
    board = ready_board(fake_root)
    board.regulator(850000, name="vdd_npu", index=20)
    status, report = check_json(fake_root, "--rail", "vdd_npu")
    assert report["facts"]["rail"]["regulator"] == "regulator.20"


def test_missing_root_is_a_usage_error(tmp_path):
    res = check_npu(tmp_path / "nowhere")
    assert res.returncode == 2
    assert "not a directory" in res.stderr


def load_check_npu():
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("check_npu", str(CHECK_NPU))
    spec = importlib.util.spec_from_loader("check_npu", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_drm_version_struct_matches_the_kernel_abi():
    """struct drm_version: 3 ints, then 3 (size_t, pointer) pairs."""
    import ctypes
    mod = load_check_npu()
    pointer = ctypes.sizeof(ctypes.c_void_p)
    assert ctypes.sizeof(mod.DrmVersion) == (64 if pointer == 8 else 36)


def test_drm_version_on_a_non_drm_char_device_is_none():
    mod = load_check_npu()
    assert mod.drm_version("/dev/null") is None
