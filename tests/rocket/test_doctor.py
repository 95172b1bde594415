"""`rkc doctor` on fake sysfs trees (and the emulated kernel for the node)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from rkc.compiler.cli import main
from rkc.runtime.rocket.doctor import build_report
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, IRQ_PATCHED, SHARED_PATCHED, STOCK, EmulatedKernel

CORES = ("fdab0000.npu", "fdac0000.npu", "fdad0000.npu")


def fake_board(root: Path, *, clock_hz=1_000_000_000, uv=850_000, cores=CORES, iommu=True,
               params=("npu_freq_mhz", "hold_power", "hw_chain")) -> Path:
    def write(rel, text):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    for i, core in enumerate(cores):
        d = root / "sys/bus/platform/drivers/rocket" / core
        write(f"sys/bus/platform/drivers/rocket/{core}/power/runtime_status", "suspended")
        if iommu or i > 0:
            group = root / "sys/kernel/iommu_groups" / str(3 + i)
            group.mkdir(parents=True, exist_ok=True)
            os.symlink(group, d / "iommu_group")
    (root / "sys/bus/platform/drivers/rocket/bind").write_text("")
    values = {"npu_freq_mhz": "1000", "hold_power": "Y", "hw_chain": "Y", "shared_vm": "Y"}
    for p in params:
        write(f"sys/module/rocket/parameters/{p}", values[p])
    write("sys/kernel/debug/clk/scmi_clk_npu/clk_rate", str(clock_hz))
    write("sys/kernel/debug/clk/aclk_npu0/clk_rate", "800000000")
    write("sys/class/regulator/regulator.5/name", "vdd_cpu_big0_s0")
    write("sys/class/regulator/regulator.5/microvolts", "1000000")
    write("sys/class/regulator/regulator.9/name", "vdd_npu_s0")
    write("sys/class/regulator/regulator.9/microvolts", str(uv))
    return root


def test_no_npu_exits_1_with_one_line_after_the_uapi_table(tmp_path):
    result = CliRunner().invoke(main, ["doctor", "--root", str(tmp_path)])
    assert result.exit_code == 1
    assert "DRM_IOCTL_ROCKET_SUBMIT                    0x40186441    24    24  ok" in result.stdout
    assert "struct drm_rocket_job (1.0)" in result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: no NPU: no /dev/accel node (is the rocket module loaded? modprobe rocket)"]


def test_accel_node_that_is_not_rocket(tmp_path, monkeypatch):
    (tmp_path / "dev/accel").mkdir(parents=True)
    (tmp_path / "dev/accel/accel0").write_text("")  # a plain file: DRM_IOCTL_VERSION fails
    monkeypatch.setenv("RKC_ROOT", str(tmp_path))
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 1
    assert "no /dev/accel node is driven by rocket (accel0: DRM_IOCTL_VERSION failed" in result.stderr


def test_ready_board_with_the_kernel_patches(tmp_path):
    r = build_report(str(fake_board(tmp_path)), EmulatedKernel(CHAIN_PATCHED))
    assert r.no_npu is None
    assert r.verdict == ("NPU ready: rocket 1.1 at /dev/accel/accel0, 3 core(s), 1000 MHz, chained kicks")
    topics = {t: (level, m) for level, t, m in r.checks}
    assert topics["chained submit"] == ("OK", "present (driver 1.1, hw_chain=Y)")
    assert topics["NPU rail"] == ("OK", "vdd_npu_s0 at 850 mV")
    assert topics["IOMMU"][0] == "OK"
    assert r.device["job_checks"].startswith("validation before submit; per-job fences")


def test_board_with_the_shared_address_space_patch(tmp_path):
    root = fake_board(tmp_path, params=("npu_freq_mhz", "hold_power", "hw_chain", "shared_vm"))
    r = build_report(str(root), EmulatedKernel(SHARED_PATCHED))
    topics = {t: (level, m) for level, t, m in r.checks}
    assert topics["shared space"] == ("OK", "present (driver 1.2, shared_vm=Y)")
    assert topics["chained submit"] == ("OK", "present (driver 1.2, hw_chain=Y)")
    assert topics["runtime device"] == ("OK", "3 lane(s)")
    assert r.verdict == "NPU ready: rocket 1.2 at /dev/accel/accel0, 3 core(s), 1000 MHz, chained kicks"


def test_board_with_the_interrupt_mask_patch(tmp_path):
    root = fake_board(tmp_path, params=("npu_freq_mhz", "hold_power", "hw_chain", "shared_vm"))
    r = build_report(str(root), EmulatedKernel(IRQ_PATCHED))
    topics = {t: (level, m) for level, t, m in r.checks}
    assert topics["PPU completion"] == ("OK", "present (driver 1.3): PPU-only tasks complete, so max pooling "
                                              "can run on the NPU (rkc compile --kernel-ppu-irq)")
    assert r.device["ppu_completion"] is True
    r = build_report(str(root), EmulatedKernel(SHARED_PATCHED))
    assert {t: level for level, t, _ in r.checks}["PPU completion"] == "INFO"


def test_shared_address_space_switched_off(tmp_path):
    """shared_vm=N: the version still says 1.2, the device's own check finds private spaces."""
    root = fake_board(tmp_path, params=("npu_freq_mhz", "hold_power", "hw_chain", "shared_vm"))
    (root / "sys/module/rocket/parameters/shared_vm").write_text("N\n")
    r = build_report(str(root), EmulatedKernel(SHARED_PATCHED, shared_address_space=False))
    topics = {t: (level, m) for level, t, m in r.checks}
    assert topics["shared space"] == ("INFO", "switched off (driver 1.2, shared_vm=N): every fd has its own "
                                              "NPU address space, so one core at a time")
    assert topics["runtime device"][1].startswith("1 lane(s): this kernel gives every file its own")


def test_stock_board_at_200_mhz(tmp_path):
    root = fake_board(tmp_path, clock_hz=200_000_000, uv=700_000, params=())
    r = build_report(str(root), EmulatedKernel(STOCK))
    assert r.no_npu is None
    topics = {t: (level, m) for level, t, m in r.checks}
    assert topics["NPU clock"] == ("WARN", "scmi_clk_npu at 200 MHz, below 1 GHz: kernel/README.md "
                                           "(patches 0001 + the OPP overlay) runs it at 1 GHz")
    assert topics["chained submit"] == ("INFO", "absent: one kick per task (kernel/patches/0003 adds it)")
    assert topics["shared space"] == ("INFO", "absent: every fd has its own NPU address space, so one core at "
                                              "a time (kernel/patches/0004 adds it)")
    assert topics["runtime device"][1].startswith("1 lane(s): this kernel gives every file its own")
    assert topics["PPU completion"] == ("INFO", "absent: tasks end on the DPU interrupt only, so max pooling "
                                                "stays on the CPU (kernel/patches/0005 adds a job-level "
                                                "interrupt mask)")
    assert r.verdict.startswith("NPU usable (rocket 0.0 at /dev/accel/accel0, 3 core(s), 200 MHz, one kick per "
                                "task), but: scmi_clk_npu at 200 MHz, below 1 GHz")


def test_core_without_iommu_and_unreadable_debugfs(tmp_path):
    root = fake_board(tmp_path, iommu=False)
    import shutil
    shutil.rmtree(root / "sys/kernel/debug")
    r = build_report(str(root), EmulatedKernel(CHAIN_PATCHED, shared_address_space=True))
    topics = {t: (level, m) for level, t, m in r.checks}
    assert topics["IOMMU"][0] == "FAIL" and "fdab0000.npu" in topics["IOMMU"][1]
    assert topics["NPU clock"][0] == "INFO" and "the OPP patch targets 1000 MHz" in topics["NPU clock"][1]
    assert topics["runtime device"] == ("OK", "3 lane(s)")
    assert "but: no IOMMU group for fdab0000.npu" in r.verdict


def test_unopenable_node(tmp_path):
    kernel = EmulatedKernel(denied=("/dev/accel/accel0",))
    r = build_report(str(tmp_path), kernel)
    assert r.no_npu.startswith("no /dev/accel node is driven by rocket (accel0: Permission denied")


def test_json_report(tmp_path):
    result = CliRunner().invoke(main, ["doctor", "--json", "--root", str(fake_board(tmp_path))])
    assert result.exit_code == 1  # the fake tree has no real rocket node
    report = json.loads(result.stdout)
    assert report["board"]["clock_hz"] == 1_000_000_000
    assert len(report["board"]["cores"]) == 3
    assert {u["name"]: u["size"] for u in report["uapi"]}["DRM_IOCTL_ROCKET_CREATE_BO"] == 24


def soc_report(tmp_path, **soc):
    """A patched board (tests' fake_board) plus the memory controller and CPU tree of kernel_fakeboard."""
    from kernel_fakeboard import FakeBoard

    root = fake_board(tmp_path)
    board = FakeBoard(root)
    board.soc(**soc)
    return board, build_report(str(root), EmulatedKernel(CHAIN_PATCHED))


def test_memory_and_cpus_ready_keep_the_npu_verdict(tmp_path):
    _, r = soc_report(tmp_path)
    assert r.verdict.startswith("NPU ready")
    topics = {t: (level, m) for level, t, m in r.soc_checks}
    assert topics["DDR rate"] == ("OK", "2400 MHz, its top rate, held there by the performance governor")
    assert r.soc_verdict == "memory and CPUs: ready to measure"


def test_doctor_without_dmc_device_says_bl31(tmp_path):
    _, r = soc_report(tmp_path, dmc=False)
    level, message = {t: (level, m) for level, t, m in r.soc_checks}["DDR devfreq"]
    assert level == "FAIL" and "BL31 probably lacks the DDR services" in message
    assert r.soc_verdict == "memory and CPUs: not ready to measure (DDR devfreq: see above)"
    assert r.verdict.startswith("NPU ready")  # the NPU side is judged on its own


def test_doctor_dmc_powersave_and_a76_capped(tmp_path):
    board, _ = soc_report(tmp_path, volt_sel=(2, 2))
    board.dmc(governor="powersave", cur_mhz=528)
    r = build_report(str(tmp_path), EmulatedKernel(CHAIN_PATCHED))
    levels = [(level, t) for level, t, _ in r.soc_checks]
    assert ("FAIL", "DDR governor") in levels and ("WARN", "DDR rate") in levels
    assert [m.split(": hidden")[0] for _, t, m in r.soc_checks if t == "A76 clock"] == [
        "policy4 (cpu4,5): tops out at 2304 MHz, not 2400 MHz", "policy6 (cpu6,7): tops out at 2304 MHz, not 2400 MHz"]
    assert r.soc_verdict == "memory and CPUs: not ready to measure (DDR governor, A76 clock, DDR rate: see above)"


def test_doctor_prints_soc_lines_without_an_npu(tmp_path):
    from kernel_fakeboard import FakeBoard

    FakeBoard(tmp_path).soc(volt_sel=(2, 2))
    result = CliRunner().invoke(main, ["doctor", "--root", str(tmp_path)])
    assert result.exit_code == 1
    soc = result.stdout.split("\nmemory controller and CPU clocks (they bound decode speed, NPU or not):\n", 1)[1]
    assert "  [WARN] A76 clock       policy4 (cpu4,5): tops out at 2304 MHz" in soc
    assert "verdict: memory and CPUs: measurable, but see A76 clock above" in result.stdout
    report = json.loads(CliRunner().invoke(main, ["doctor", "--json", "--root", str(tmp_path)]).stdout)
    assert report["board"]["soc"]["dmc"]["cur_hz"] == 2_400_000_000
    assert {c["topic"] for c in report["soc_checks"]} >= {"DDR devfreq", "A76 clock", "CPU governor"}
