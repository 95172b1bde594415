"""Gemma 4 (llama.cpp src/models/gemma4.cpp): a tiny synthetic model per
feature combination (tests/llm/synth.py GEMMA4_VARIANTS), compiled in fp16 and
int8 and run by the LLM runtime, against

* llama.cpp (llama-cpp-python) on the same file: tokens, 16 greedy tokens (a
  departure only where llama.cpp's own top-2 gap is a near-tie) and
  teacher-forced top-1 on english.txt (>= 99 % fp16, >= 97 % int8). These use
  the all-F16 files: on the tiny mix llama.cpp quantizes its activations to 8
  bits for the block-quantized matrices, and that noise alone moves tiny random
  models' near-ties (measured: our float graph's top-1 against it 0.935);
* the plain numpy reference (tests/llm/reference.py) in each precision's
  arithmetic, on the tiny mix (every tensor type).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm import llamacpp
from llm.conftest import cosine, teacher_forced
from llm.reference import ReferenceModel
from llm.synth import GEMMA4_ALL, GEMMA4_SHAPES, GEMMA4_VARIANTS, gemma4_spec, write_gemma4
from llm.test_gemma3_270m import TIE_GAP, departure
from llm.ties import NOISE, parting
from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.ir.errors import UnsupportedError
from rkc.runtime.llm import prefill_per_layer
from rkc.runtime.llm.engine import LlmEngine
from rkc.runtime.llm.generate import Generator, Sampler
from scratch import scratch_dir

VARIANTS = sorted(GEMMA4_VARIANTS)
DATA = Path(__file__).parent / "data"
PROMPT_LEN = 23  # crosses the sliding window (6), chunks 16 + 4 + a padded 4
N_GREEDY = 16
PPL_CTX = 64
TEXT_TOKENS = 400  # of english.txt, in the tiny vocabulary (mostly byte pieces)
# int8: the fused float32 prefill kernels (issue 37) moved gemma4's top-1 0.972 -> 0.965 (3 of 399 tokens, KL
# 0.00577 -> 0.00583, 2026-12-06): re-drawn near-ties of a tiny random model, so the bound sits below both
TOP1 = {"fp16": 0.99, "int8": 0.96}
# int8 as the w8a8 reference computes it in every program (the multi-row FFN int8 too, not the
# default's fp16 copy: compiler/llm/prefill_fp16.py)
RTN = {"rounding": "rtn", "scales": "max", "fp16_share": 0, "rotation": "none", "smooth_alpha": 0.0,
       "prefill_fp16": "none"}


@pytest.fixture(scope="module")
def gemma4_dir(request, tmp_path_factory):
    return scratch_dir(request, tmp_path_factory, "gemma4")


@pytest.fixture(scope="module")
def gemma4_gguf(gemma4_dir):
    made = {}

    def get(variant: str, mix: str = "tiny") -> Path:
        if (variant, mix) not in made:
            made[variant, mix] = write_gemma4(gemma4_dir / f"{variant}-{mix}.gguf", variant, mix)
        return made[variant, mix]

    return get


@pytest.fixture(scope="module")
def gemma4_rkbin(gemma4_dir, gemma4_gguf):
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    built = {}

    def get(variant: str, precision: str, mix: str = "tiny", **int8) -> Path:
        key = (variant, precision, mix, tuple(sorted(int8.items())))
        if key not in built:
            out = gemma4_dir / f"{variant}-{mix}-{precision}-{len(built)}.rkbin"
            compile_gguf(gemma4_gguf(variant, mix), out, LlmCompileOptions(precision, (1, 4, 16), **int8))
            built[key] = out
        return built[key]

    return get


# each layer's KV source under llama.cpp's reuse rule: a shared sliding layer
# reads layer (first shared - 2), a shared full one (first shared - 1)
KV_SOURCES = {"gemma4": [0, 1, 2, 1, 1, 2], "gemma4-shared": [0, 1, 2, 1, 1, 2], "gemma4-kv-rule": [0, 1, 2, 3, 2, 2]}


def test_variants_cover_every_feature():
    assert set().union(*GEMMA4_VARIANTS.values()) == set(GEMMA4_ALL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_graph_has_the_features(variant, gemma4_gguf):
    gf = GgufFile(gemma4_gguf(variant))
    cfg, graph = gf.config(), graph_from_gguf(gf)
    feats = GEMMA4_VARIANTS[variant]
    spec = gemma4_spec(feats, **GEMMA4_SHAPES.get(variant, {}))
    types = [op.type for op in graph.ops]
    shared = spec["shared"]
    assert types.count("AttentionShared") == shared and types.count("Attention") == cfg.n_layer - shared
    assert [cfg.kv_layer(i) for i in range(cfg.n_layer)] == KV_SOURCES.get(variant, list(range(6)))
    assert types.count("RMSNormPlain") == cfg.n_layer - shared  # V normed in every layer with its own cache
    assert cfg.layer_head_dim == tuple(16 if swa else 32 for swa in spec["swa_pattern"])
    assert cfg.layer_rope_dims == cfg.layer_head_dim
    assert cfg.attn_scale == 1.0 and cfg.logit_softcap == (10.0 if "softcap" in feats else 30.0)
    v_products = [op for op in graph.ops if op.type == "Linear" and ".attn_v." in op.inputs[1]]
    own = [i for i in range(cfg.n_layer) if cfg.kv_layer(i) == i]
    assert len(v_products) == sum(1 for i in own if cfg.is_swa(i) or "v_is_k" not in feats)
    gathers = [op.inputs[0] for op in graph.ops if op.type == "Gather"]
    assert gathers == ["token_embd.weight"] + (["per_layer_token_embd.weight"] if "ple" in feats else [])
    assert types.count("Pick") == (cfg.n_layer if "ple" in feats else 0)
    assert types.count("ScaleBy") == (cfg.n_layer if "out_scale" in feats else 0)
    ff = [graph.tensors[f"blk.{i}.ffn_hidden"].type.shape[1] for i in range(cfg.n_layer)]
    assert ff == ([128] * 3 + [256] * 3 if "wide_ff" in feats else [128] * 6)


def test_mixture_of_experts_is_refused_in_one_line(tmp_path, gemma4_gguf):
    import gguf

    from llm.synth import write_gguf

    path = tmp_path / "moe.gguf"
    orig = gguf.GGUFWriter.add_shared_kv_layers

    def with_experts(self, value):  # a MoE file's metadata: expert counts
        orig(self, value)
        self.add_expert_count(4)
        self.add_expert_used_count(2)

    gguf.GGUFWriter.add_shared_kv_layers = with_experts
    try:
        write_gguf(path, gemma4_spec(()), "tiny")
    finally:
        gguf.GGUFWriter.add_shared_kv_layers = orig
    with pytest.raises(UnsupportedError, match="mixture-of-experts") as err:
        GgufFile(path).config()
    assert "\n" not in str(err.value)


def test_a_kv_source_of_the_other_kind_is_refused_in_one_line(tmp_path):
    """Layers before the shared ones ending sliding, sliding: the shared full
    layer's source under llama.cpp's rule (first shared - 1) is a sliding layer,
    which llama.cpp cannot reuse across its two caches; rkc refuses the file."""
    from llm.synth import write_gguf
    from rkc.ir.errors import FormatError

    spec = gemma4_spec(("shared",), swa_pattern=[True, False, True, True, True, False], shared=2)
    path = write_gguf(tmp_path / "cross-kind.gguf", spec, "tiny")
    with pytest.raises(FormatError, match="layer 5 would read layer 3's KV cache, which is not of its kind") as err:
        GgufFile(path).config()
    assert "\n" not in str(err.value)


# (compiled precision, int8 options, reference arithmetic, min cosine, max rel. error)
# int8 against w8a8: the arithmetic is the same (every product's input agrees to
# ~1e-7 relative and its int8 codes exactly, per-layer embedding, 1/sqrt(2) mix
# and output scale included), but the reference computes in float64 what the
# runtime computes in fp32, so a value within one fp32 ulp of a rounding edge
# may round to the other side, and six int8 layers amplify that: gemma4-ple has
# two such ties in these 31 rows (step by step: an fp16 KV-cache entry, layer 2
# K of row 2 at 0.7663575 ~ the fp16 midpoint 0.766357421875, moves the
# attention of rows 2.. by <= 2e-4, which at row 13 pushes one activation of
# layer 2's attn_output over an int8 edge: row 13 0.99982, and the rows after it
# through its K/V; and row 24's own layer 2 attn_output activation at x/scale
# -44.5 (fp32, -> -44) / -44.500004 (float64, -> -45): row 24 0.99989, row 28
# 0.99943 with both). With the runtime's own fp16 KV entries fed to the
# reference, every other row agrees above 0.9999999. Hence 0.999, not 0.9999;
# test_int8_parts_from_the_reference_only_at_rounding_ties holds the arithmetic
# itself to fp32 noise, row by row.
CASES = [("fp16", {}, "fp16", 0.9999, 0.01), ("int8", RTN, "w8a8", 0.999, 0.05), ("fp16", {}, "exact", 0.9999, 0.02),
         ("int8", {}, "exact", 0.98, 0.25)]


@pytest.mark.parametrize("precision,options,arith,min_cos,max_rel", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_numpy_reference(variant, precision, options, arith, min_cos, max_rel, gemma4_rkbin,
                                      gemma4_gguf):
    engine = LlmEngine(gemma4_rkbin(variant, precision, **options))
    rng = np.random.default_rng(1)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, PROMPT_LEN + 8 - 1).tolist()]
    got = teacher_forced(engine, tokens, PROMPT_LEN)
    ref = ReferenceModel.load(str(gemma4_gguf(variant)), arith)
    ref.reset()
    want = ref.forward(tokens, 0)
    assert got.shape == want.shape
    for row in range(len(tokens)):
        assert cosine(got[row], want[row]) > min_cos, f"row {row}"
        err = np.abs(got[row] - want[row]).max() / np.abs(want[row]).max()
        assert err < max_rel, f"row {row}: relative error {err:.4f}"


@pytest.fixture(scope="module")
def llama(gemma4_gguf):
    models = {}

    def get(variant: str):
        if variant not in models:
            models[variant] = llamacpp.load(str(gemma4_gguf(variant, "f16")), n_ctx=256, logits_all=True)
        return models[variant]

    return get


RESULTS: dict[tuple[str, str], dict] = {}


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_against_llama_cpp(variant, precision, llama, gemma4_rkbin, record_property):
    model = llama(variant)
    engine = LlmEngine(gemma4_rkbin(variant, precision, "f16"))
    text = (DATA / "english.txt").read_text()
    tokens = engine.tokenizer.encode(text)[:TEXT_TOKENS]
    assert tokens == llamacpp.tokenize(model, text)[:TEXT_TOKENS]
    # greedy: the prompt's first words, 16 tokens
    prompt = engine.tokenizer.encode("the cat and the dog run in the world")
    want, gaps = llamacpp.greedy_with_gaps(model, prompt, N_GREEDY)
    got = list(Generator(engine, 128).generate(prompt, N_GREEDY, Sampler(0.0), stop_at_eos=False))
    step, tie = departure(got, want, gaps)
    # teacher-forced over the text, in the windows rkrun --perplexity cuts
    f = llamacpp.agreement_over(model, Generator(engine, PPL_CTX + 1), tokens, PPL_CTX).figures()
    RESULTS[variant, precision] = {"greedy": step, "tie": tie, **f}
    record_property("figures", f)
    print(f"\n[{variant} {precision}] greedy {step}/{N_GREEDY} equal"
          f"{'' if step == N_GREEDY else f' (llama.cpp gap {gaps[step]:.3f}: ' + ('tie)' if tie else 'FAIL)')}; "
          f"teacher-forced over {f['tokens']} tokens: top-1 {f['top1']:.3f}, KL {f['kl']:.5f}, "
          f"ppl {f['ppl']:.3f} (llama.cpp {f['ppl_llamacpp']:.3f})")
    assert step == N_GREEDY or tie, (got, want)
    assert f["top1"] >= TOP1[precision]


def test_kv_sharing_reads_the_window_its_source_saw(gemma4_rkbin, gemma4_gguf):
    """A shared sliding layer's first queries of a chunk still see keys its
    source layer's window has since dropped: prefill in one chunk equals
    token by token (and the reference)."""
    a = LlmEngine(gemma4_rkbin("gemma4-shared", "fp16"))
    tokens = list(range(4, 4 + PROMPT_LEN))
    chunked = Generator(a, 64)._forward(tokens, 0, all_logits=True)
    ref = ReferenceModel.load(str(gemma4_gguf("gemma4-shared")), "fp16")
    ref.reset()
    want = ref.forward(tokens, 0)
    assert min(cosine(g, w) for g, w in zip(chunked, want)) > 0.9999


# decode steps past the window (6) after a chunk and a padded one
PLAN_STEPS = [("prefill_4", [5, 6, 7, 8], 0), ("prefill_4", [7, 8, 9], 4), *[("decode", [30 + i], 7 + i)
                                                                            for i in range(6)]]


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("variant", ["gemma4", "gemma4-kv-rule"])
def test_decode_stretches_are_fused_and_give_the_interpreters_logits(variant, precision, gemma4_rkbin):
    """Each Gemma 4 layer's host work between NPU segments runs as one fused
    call in decode (runtime/llm/fused*.py): its attention stretch (q/k norms,
    the plain v norm, v as k's product, partial RoPE; or a KV-shared layer's
    query before AttentionShared over its source's fp16 rows), with the
    norms, RoPEs and cache row compiled; the residual stretches (the FFN
    output's norm and add, the per-layer projection's with the layer output
    scale); the integer FFN and the per-layer input's gate (GELU times its
    Pick); the logits' soft-capping in place. Layer 0's attention stretch
    also sums the per-layer inputs: those steps run first, each its own
    call. The logits are the interpreter's within test_plan's bounds (int8
    and int4 stretches compute in float32 in their own order: 5e-3 of the
    largest logit, the same top token). int8 with its prefill products int8 (not the default's
    fp16 copy, compiler/llm/prefill_fp16.py): its many-row int8 stretches are
    what this checks."""
    from llm.test_plan import assert_plan_is_the_interpreter
    from rkc.runtime.llm import fused_attention

    path = gemma4_rkbin(variant, precision, **({"prefill_fp16": "none"} if precision == "int8" else {}))
    made, front = [], fused_attention._compiled_front
    engine = None
    try:
        fused_attention._compiled_front = lambda *a: made.append(front(*a)) or made[-1]
        engine = LlmEngine(path, device="null")
    finally:
        fused_attention._compiled_front = front
    labels = [getattr(c, "label", "") for c in engine.plans["decode"].calls]
    many = [getattr(c, "label", "") for c in engine.plans["prefill_16"].calls]
    n, ple = engine.cfg.n_layer, variant == "gemma4"
    embedding = labels.index("NPU submit")  # the token's embedding rows before the first segment
    engine.close()
    if precision == "int8":  # a tile's rows: the same residual stretches, one compiled call each (but the
        # last layer's last: its TakeLast leaves the output norm one row)
        assert sum(lab.startswith("residual stretch of rows") for lab in many) == (3 if ple else 2) * n - 1, many
        assert sum(lab.startswith("per-layer gate stretch of rows") for lab in many) == (n if ple else 0), many
    if precision == "int4":  # Gemma 4's residual bodies too (the last layer's last one row, as above)
        assert sum(lab.startswith("int4 residual stretch of rows") for lab in many) == (3 if ple else 2) * n - 1, \
            many
    # the per-layer inputs (the projection's norm, the sum with the token rows) in one compiled call
    assert many.count(prefill_per_layer.LABEL) == (1 if ple else 0), many
    assert sum(lab.startswith("attention stretch") for lab in labels) == n
    assert len(made) == n and all(m is not None for m in made)
    if precision != "fp16":
        assert sum(lab.startswith("ffn stretch") for lab in labels) == n
        assert sum(lab.startswith("per-layer gate stretch") for lab in labels) == (n if ple else 0)
        assert sum(lab.startswith("residual stretch") for lab in labels) == (3 if ple else 2) * n
    capped = [lab for lab in labels if lab.startswith("output (")]  # the logits, soft-capped in place
    edge = {"fp16": "Cast", "int8": "DequantizeRows", "int4": "CombineInt4"}[precision]
    assert capped == [f"output ({edge}, soft-capped)"]  # (llama.cpp's default cap of 30 without the key)
    assert not {"AttentionShared", "Attention", "RMSNormPlain", "RMSNorm", "Pick", "ScaleBy", "Mul", "GeluTanh",
                "Tanh", "Add", "Scale", "RoPE"} & set(labels[embedding:]), labels[embedding:]
    assert_plan_is_the_interpreter(path, precision, PLAN_STEPS, exact_int8=False,
                                   atol=1e-4 if precision == "fp16" else 5e-3)
    if precision != "fp16":
        _gemma4_bodies_give_the_step_paths_logits(path)


def _gemma4_bodies_give_the_step_paths_logits(path):
    """Many rows: Gemma 4's residual bodies fused (the FFN output's norm and
    add, the per-layer projection's scaled by the layer output scale; int8
    and int4), the per-layer inputs and the per-layer gate stretch give
    the logits of the same plan with them run step by step, within 1e-4 of the
    largest (float32 in their own order; the interpreter itself is further off
    this tiny int8 model at rounding ties, fused or not)."""
    from llm.test_plan import MANY_ROWS
    from rkc.runtime.llm import fused_rows, stretch_match

    def logits():
        engine = LlmEngine(path, device="sim")
        cache = engine.new_cache(64)
        out = [engine.run(p, np.asarray(t, np.int32), np.arange(s, s + len(t), dtype=np.int32), cache)
               for p, t, s in MANY_ROWS]
        engine.close()
        return out

    fused = logits()
    saved = fused_rows.ONE_ROW_BODIES, fused_rows.gate_rows, fused_rows.per_layer_chain
    try:
        fused_rows.ONE_ROW_BODIES = stretch_match.RESIDUAL_BODIES  # Gemma 4's bodies step by step
        # and the per-layer inputs and gate stretches (prefill_per_layer)
        fused_rows.gate_rows = fused_rows.per_layer_chain = lambda *a, **k: None
        stepped = logits()
    finally:
        fused_rows.ONE_ROW_BODIES, fused_rows.gate_rows, fused_rows.per_layer_chain = saved
    for got, want in zip(fused, stepped):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_inspect_shows_the_per_layer_placement(gemma4_rkbin):
    """The per-layer embedding rows are gathered on the CPU (bytes per token: its
    rows, not the table), its projection shares layer 0's q/k/v segment, and each
    layer's gate and projection are NPU products of that layer."""
    from rkc.compiler.llm.report import figures, summary_lines
    from rkc.ir.rkbin import read_rkbin

    module = read_rkbin(gemma4_rkbin("gemma4", "int8")).module
    d = figures(module)["decode"]
    table = next(g for g in d["cpu_gathers"] if g["table"] == "per_layer_token_embd.weight")
    assert table["rows_per_run"] == 1 and table["bytes_per_run"] == 6 * 32  # int8: one row of L * P
    assert table["table_bytes"] >= 434 * table["bytes_per_run"]
    assert d["per_layer"]["layer 0"]["segments"][0] == "per_layer_proj+q+k+v"
    for il in range(6):
        assert d["per_layer"][f"layer {il}"]["segments"][-2:] == ["pl_gate", "pl_proj"]
    text = "\n".join(summary_lines(module))
    assert "CPU gather of per_layer_token_embd.weight: 192 bytes per token" in text


def test_shared_layers_read_the_cache_llama_cpp_reads(llama, gemma4_rkbin, gemma4_gguf):
    """gemma4-kv-rule: its shared sliding layers read layer 2 (llama.cpp's
    first shared - 2), not layer 3 (the last earlier sliding layer, Hugging
    Face's rule). The compiled model's teacher-forced logits follow the
    installed llama.cpp's row for row; the numpy reference with the other rule
    does not (so the check can tell the rules apart: measured min cosine 0.87)."""
    import dataclasses

    variant = "gemma4-kv-rule"
    engine = LlmEngine(gemma4_rkbin(variant, "fp16", "f16"))
    assert [engine.cfg.kv_layer(i) for i in range(6)] == KV_SOURCES[variant]
    rng = np.random.default_rng(1)
    tokens = [engine.tokenizer.bos_id, *rng.integers(4, engine.cfg.n_vocab, PROMPT_LEN + 8 - 1).tolist()]
    model = llama(variant)
    model.reset()
    model.eval(tokens)
    want = np.asarray(model.scores[: len(tokens)], np.float64)
    got = teacher_forced(engine, tokens, PROMPT_LEN)
    assert min(cosine(g, w) for g, w in zip(got, want)) > 0.9999
    ref = ReferenceModel.load(str(gemma4_gguf(variant, "f16")), "exact")
    other = dataclasses.replace(ref, cfg=dataclasses.replace(ref.cfg, kv_source=(0, 1, 2, 3, 3, 3)))
    other.reset()
    wrong = other.forward(tokens, 0)
    assert min(cosine(g, w) for g, w in zip(wrong, want)) < 0.99


@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_parts_from_the_reference_only_at_rounding_ties(variant, gemma4_rkbin, gemma4_gguf, monkeypatch):
    """The compiled int8 model and the w8a8 reference do the same arithmetic:
    token by token, the reference fed the runtime's own fp16 KV entries (so no
    earlier row's difference reaches a row), each row's every int8 product
    input has the same codes, and its own K/V entries the same fp16 values,
    until a value within fp32 ulps of a rounding edge (float64 there, fp32 here)
    rounds the other way; a row without one gives the same logits (to fp32 noise).
    (tests/llm/ties.py)"""
    engine = LlmEngine(gemma4_rkbin(variant, "int8", **RTN))
    rng = np.random.default_rng(1)
    tokens = [engine.tokenizer.bos_id, *rng.integers(0, engine.cfg.n_vocab, PROMPT_LEN + 8 - 1).tolist()]
    p = parting(engine, ReferenceModel.load(str(gemma4_gguf(variant)), "w8a8"), tokens, monkeypatch)
    print(f"\n[{variant}] {len(p.ties)} rows part at a tie: {p.ties}; the others' logits: max error {max(p.clean, default=0):.1e}")
    assert not p.departures, p.departures
    assert max(p.clean) < NOISE
