"""Products with K above the NPU's 8192 input channels per task (Qwen2.5-1.5B's
ffn_down has K = 8960): split over K into GEMMs whose int32 / fp32 outputs the
CPU adds, checked end to end against the numpy reference of the architecture."""

from __future__ import annotations

import numpy as np
import pytest

from llm.conftest import cosine, teacher_forced
from llm.reference import ReferenceModel
from llm.synth import SHAPES, write_gguf
from rkc.compiler.emitter_graph import EMIT_OPTIONS
from rkc.compiler.npu.gemm import k_ranges
from rkc.runtime.llm.engine import LlmEngine
from scratch import scratch_dir

N_FF = 8960  # Qwen2.5-1.5B's intermediate size


def test_split_ranges_cover_k_on_weight_rows():
    for m, dtype in ((1, "int8"), (128, "int8"), (1, "fp16"), (128, "fp16")):
        parts = k_ranges(m, N_FF, 1536, dtype, EMIT_OPTIONS)
        assert len(parts) == 2 and sum(s for _, s in parts) == N_FF
        assert all(k0 % 32 == 0 and s <= EMIT_OPTIONS.k_tile_max for k0, s in parts)
        assert parts[1][0] == parts[0][1]
    assert k_ranges(1, 8192, 2048, "int8", EMIT_OPTIONS) == [(0, 8192)]


@pytest.fixture(scope="module")
def wide_ffn(request, tmp_path_factory):
    spec = {"arch": "qwen2", **SHAPES["qwen2"], "n_ff": N_FF, "n_layer": 1}
    return write_gguf(scratch_dir(request, tmp_path_factory, "wide") / "qwen2-wide-ffn.gguf", spec, "q8_0")


@pytest.mark.parametrize("precision,rotation,arith,min_cos", [
    # unrotated: one int8 code at a rounding tie moves with the host's float32 order (an AMD EPYC
    # without AVX-512 gave row 13 0.99987, stop 46's tree and this one alike, 2026-12-07)
    ("int8", "none", "w8a8", 0.9998),
    ("int8", "kron", "w8a8", 0.9999),  # the reference rotated as compiled (H140 (x) H64), split or not
    ("int8", "auto", "w8a8", 0.9999),  # the default: C35 (x) H256
    ("fp16", "none", "fp16", 0.9999)])
def test_wide_ffn_matches_reference(precision, rotation, arith, min_cos, wide_ffn, tmp_path):
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = tmp_path / f"wide-{precision}-{rotation}.rkbin"
    compile_gguf(wide_ffn, out, LlmCompileOptions(precision, (1, 16), 0.0, rounding="rtn",
                                                  fp16_share=0, alpha_search=False, rotation=rotation,
                                                  prefill_fp16="none"))  # int8's K split in every program
    engine = LlmEngine(out)
    rng = np.random.default_rng(3)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, 19).tolist()]
    got = teacher_forced(engine, tokens, 16)  # a prefill chunk, then decode tokens
    ref = ReferenceModel.load(str(wide_ffn), arith, (), rotation)
    ref.reset()
    want = ref.forward(tokens, 0)
    for row in range(len(tokens)):
        cos = cosine(got[row], want[row])
        assert cos > min_cos, f"row {row}: cosine {cos}"
    from rkc.ir.rkbin import read_rkbin

    decode = next(p for p in read_rkbin(out).module.programs if p.name == "decode")
    finish = [s for s in decode.steps if s.name == "from_npu:decode/blk.0.ffn_out"]
    assert len(finish) == 1 and len(finish[0].inputs) >= 2  # two K ranges, added on the CPU
    assert finish[0].op == ("DequantizeRows" if precision == "int8" else "SumPartials")
    if precision == "int8":  # the two ranges' sums read in the decode plan's fused residual stretch
        from llm.test_plan import plan_and_interpreter_logits

        engine = LlmEngine(out, device="null")
        labels = [getattr(c, "label", "") for c in engine.plans["decode"].calls]
        engine.close()
        assert sum(lab.startswith("residual stretch") for lab in labels) == 2, labels
        steps = [("decode", [t], i) for i, t in enumerate(tokens[:4])]  # one-row runs: test_plan's float32 bounds
        for planned, interpreted in plan_and_interpreter_logits(out, steps):
            np.testing.assert_allclose(planned, interpreted, rtol=0, atol=5e-3 * np.abs(interpreted).max())
            assert np.argmax(planned[-1]) == np.argmax(interpreted[-1])


def test_buffers_beyond_the_iova_window_are_refused_with_their_sizes():
    from rkc.compiler.module_builder import check_iova_window
    from rkc.ir.errors import UnsupportedError
    from rkc.ir.program import Region

    regions = [Region("weights", 3 << 30, "weights", "weights"), Region("host", 8 << 30, "host", "host"),
               Region("scratch", 1 << 30, "scratch")]
    with pytest.raises(UnsupportedError, match=r"need 4096 MiB \(weights 3072 MiB, scratch 1024 MiB\).*"
                                               r"smaller prefill chunks \(--prefill-chunks\)"):
        check_iova_window(regions)
    check_iova_window(regions[:2])  # host memory takes no IOVA space
