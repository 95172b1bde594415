"""The real 1-2B models' shapes (tests/llm/synth.py REAL: full widths, vocab
and metadata, random Q8_0 weights) cut to their first layer: compiled in int8
and fp16, a prefill chunk and decode tokens on the simulator against the numpy
reference of the architecture. Slow: each case compiles a 130-260k-row head."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from llm.conftest import cosine, teacher_forced
from llm.reference import ReferenceModel
from llm.synth import REAL, write_real
from llm.ties import NOISE, parting
from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf
from rkc.runtime.llm.engine import LlmEngine
from scratch import scratch_dir

CHUNK = 16
DECODE = 3


@dataclass
class RealModel:
    name: str
    gguf: Path
    rkbins: dict[str, Path]

    def rkbin(self, precision: str) -> Path:
        if precision not in self.rkbins:
            out = self.gguf.with_name(f"{self.name}-{precision}.rkbin")
            # unrotated: this checks the shapes, the K split and the architecture (rotation: test_rotation.py);
            # w8a8 in every program, the multi-row FFN too (not the default's fp16 copy: prefill_fp16.py)
            compile_gguf(self.gguf, out, LlmCompileOptions(precision, (1, CHUNK), 0.0, rounding="rtn",
                                                           fp16_share=0, alpha_search=False, rotation="none",
                                                           prefill_fp16="none"))
            self.rkbins[precision] = out
        return self.rkbins[precision]


@pytest.fixture(scope="module")
def real(request, tmp_path_factory) -> RealModel:
    """One model (the tests' indirect parameter): its GGUF, and its rkbins as
    they are asked for; pytest runs a model's tests together, and the files
    (up to 1.5 GB a model) go before the next model's."""
    d = scratch_dir(request, tmp_path_factory, "real")
    return RealModel(request.param, write_real(d / f"{request.param}.gguf", request.param, "q8_0", layers=1), {})


# Qwen3-1.7B's and Llama-3.2-1B's first layer in int8 part from the W8A8 reference
# over a teacher-forced sequence (measured: row 10 cosine 0.99981, row 15 0.99967
# < 0.9999): at rounding ties, a K or V entry within fp32 ulps of an fp16 edge
# that the runtime's fp32 and the reference's float64 round apart, then carried
# by the cache to the later rows and amplified by their int8 products.
# test_int8_parts_from_the_reference_only_at_rounding_ties holds every model's
# int8 arithmetic to the reference row by row instead.
AT_TIES = {("qwen3-1.7b", "int8"), ("llama-3.2-1b", "int8")}
CASES = [(m, p, a) for m in sorted(REAL) for p, a in (("int8", "w8a8"), ("fp16", "fp16")) if (m, p) not in AT_TIES]


@pytest.mark.slow
@pytest.mark.parametrize("real,precision,arith", CASES, indirect=["real"], scope="module")
def test_real_shapes_match_reference(real, precision, arith):
    model = real.name
    engine = LlmEngine(real.rkbin(precision))
    rng = np.random.default_rng(4)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, CHUNK + DECODE - 1).tolist()]
    got = teacher_forced(engine, tokens, CHUNK)  # a prefill chunk, then decode tokens
    ref = ReferenceModel.load(str(real.gguf), arith)
    ref.reset()
    want = ref.forward(tokens, 0)
    assert got.shape == want.shape == (len(tokens), REAL[model]["n_vocab"])
    for row in range(len(tokens)):
        cos = cosine(got[row], want[row])
        assert cos > 0.9999, f"row {row}: cosine {cos}"


@pytest.mark.slow
@pytest.mark.parametrize("real,precision", [(m, "int8") for m in sorted(REAL)], indirect=["real"], scope="module")
def test_int8_parts_from_the_reference_only_at_rounding_ties(real, precision, monkeypatch):
    """Decoded token by token, the reference fed the runtime's own fp16 KV
    entries: every int8 product input has the reference's codes and every own
    K/V entry its fp16 value, but where a value lies within fp32 ulps of the
    rounding edge; the rows without such a tie give the reference's logits to
    fp32 noise (tests/llm/ties.py). Measured: qwen3-1.7b 6 of 19 rows part at a
    K/V tie, the others' logits within 1.5e-7."""
    model = real.name
    engine = LlmEngine(real.rkbin(precision))
    rng = np.random.default_rng(4)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, CHUNK + DECODE - 1).tolist()]
    p = parting(engine, ReferenceModel.load(str(real.gguf), "w8a8"), tokens, monkeypatch)
    print(f"\n[{model}] {len(p.ties)} rows part at a tie: {p.ties}; the others' logits: max error {max(p.clean, default=0):.1e}")
    assert not p.departures, p.departures
    assert len(p.clean) >= len(tokens) // 2  # most rows hold no tie: a check on the logits themselves
    assert max(p.clean) < NOISE
