"""`rkc probe`: the framework compares NPU and simulator bytes and reports; without
an NPU it runs on the emulated kernel and says so."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from rkc.compiler.cli import main
from rkc.compiler.probe import Probe, ProbeRun, ProbeUnavailable, run_probe
from rkc.compiler.probe.programs import PROBES
from rocket_support import IncrementExecutor, put_task, task_entries
from rkc.runtime.device import Job
from rkc.runtime.rocket import RocketDevice
from rkc.runtime.rocket.emulated import CHAIN_PATCHED, STOCK, EmulatedKernel
from rkc.runtime.rocket.sim_executor import SimExecutor
from rkc.runtime.sim import SimDevice, SimError
from rkc.runtime.sim.quirks import DEFAULT


def emulated(quirks_of=lambda h: dataclasses.replace(DEFAULT, **h), variant=CHAIN_PATCHED):
    return lambda h: RocketDevice(kernel=EmulatedKernel(variant, executor=SimExecutor(quirks_of(h))), quiet=True)


def sim(h):
    return SimDevice(quirks=dataclasses.replace(DEFAULT, **h))


def by_name(name):
    return next(p for p in PROBES if p.name == name)


def test_cli_without_npu_runs_on_the_emulated_kernel(tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["probe", "-o", str(out), "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "no NPU on this machine: the probes ran against the emulated rocket kernel" in result.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "rkc-probe-report/1" and report["target"] == "emulated kernel"
    assert report["device"]["chained_kicks"] is True
    status = {p["name"]: p["status"] for p in report["probes"]}
    assert set(status) == {p.name for p in PROBES}
    # a PPU-only task is refused by the device: rocket completes tasks on the DPU interrupt only
    assert status.pop("ppu_pool") == "npu-failed"
    # the open questions the simulator has no reading for wait for a board
    for name in ("lut_int8", "deconv_x2", "argb_image", "int8_fp16_out"):
        assert status.pop(name) == "sim-refused"
    assert set(status.values()) == {"agree"}
    chain = next(p for p in report["probes"] if p["name"] == "chain_int8")
    assert "says nothing about hardware" in chain["conclusion"]
    (entry,) = chain["outputs"].values()
    assert entry["npu_sha256"] == entry["sim_sha256"]


@pytest.mark.parametrize("probe", [p for p in PROBES if p.hypothesis], ids=lambda p: p.name)
def test_each_program_exercises_its_question(probe):
    """Under the simulator's conservative reading the program is refused, so
    the probe really tests that reading (and the hypothesis makes it run)."""
    with pytest.raises(SimError):
        probe.program(SimDevice(quirks=DEFAULT))
    if probe.name != "ppu_pool":
        run = probe.program(sim(probe.hypothesis))
        for got, want in run.exact.values():
            np.testing.assert_array_equal(got, want)


def test_weight_reuse_program_reuses_weights(monkeypatch):
    from rkc.compiler.npu import api
    from rkc.compiler.probe import programs

    seen = []
    real_emit = programs.emit
    monkeypatch.setattr(programs, "emit", lambda op, options=api.DEFAULT_OPTIONS: seen.append(real_emit(op, options))
                        or seen[-1])
    by_name("weight_reuse").program(sim({}))
    (result,) = seen
    assert len(result.jobs) == 1 and len(result.tasks) > 1
    assert any(t.cbuf.weight_reuse for t in result.tasks[1:])


def test_list_and_unknown_names(tmp_path):
    r = CliRunner().invoke(main, ["probe", "--list"])
    assert r.exit_code == 0 and "chain_int8    Q1" in r.stdout
    r = CliRunner().invoke(main, ["probe", "--only", "nope", "-o", str(tmp_path / "x.json")])
    assert r.exit_code == 1 and "unknown probe(s) nope" in r.stderr


def test_a_board_that_breaks_int8_chains_is_reported():
    """If the board behaves like the simulator's conservative reading (int8
    chains refused/wrong), the probe says so instead of agreeing."""
    board = emulated(quirks_of=lambda h: DEFAULT)  # the "board" keeps rejecting chained int8
    result = run_probe(by_name("chain_int8"), board, sim)
    assert result.status == "npu-failed"
    assert "failed on the NPU" in result.detail
    assert result.conclusion.startswith("int8 chains are wrong on this board")


def test_wrong_values_are_reported_even_when_npu_and_simulator_agree():
    """Outputs that agree byte for byte between board and simulator but not
    with the exact product (here the decoded values are corrupted after the
    run) are still 'differ'."""
    probe = by_name("weight_reuse")
    result = run_probe(probe, emulated(), sim)
    assert result.status == "agree"
    wrong = dataclasses.replace(probe, program=lambda d: _corrupt(probe.program(d)))
    result = run_probe(wrong, emulated(), sim)
    assert result.status == "differ" and "values differ from the exact result" in result.detail


def _corrupt(run):
    for name, (got, want) in run.exact.items():
        run.exact[name] = (got + 1, want)
    return run


def test_differing_bytes_are_reported():
    """A probe whose board output differs from the simulator's."""
    def program(device):
        src, dst, rc = device.create_bo(4096), device.create_bo(4096), device.create_bo(4096)
        src.host[:64] = 3
        device.finish_cpu_access(src)
        task = put_task(rc, 0, task_entries(src.iova, dst.iova))
        device.finish_cpu_access(rc)
        device.run([Job([task], [src, rc], [dst], label="probe")])
        device.prepare_cpu_access(dst)
        return ProbeRun({"dst": dst.host[:64].tobytes()})

    probe = Probe("toy", "", "toy", {}, program, "same", "different")
    board = lambda h: RocketDevice(kernel=EmulatedKernel(STOCK, executor=IncrementExecutor()), quiet=True)
    model = lambda h: RocketDevice(kernel=EmulatedKernel(STOCK, executor=_Twice()), quiet=True)
    result = run_probe(probe, board, model)
    assert result.status == "differ"
    assert result.detail == "dst: 64 of 64 bytes differ (first at byte 0)"
    assert result.conclusion == "different"


class _Twice(IncrementExecutor):
    """Like IncrementExecutor, then adds one more to the destination."""

    def run_task(self, memory, iova, entries, irq_blocks=("DPU",)):
        super().run_task(memory, iova, entries, irq_blocks)
        from rkc.ir.npu.regcmd import decode
        dst = next(d.value for d in decode(entries) if d.register is not None and d.register.name ==
                   "DPU_DST_BASE_ADDR")
        data = bytes((b + 1) & 0xFF for b in memory.read(dst, 64))
        memory.write(dst, data)


def test_unavailable_and_skipped():
    def needs_more(device):
        raise ProbeUnavailable("needs something this build lacks")

    result = run_probe(Probe("x", "", "x", {}, needs_more, "", ""), emulated(), sim)
    assert result.status == "unavailable" and result.detail == "needs something this build lacks"
    result = run_probe(by_name("chain_fp16"), emulated(variant=STOCK), sim)
    assert result.status == "skipped" and "kernel/patches/0003" in result.detail


UNSIMULATED = [p for p in PROBES if not p.simulated]


def test_the_open_questions_have_probes():
    assert {(p.name, p.question) for p in UNSIMULATED} == {("lut_int8", "Q22"), ("deconv_x2", "Q24"),
                                                                ("argb_image", "Q26"), ("int8_fp16_out", "Q27")}


@pytest.mark.parametrize("probe", UNSIMULATED, ids=lambda p: p.name)
def test_a_probe_the_simulator_refuses_needs_a_board(probe):
    """Without an NPU the program is built, the simulator refuses it (the reading is
    open), and the report says a board must answer, not that the NPU failed."""
    with pytest.raises(SimError):
        probe.program(SimDevice(quirks=DEFAULT))
    result = run_probe(probe, emulated(), sim, npu_is_simulator=True)
    assert result.status == "sim-refused", result.detail
    assert result.detail.startswith("refused by the simulator: needs a board (")
    assert probe.question in result.detail


def _board_only(values):
    """A program the simulator refuses and a 'board' runs, giving `values` next to a reference."""
    def program(device):
        if isinstance(device, SimDevice):
            raise SimError("not modelled")
        return ProbeRun({"y": values.tobytes()}, close={"y": (values, np.arange(4.0), 1.0)})
    return Probe("toy", "Q0", "toy", {}, program, "same", "different", simulated=False)


def test_a_board_answers_a_probe_the_simulator_refuses():
    class Board:  # stands in for a board: the program only asks whether it runs on the simulator
        def close(self):
            pass

    board = lambda h: Board()
    result = run_probe(_board_only(np.arange(4.0) + 1), board, sim)
    assert (result.status, result.conclusion) == ("agree", "same")
    assert result.detail.startswith("the simulator refuses it (") and "not modelled" in result.detail
    assert result.outputs["y"]["sim_sha256"] is None
    result = run_probe(_board_only(np.arange(4.0) - 2), board, sim)
    assert (result.status, result.conclusion) == ("differ", "different")
    assert result.detail.startswith("y: 4 of 4 values further than 1 from the reference")


def test_lut_int8_constants_give_the_fp16_programs_result():
    """The int8 table program's constants (BN index multiplier, OUT_CVT) as the
    epilogue's model applies them: the same index the fp16 program computes, the
    entry requantized; against numpy's sigmoid within a step plus the table's error.
    And the fp16 half, which the simulator runs, matches numpy within the table's bound."""
    from rkc.compiler.npu import api, epilogue, lut

    rng = np.random.default_rng(3)
    acc = rng.integers(-12000, 12000, (16, 64))
    out_q = api.Quant(1 / 256, -128)
    req = epilogue.DpuRequest("int8", api.Feature("Y", 0, 16, 8, 8, "int8", out_q), 16, api.Quant(2.0 ** -4),
                              api.Quant(2.0 ** -6), np.zeros(16), api.Epilogue(activation="sigmoid"), integer_lut=True)
    plan = epilogue.plan(req)
    assert plan.lut_index == (1 << 14, 13)  # acc * 2^-10 real -> x 2048 index units: exactly 2 acc
    got = plan.apply(acc).astype(np.int64)
    want = np.rint(1 / (1 + np.exp(-acc * 2.0 ** -10)) * 256) - 128
    assert np.abs(got - np.clip(want, -128, 127)).max() <= 1
    with pytest.raises(Exception, match="LUT activations need fp16"):
        epilogue.plan(dataclasses.replace(req, integer_lut=False))
    # the fp16 program alone, on the simulator
    from rkc.compiler.npu.dispatch import emit
    from rkc.compiler.probe import emitted
    c, n = 32, 16
    x = rng.standard_normal((c, 4, 8)).astype(np.float16)
    wt = (rng.standard_normal((n, 1, 1, c)) / 4).astype(np.float16)
    X, Y = api.Feature("X", 0, c, 4, 8, "fp16"), api.Feature("Y", 0, n, 4, 8, "fp16")
    res = emit(api.Conv2D(X, wt, Y, epilogue=api.Epilogue(activation="sigmoid")), api.EmitOptions(cores=1))
    program = emitted.place([res], {"X": (X, x)}, "fp16")
    placed = emitted.run(SimDevice(), program, False)
    y = emitted.feature_values(Y, placed.read(program.handles["Y"])).astype(np.float64)
    ref = 1 / (1 + np.exp(-np.einsum("oc,chw->ohw", wt[:, 0, 0].astype(np.float64), x.astype(np.float64))))
    assert np.abs(y - ref).max() <= lut.plan("sigmoid").tolerance()


def test_deconv_x2_geometry_is_nearest_x2_over_the_zero_stuffed_map():
    """The deconvolution probe's reading, checked where the simulator can: the same
    2x2 convolution of ones over the explicitly zero-stuffed map (no DECONV) is
    numpy's nearest x2, so a board that zero-stuffs as read agrees with the reference."""
    from rkc.compiler.npu import api
    from rkc.compiler.npu.dispatch import emit
    from rkc.compiler.probe import emitted

    c, h, w = 32, 8, 8
    x = np.random.default_rng(4).standard_normal((c, h, w)).astype(np.float16)
    stuffed = np.zeros((c, 2 * h - 1, 2 * w - 1), np.float16)
    stuffed[:, ::2, ::2] = x
    S = api.Feature("X", 0, c, 2 * h - 1, 2 * w - 1, "fp16")
    Y = api.Feature("Y", 0, c, 2 * h, 2 * w, "fp16")
    res = emit(api.Conv2D(S, np.ones((2, 2, c), np.float16), Y, padding=(1, 1, 1, 1), depthwise=True),
               api.EmitOptions(cores=1))
    program = emitted.place([res], {"X": (S, stuffed)}, "stuffed")
    placed = emitted.run(SimDevice(), program, False)
    y = emitted.feature_values(Y, placed.read(program.handles["Y"]))
    np.testing.assert_array_equal(y, x.repeat(2, axis=1).repeat(2, axis=2))


def test_argb_image_packs_the_pixels_its_reference_program_convolves():
    """The packed-image probe hands its ARGB programs the image's pixels interleaved,
    3 values each, row after row (and zeros after them), and the simulator refuses
    the packed read with the question's name."""
    from rkc.compiler.probe import emitted, programs

    placed_cases = []
    real_run = emitted.run

    def keep(device, program, chained):
        placed_cases.append(program)
        return real_run(device, program, chained)

    c, h, w = 3, 8, 16
    x = programs._fp16((c, h, w), 21)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(emitted, "run", keep)
        with pytest.raises(SimError, match="Q26"):
            programs.argb_image(SimDevice(quirks=DEFAULT))
    (program,) = placed_cases
    for unit in ("bytes", "granules"):
        raw = np.frombuffer(program.case.contents[0][program.handles[f"P_{unit}"]], np.uint8)
        np.testing.assert_array_equal(raw[:c * h * w * 2].view(np.float16).reshape(h, w, c), x.transpose(1, 2, 0))
        assert not raw[c * h * w * 2:].any()


def test_gate_chain_product_reads_the_gate_the_first_task_wrote():
    """The simulator runs the squeeze-excite chain as the compiler emits it, and the
    product matches numpy's (the gate computed by the first task, not a stale buffer)."""
    run = by_name("gate_chain").program(sim({}))
    ((got, want, tolerance),) = run.close.values()
    assert np.abs(want).max() > 0.5 and np.all(np.abs(got - want) <= tolerance)


FP16_OUT_CASES = {"tiles": (300, 1000, 160, dict(cores=1, n_tile_max=64), 40), "cores": (64, 512, 384, dict(cores=3), 44)}


@pytest.mark.parametrize("case", FP16_OUT_CASES)
def test_int8_fp16_out_program_asks_for_fp16_beyond_one_tile(case):
    """Q27's program: several tasks (M and N tiles on one core; N over 3 cores), each
    fp16 task writing OUT_PRECISION 2 through the converter with the per-channel BS
    multiplier; the int32 twin runs on the simulator and is numpy's product; the
    epilogue's reading of the fp16 values, times the step, is the host's
    dequantization within the probe's stated bound; the fp16 tasks alone are refused
    with Q27's message."""
    from rkc.compiler.npu import api
    from rkc.compiler.npu.dispatch import emit
    from rkc.compiler.probe import emitted
    from rkc.compiler.probe.programs import _fp16_out_gemms
    from rkc.ir.npu.regcmd import decode

    m, k, n, options, salt = FP16_OUT_CASES[case]
    (i32, f16), inputs, (C32, C16), product, plan, scale, step = _fp16_out_gemms(
        f"t.{case}", m, k, n, api.EmitOptions(**options), salt)
    assert len(f16.tasks) >= 3
    for task in f16.tasks:
        regs = {d.register.name: d.fields for d in decode(task.regcmd) if d.register is not None}
        assert regs["DPU_DATA_FORMAT"]["OUT_PRECISION"] == 2 and regs["DPU_DATA_FORMAT"]["IN_PRECISION"] == 0
        assert regs["DPU_BS_OW_CFG"]["SIZE_E_0"] == 3 and regs["DPU_OUT_CVT_SCALE"]["FP32TOFP16_EN"] == 1
        assert regs["DPU_BS_MUL_CFG"]["BS_MUL_SRC"] == 1
    if case == "cores":
        assert len({job.lane for job in f16.jobs}) == 3
    program = emitted.place([i32], inputs, "i32")
    placed = emitted.run(SimDevice(), program, False)
    acc = emitted.feature_values(C32, placed.read(program.handles[C32.buffer]))[:, :m, 0].astype(np.int64)
    np.testing.assert_array_equal(acc.T, product)
    got = plan.apply(acc).astype(np.float64)
    assert np.abs(got).max() < 2048 and np.array_equal(got, np.rint(got))
    want = acc.T * scale
    bound = step * (0.5 + 2.0 ** -8) + 2.0 ** -8 * np.abs(want).max()
    err = np.abs(got.T * step - want).max()
    assert 0 < err <= bound
    with pytest.raises(SimError, match="Q27"):
        emitted.run(SimDevice(), emitted.place([f16], inputs, "f16"), False)
    with pytest.raises(Exception, match="cannot write fp16"):  # compiles never ask for it
        emit(api.Gemm(inputs[f"t.{case}.A"][0], np.zeros((k, n), np.int8), C16, m, api.Quant(0.01), name="u"),
             api.EmitOptions(**options))
