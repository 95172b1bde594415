"""A tiny synthetic model per architecture, compiled (fp16 and int8) and run by
the LLM runtime, against the plain numpy reference of tests/llm/reference.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm.conftest import ARCHS, cosine as _cosine, emulated_logits, emulation, teacher_forced as _teacher_forced
from llm.reference import ReferenceModel
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler, chunk_plan

PROMPT_LEN = 23  # crosses the gemma3 sliding window (6) and uses chunks 16 + 4 + a padded 4


@pytest.fixture(scope="module")
def references(synth_gguf):
    return {a: ReferenceModel.load(str(synth_gguf(a))) for a in ARCHS}


RTN = {"rounding": "rtn", "scales": "max", "fp16_share": 0, "rotation": "none"}  # the reference's own int8 weights
# (compiled precision, SmoothQuant alpha, products kept fp16, reference arithmetic, min cosine, max rel. error)
CASES = [
    ("fp16", 0.0, (), "fp16", 0.9999, 0.01),  # the NPU's fp16 products, as numpy computes them
    ("int8", 0.0, (), "w8a8", 0.9999, 0.02),  # W8A8 as defined (int8 per channel / per token, int32 sums)
    # rotated W8A8: inputs and weight rows rotated (x R, W R) before int8
    ("int8", 0.0, (), "w8a8+kron", 0.9999, 0.02),
    ("int8", 0.0, (), "w8a8+block", 0.9999, 0.02),
    # every int8 input quantized as two int8 rows (value + residual): --int8-residual all
    ("int8", 0.0, (), "w8a8+kron+all", 0.9999, 0.02),
    # hybrid: ffn_down in fp16 (its fp16 outputs move later int8 roundings a step now and then)
    ("int8", 0.0, ("ffn_down",), "w8a8", 0.9995, 0.05),
    ("fp16", 0.0, (), "exact", 0.9999, 0.02),  # and all close to the exact float64 model
    ("int8", 0.0, (), "exact", 0.98, 0.25),
    ("int8", 0.5, ("ffn_down",), "exact", 0.98, 0.25),  # SmoothQuant keeps the model equivalent
]


@pytest.mark.parametrize("precision,alpha,keep,arith,min_cos,max_rel", CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_reference(arch, precision, alpha, keep, arith, min_cos, max_rel, synth_rkbin, synth_gguf):
    arith, rotation, residual = (arith.split("+") + ["none", "none"])[:3]
    # w8a8 in every program: the multi-row products int8 too, not the default's fp16 copy (prefill_fp16.py)
    rtn = RTN | {"rotation": rotation, "prefill_fp16": "none"} | ({"residual": residual} if residual != "none" else {})
    engine = LlmEngine(synth_rkbin(arch, precision, alpha=alpha, keep=keep, **(rtn if arith == "w8a8" else {})))
    rng = np.random.default_rng(1)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, PROMPT_LEN + 8 - 1).tolist()]
    got = _teacher_forced(engine, tokens, PROMPT_LEN)
    ref = ReferenceModel.load(str(synth_gguf(arch)), arith, keep, rotation, residual)
    ref.reset()
    want = ref.forward(tokens, 0)
    assert got.shape == want.shape == (len(tokens), engine.cfg.n_vocab)
    for row in range(len(tokens)):
        assert _cosine(got[row], want[row]) > min_cos, f"row {row}"
        err = np.abs(got[row] - want[row]).max() / np.abs(want[row]).max()
        assert err < max_rel, f"row {row}: relative error {err:.4f}"


# every int8 option once, the multi-row FFN int8 as decode's (its bits up to drift), and the default scheme
# per architecture, whose multi-row programs read the FFN's fp16 copy (compiler/llm/prefill_fp16.py)
INT8_FFN = {"prefill_fp16": "none"}
EMULATED = [(a, INT8_FFN) for a in ARCHS] + [
    ("gemma3", {"rounding": "gptq", "scales": "mse", "fp16_share": 0.25, "alpha_search": True, **INT8_FFN}),
    ("gemma3", {"rotation": "none", "smooth_alpha": 0.0, **INT8_FFN}),  # differed by 0.3 % of a row's max logit
    ("gemma3", {"residual": "all", **INT8_FFN}),  # two int8 rows per input row, summed by DequantizeRows
    ("qwen2", {"rotation": "none", **INT8_FFN}),  # biases: added before the one rounding to fp32 (DequantizeRows)
    ("llama", {"rounding": "rtn", "fp16_share": 0, "alpha_search": False, **INT8_FFN})] + [(a, {}) for a in ARCHS]


@pytest.mark.parametrize("arch,options", EMULATED)
def test_int8_rkbin_computes_its_cpu_emulation(arch, options, synth_rkbin, synth_gguf):
    """What tools/llm_quant_eval.py emulates on the CPU (the compiler's own weight
    preparation, run with the runtime's int8 arithmetic) is what the rkbin computes."""
    from rkc.ir.rkbin import read_rkbin

    path = synth_rkbin(arch, "int8", **options)
    engine = LlmEngine(path)
    runner, matrices, report = emulation(synth_gguf(arch), engine.tokenizer, **options)
    assert read_rkbin(path).module.metadata["quantization"] == json.loads(json.dumps(report.quantization))
    if options.get("fp16_share"):
        assert any(e.scale is None for e in matrices.values())
        assert any("hybrid" in line for line in report.lines)
    rng = np.random.default_rng(2)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, PROMPT_LEN + 4 - 1).tolist()]
    got = _teacher_forced(engine, tokens, PROMPT_LEN)
    want = emulated_logits(runner, tokens, PROMPT_LEN, engine.chunks, engine.npu_seconds(True))
    # The runtime's fused float32 host kernels (prefill's FFN and residual stretches, attention) sum in other
    # orders than the emulation's step-by-step kernels, and a hybrid's fp16 GEMM than BLAS: now and then an
    # int8 activation moves a rounding step, which moves later rows a little (measured: 1e-5..1e-4 in
    # 1 - cosine at the worst row; docs/llm.md, the drift). A hybrid (fp16_share) moves more, its fp16
    # products rounded otherwise on the NPU than in the emulation: medians 0 to 8.8e-6 over runs (2026-12-06).
    # Without the rotation a row keeps its outlier channels, so its int8 scale follows one value and a
    # last-bit change there (the residual stretch's float64 sum of squares against the emulation's
    # float32 pairwise one) moves every code of the row: median 2.5e-5 (2026-12-06)
    cos = np.array([_cosine(got[r], want[r]) for r in range(len(tokens))])
    assert cos.min() > 0.999, cos
    # The multi-row programs' FFN in fp16 (the default, compiler/llm/prefill_fp16.py) computes its activation
    # from the NPU's table (~1e-3 absolute, ffn_fusion.py), the emulation in float32: medians 2.4e-5 (gemma3)
    # and 6.5e-5 (llama, SiLU), 2026-12-06
    drift = 2e-5 if options.get("fp16_share") else 5e-5 if options.get("rotation") == "none" else \
        1e-6 if options.get("prefill_fp16") == "int8" else 1.5e-4
    assert np.median(1 - cos) < drift, cos


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_matches_reference(arch, synth_rkbin, references):
    engine = LlmEngine(synth_rkbin(arch, "fp16"))
    prompt = engine.tokenizer.encode("the cat and the dog run")
    got = list(Generator(engine, 64).generate(prompt, 12, Sampler(0.0), stop_at_eos=False))
    assert got == references[arch].greedy(prompt, 12)


def test_chunking_does_not_change_the_numbers(synth_rkbin):
    """Prefill in chunks of 16/4/1 and one token at a time give the same logits."""
    a = LlmEngine(synth_rkbin("gemma3", "fp16", (1, 4, 16)))
    b = LlmEngine(synth_rkbin("gemma3", "fp16", (1,)))
    tokens = list(range(2, 2 + PROMPT_LEN))
    la = Generator(a, 64)._forward(tokens, 0, all_logits=True)
    lb = Generator(b, 64)._forward(tokens, 0, all_logits=True)
    # only float rounding differs (BLAS blocking, fp16 casts of values near a rounding edge)
    np.testing.assert_allclose(la, lb, rtol=1e-3, atol=2e-2)


def test_chunk_plan():
    assert chunk_plan(23, [1, 4, 16]) == [(16, 16), (4, 4), (4, 3)]
    assert chunk_plan(17, [1, 4, 16]) == [(16, 16), (1, 1)]
    assert chunk_plan(0, [1, 32]) == []
    assert chunk_plan(6, [1, 32]) == [(32, 6)]
    assert sum(n for _, n in chunk_plan(1000, [1, 32, 128, 512])) == 1000


def _npu_cost(plan, npu_s) -> float:
    return sum(npu_s[c] for c, _ in plan)


def test_chunk_plan_by_the_npu_figures():
    """With each run's modelled NPU time the plan costs the NPU least (pad rows
    cost the host nothing): Gemma 3 270M int8's figures (ms) put 200 tokens
    in 128 + 72 padded in a 128, not 128 + 32 + 32 + 8 padded in a 32."""
    gemma = {1: 12.94, 32: 13.66, 128: 16.04, 512: 36.31}
    assert chunk_plan(200, [1, 32, 128, 512], gemma) == [(128, 128), (128, 72)]
    assert chunk_plan(130, [1, 32, 128, 512], gemma) == [(128, 128), (32, 2)]  # not 512 rows for 130
    assert chunk_plan(1, [1, 32, 128, 512], gemma) == [(1, 1)]
    assert chunk_plan(200, [1, 32, 128, 512], {1: 12.94, 32: 13.66}) == chunk_plan(200, [1, 32, 128, 512])


def _cheapest(n: int, sizes: list[int], npu_s: dict, memo: dict) -> float:
    """The least NPU cost of whole runs then at most one padded run, by search over every first run."""
    if n == 0:
        return 0.0
    if n not in memo:
        memo[n] = min(npu_s[s] + (_cheapest(n - s, sizes, npu_s, memo) if s <= n else 0.0) for s in sizes)
    return memo[n]


@pytest.mark.parametrize("seed", range(4))
def test_chunk_plan_by_figures_is_the_cheapest(seed):
    rng = np.random.default_rng(seed)
    sizes = [1, 4, 16]
    npu_s = {s: float(c) for s, c in zip(sizes, np.sort(rng.random(3) * 10 + 1))}  # more rows cost more
    for n in range(1, 41):
        plan = chunk_plan(n, sizes, npu_s)
        assert sum(t for _, t in plan) == n and all(c in sizes and 0 < t <= c for c, t in plan)
        assert all(t == c for c, t in plan[:-1])  # only the last run is padded
        assert _npu_cost(plan, npu_s) == pytest.approx(_cheapest(n, sizes, npu_s, {}))
        assert _npu_cost(plan, npu_s) <= _npu_cost(chunk_plan(n, sizes), npu_s) + 1e-9


def test_chunk_plan_merges_two_runs_into_one_of_no_more_rows():
    assert chunk_plan(35, [1, 32, 64]) == [(64, 35)]  # not 32 + 3 padded to 32
    assert chunk_plan(106, [1, 32, 64, 128]) == [(128, 106)]  # not 64 + 32 + 10 padded to 32
    assert chunk_plan(437, [1, 32, 64, 128, 512]) == [(128, 128)] * 3 + [(64, 53)]
    # 128 + 116 padded to 128 compute 256 rows: no 256-row program, and the 512-row one computes more
    assert chunk_plan(500, [1, 32, 64, 128, 512]) == [(128, 128)] * 3 + [(128, 116)]
    assert chunk_plan(33, [1, 32, 64]) == [(32, 32), (1, 1)]  # 64 rows would be more than 33
    for chunks in ([1, 32, 64, 128, 512], [1, 4, 16], [1, 8, 16, 32, 128, 512]):
        for n in range(1, 1100):
            plan = chunk_plan(n, chunks)
            assert sum(t for _, t in plan) == n and all(c in chunks and 0 < t <= c for c, t in plan)
            assert all(t == c for c, t in plan[:-1])  # only the last run is padded


def test_perplexity_counts_every_token_but_bos_once(synth_rkbin, references):
    engine = LlmEngine(synth_rkbin("llama", "fp16"))
    tokens = engine.tokenizer.encode("the cat and the dog run in the world at one time " * 3)
    ctx = 8
    ppl, n = Generator(engine, ctx + 1).perplexity(tokens, ctx)
    assert n == len(tokens) - 1
    # the same windows with the numpy reference
    ref = references["llama"]
    nll = 0.0
    for s in range(0, len(tokens), ctx):
        window = tokens[s:s + ctx] if s == 0 else [tokens[0], *tokens[s:s + ctx]]
        if len(window) < 2:
            continue
        ref.reset()
        logits = ref.forward(window[:-1], 0)
        logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
            - logits.max(1, keepdims=True)
        nll -= logp[np.arange(len(window) - 1), window[1:]].sum()
    assert ppl == pytest.approx(np.exp(nll / n), rel=1e-3)


def test_sampler():
    logits = np.array([0.0, 3.0, 1.0, 2.9])
    assert Sampler(0.0)(logits) == 1
    assert Sampler(1.0, top_k=1, seed=3)(logits) == 1
    draws = [Sampler(1.0, top_k=0, top_p=1.0, seed=s)(logits) for s in range(200)]
    assert set(draws) == {0, 1, 2, 3}
    assert [Sampler(0.7, seed=5)(logits) for _ in range(3)] == [Sampler(0.7, seed=5)(logits) for _ in range(3)]
    # top-p 0.5 keeps only the two near-equal leaders
    assert {Sampler(1.0, top_k=0, top_p=0.5, seed=s)(logits) for s in range(100)} == {1, 3}
    # a temperature so small that logits / t overflows (5e-324, valid for the API) draws the leader, no NaN
    for t in (5e-324, 1e-308):
        assert {Sampler(t, top_k=0, top_p=1.0, seed=s)(logits) for s in range(20)} == {1}


def test_inspect_says_how_int8_was_made(synth_rkbin):
    from rkc.compiler.llm.report import figures, summary_lines
    from rkc.ir.rkbin import read_rkbin

    default_module = read_rkbin(synth_rkbin("gemma3", "int8")).module
    default = figures(default_module)["quantization"]
    assert default["rotation"] == "auto" and default["rounding"] == "rtn" and not default.get("hybrid")
    assert "rtn rounding" in "\n".join(summary_lines(default_module))
    # a GPTQ build with a measured fp16 hybrid says so too
    module = read_rkbin(synth_rkbin("gemma3", "int8", rounding="gptq", fp16_share=0.25)).module
    q = figures(module)["quantization"]
    assert q["rounding"] == "gptq" and q["hybrid"]["products"]
    text = "\n".join(summary_lines(module))
    assert "gptq rounding" in text and "kept fp16" in text
    assert q["hybrid"]["products"][0].removesuffix(".weight") in text
    assert figures(read_rkbin(synth_rkbin("gemma3", "fp16")).module)["quantization"] == {}
