"""rkc inspect on what an LLM decode leaves on the CPU (compiler/llm/cpu_work.py):
every CPU op of every architecture's decode has its recorded reason, the host
time is the measured per-call costs times this program's calls, and the
verdict against the CPU decode follows the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm.conftest import ARCHS
from rkc.compiler.llm.cpu_work import BRACKET, SUBMIT, WHY_ON_CPU, HostCosts, cpu_lines, cpu_ops, stretches
from rkc.compiler.llm.report import figures
from rkc.ir.llm import DECODE
from rkc.ir.rkbin import read_rkbin

RKC = Path(sys.executable).parent / "rkc"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_cpu_op_of_a_decode_has_its_reason(arch, synth_rkbin):
    program = read_rkbin(synth_rkbin(arch, "int8")).module.program(DECODE)
    assert set(cpu_ops(program)) <= set(WHY_ON_CPU)


def test_host_time_and_verdict_follow_the_measured_costs(synth_rkbin):
    module = read_rkbin(synth_rkbin("gemma3", "int8")).module
    program = module.program(DECODE)
    npu_s = figures(module)["decode"]["modelled_npu_s"]
    counts = cpu_ops(program)
    segments = sum(1 for s in program.steps if s.kind == "npu")
    per_call = {op: 10.0 for op in counts} | {SUBMIT: 2.0, BRACKET: 1.0}
    host, missing = HostCosts(per_call, 1.0, "test").host_s(program)
    assert not missing
    assert host == pytest.approx((10 * sum(counts.values()) + 2 * segments + 2 * stretches(program)) * 1e-6)
    beats = cpu_lines(program, npu_s, HostCosts(per_call, npu_s + host + 1e-3, "test"))[-1]
    assert "beats" in beats and "cannot" not in beats
    loses = cpu_lines(program, npu_s, HostCosts(per_call, npu_s + host / 2, "test"))[-1]
    assert "does not beat" in loses
    never = cpu_lines(program, npu_s, HostCosts(per_call, npu_s / 2, "test"))[-1]
    assert "cannot beat" in never
    partial = cpu_lines(program, npu_s, HostCosts({SUBMIT: 2.0}, 1.0, "test"))
    assert any("no cost for" in line and "RMSNorm" in line for line in partial)


def test_inspect_reads_a_host_costs_file_and_refuses_a_bad_one(synth_rkbin, tmp_path):
    rkbin = synth_rkbin("gemma3", "int8")
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"model": "m", "host_costs": {"int8": {
        "us_per_call": {op: 5.0 for op in WHY_ON_CPU} | {SUBMIT: 3.0, BRACKET: 2.0}, "cpu_decode_s": 1e-6}}}))
    run = subprocess.run([str(RKC), "inspect", str(rkbin), "--host-costs", str(costs)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "hard:" in run.stdout and "cannot beat the CPU decode" in run.stdout
    costs.write_text(json.dumps({"host_costs": {"fp16": {}}}))
    run = subprocess.run([str(RKC), "inspect", str(rkbin), "--host-costs", str(costs)], capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "int8" in run.stderr


def test_compile_log_counts_the_cpu_steps_inspect_counts(synth_gguf, tmp_path):
    """One count of a program's CPU steps (cpu_work.cpu_steps): the compile
    log's decode and prefill lines say what `rkc inspect` says (the log once
    counted only graph ops, 291 for Gemma 3 270M's decode against inspect's 491)."""
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = tmp_path / "g.rkbin"
    report = compile_gguf(synth_gguf("gemma3"), out, LlmCompileOptions("int8", (1, 4)))
    fig = figures(read_rkbin(out).module)
    log = "\n".join(report.lines)
    assert f"{fig['decode']['cpu_steps_per_token']} CPU steps per token" in log
    assert f"prefill_4: {fig['prefill']['4']['segments']} NPU segments" in log
    assert f"{fig['prefill']['4']['cpu_steps']} CPU steps" in log.split("prefill_4:")[1].splitlines()[0]


def test_prefill_verdict_follows_the_measured_chunk_times(synth_rkbin, tmp_path):
    """A chunk's measured host time against its modelled NPU time: within the
    10 % target or above it (the host then sets the pace); chunks the costs
    file did not time are not judged; rkc inspect prints the verdicts."""
    from rkc.compiler.llm.cpu_work import PREFILL_HOST_SHARE, prefill_lines

    rkbin = synth_rkbin("gemma3", "int8")
    prefill = figures(read_rkbin(rkbin).module)["prefill"]
    npu4 = prefill["4"]["modelled_npu_s"]
    fast = prefill_lines(prefill, HostCosts({}, 1.0, "t", {4: npu4 * PREFILL_HOST_SHARE * 0.9}))
    slow = prefill_lines(prefill, HostCosts({}, 1.0, "t", {4: npu4 * 3}))
    assert len(fast) == len(slow) == 1 and "prefill 4:" in fast[0]
    assert "within the 10% target" in fast[0] and "0.1x" in fast[0]
    assert "above the 10% target" in slow[0] and "3.0x" in slow[0]
    assert f"{4 / (npu4 * 4):.0f} tokens/s against the NPU's {4 / npu4:.0f}" in slow[0]
    assert prefill_lines(prefill, HostCosts({}, 1.0, "t")) == []
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"model": "m", "host_costs": {"int8": {
        "us_per_call": {SUBMIT: 3.0}, "cpu_decode_s": 1.0, "prefill_host_s": {"4": npu4 * 3, "512": 1.0}}}}))
    run = subprocess.run([str(RKC), "inspect", str(rkbin), "--host-costs", str(costs)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "prefill 4: host" in run.stdout and "above the 10% target" in run.stdout
    assert "prefill 512: host" not in run.stdout  # the file has no such chunk
    costs.write_text(json.dumps({"host_costs": {"int8": {"us_per_call": {}, "cpu_decode_s": 1.0,
                                                         "prefill_host_s": [1]}}}))
    run = subprocess.run([str(RKC), "inspect", str(rkbin), "--host-costs", str(costs)], capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
