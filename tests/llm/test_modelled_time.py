"""`rkc inspect --json` on an LLM rkbin states, per decode token and per prefill
chunk, the modelled NPU time, tasks, kicks and DDR bytes the simulator reports
when the runtime runs that program (both apply ir/npu/perf.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.compiler.llm.report import figures
from rkc.ir.npu.perf import describe
from perf_agreement import assert_plan_matches_simulator, assert_same_totals, recorded_submits
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler


@pytest.mark.parametrize("arch,precision", [("gemma3", "fp16"), ("gemma3", "int8"), ("qwen2", "fp16")])
def test_decode_and_prefill_figures_are_the_simulators(arch, precision, synth_rkbin):
    engine = LlmEngine(synth_rkbin(arch, precision), device="sim")
    stated = figures(engine.model.rkbin.module)
    d = stated["decode"]
    phases = {"decode": (d["modelled_npu_s"], d["tasks_per_token"], d["kicks_per_token"], d["ddr_bytes_per_token"])}
    p = stated["prefill"]["16"]
    phases["prefill_16"] = (p["modelled_npu_s"], p["tasks"], p["kicks"], p["ddr_bytes"])
    dev = engine.device
    try:
        for program, (seconds, tasks, kicks, ddr) in phases.items():
            rows = engine.model.tensors[f"{program}/tokens"].shape[0]
            dev.reset_counters()
            with recorded_submits(dev) as subs:
                engine.run(program, np.arange(1, rows + 1, dtype=np.int32), np.arange(rows, dtype=np.int32),
                           engine.new_cache(64))
            assert_plan_matches_simulator(engine.programs[program].steps, subs, chaining=True)
            assert_same_totals(seconds, tasks, kicks, ddr, dev.counters)
    finally:
        engine.close()
    assert d["modelled_tokens_per_s"] == pytest.approx(1 / d["modelled_npu_s"])
    assert p["modelled_tokens_per_s"] == pytest.approx(16 / p["modelled_npu_s"])


def test_rkrun_timings_state_the_inspect_figures(synth_rkbin):
    """`rkrun -p` prints, per decode token, the modelled figures `rkc inspect` states."""
    engine = LlmEngine(synth_rkbin("qwen2", "fp16"), device="sim")
    try:
        gen = Generator(engine, 64)
        list(gen.generate([engine.tokenizer.bos_id, 5, 6], 4, Sampler(), stop_at_eos=False))
    finally:
        engine.close()
    d = figures(engine.model.rkbin.module)["decode"]
    t = gen.timings
    assert t.decode_runs == 3
    per_token = (t.decode_npu.seconds / 3, t.decode_npu.tasks / 3, t.decode_npu.kicks / 3, t.decode_npu.ddr_bytes / 3)
    assert per_token == pytest.approx((d["modelled_npu_s"], d["tasks_per_token"], d["kicks_per_token"],
                                       d["ddr_bytes_per_token"]), rel=1e-9)
    stated = describe(d["modelled_npu_s"] * 3, d["tasks_per_token"] * 3, d["kicks_per_token"] * 3,
                      d["ddr_bytes_per_token"] * 3, True)
    assert f"decode: {stated} for 3 tokens" in "\n".join(t.lines())


def test_decode_segment_breakdown_adds_up_to_the_stated_decode(synth_rkbin):
    """bench/decode_segments.py's rows (one per decode segment) sum to the decode
    time and DDR bytes `rkc inspect --json` states, and no segment models faster
    than its bytes at the DRAM bandwidth."""
    import importlib.util
    from pathlib import Path

    from rkc.ir.rkbin import read_rkbin

    path = Path(__file__).resolve().parents[2] / "bench" / "decode_segments.py"
    spec = importlib.util.spec_from_file_location("decode_segments", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    module = read_rkbin(synth_rkbin("gemma3", "int8")).module
    d = figures(module)["decode"]
    rows = bench.rows(module)
    assert len(rows) == d["segments_per_token"] and sum(r["tasks"] for r in rows) == d["tasks_per_token"]
    assert sum(r["modelled_s"] for r in rows) == pytest.approx(d["modelled_npu_s"], rel=1e-12)
    assert sum(sum(r["lane_bytes"]) for r in rows) == d["ddr_bytes_per_token"]
    assert all(r["modelled_s"] >= r["dram_s"] * (1 - 1e-12) for r in rows)
