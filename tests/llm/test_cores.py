"""`rkc compile --cores N` for an LLM: every NPU task on lanes 0..N-1, the
logits unchanged against the numpy reference (the thresholds of
test_compiled_vs_reference.py), a one-core program modelled with nothing overlapping."""

from __future__ import annotations

import numpy as np
import pytest

from llm.conftest import cosine, teacher_forced
from llm.reference import ReferenceModel
from perf_agreement import assert_serial, lanes
from rkc.runtime.llm.engine import LlmEngine


@pytest.mark.parametrize("precision,arith,min_cos,max_rel", [("fp16", "fp16", 0.9999, 0.01),
                                                             ("int8", "w8a8", 0.9999, 0.02)])
@pytest.mark.parametrize("cores", [1, 2])
def test_llm_on_fewer_cores_matches_reference(cores, precision, arith, min_cos, max_rel, synth_rkbin, synth_gguf):
    # w8a8 in every program: the multi-row FFN int8 as decode's (not the default's fp16 copy)
    rtn = {"rounding": "rtn", "scales": "max", "fp16_share": 0, "rotation": "none",
           "prefill_fp16": "none"} if precision == "int8" else {}
    path = synth_rkbin("llama", precision, alpha=0.0, cores=cores, **rtn)
    assert max(lanes(path)) < cores
    engine = LlmEngine(path)
    rng = np.random.default_rng(1)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, 30).tolist()]
    got = teacher_forced(engine, tokens, 23)
    ref = ReferenceModel.load(str(synth_gguf("llama")), arith, (), "none")
    ref.reset()
    want = ref.forward(tokens, 0)
    for row in range(len(tokens)):
        assert cosine(got[row], want[row]) > min_cos, f"row {row}"
        assert np.abs(got[row] - want[row]).max() / np.abs(want[row]).max() < max_rel, f"row {row}"
    if cores == 1:
        assert_serial(path)


