"""The prepared execution plans (runtime/plan.py) give the logits of the
step-by-step interpreter (runtime/execute.py), on the simulator: prefill
chunks, a padded chunk, decode steps past a sliding window, every
architecture, both precisions. int8 plans compute bit for bit what the
interpreter computes; fp16 plans may differ in the last bit of an fp32
reduction (the interpreter hands norms strided arrays, whose sums numpy
orders differently), nothing more."""

from __future__ import annotations

import numpy as np
import pytest

from llm.conftest import ARCHS
from rkc.runtime.llm.engine import LlmEngine


def plan_and_interpreter_logits(path, steps):
    """steps: (program, tokens, first position); both engines on the simulator."""
    planned, interpreted = LlmEngine(path, device="sim"), LlmEngine(path, device="sim")
    cp, ci = planned.new_cache(64), interpreted.new_cache(64)
    out = []
    for program, tokens, start in steps:
        tokens = np.asarray(tokens, np.int32)
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        out.append((planned.run(program, tokens, pos, cp), interpreted.run_interpreted(program, tokens, pos, ci)))
    planned.close()
    interpreted.close()
    return out


# a whole chunk, a padded one, decode steps past gemma3's window of 6
STEPS = [("prefill_4", [5, 6, 7, 8], 0), ("prefill_4", [7, 8, 9], 4), *[("decode", [30 + i], 7 + i) for i in range(3)]]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_gives_the_interpreters_logits(arch, precision, synth_rkbin):
    for got, want in plan_and_interpreter_logits(synth_rkbin(arch, precision), STEPS):
        assert got.shape == want.shape and np.isfinite(want).all()
        if precision == "int8":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
            assert np.argmax(got[-1]) == np.argmax(want[-1])


def test_plan_outputs_survive_the_next_run(synth_rkbin):
    """The logits a run returns are not overwritten by the run after it."""
    engine = LlmEngine(synth_rkbin("llama", "fp16"), device="sim")
    cache = engine.new_cache(32)
    first = engine.run("decode", np.asarray([5], np.int32), np.asarray([0], np.int32), cache)
    kept = first.copy()
    engine.run("decode", np.asarray([9], np.int32), np.asarray([1], np.int32), cache)
    np.testing.assert_array_equal(first, kept)
