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


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_gives_the_interpreters_logits(arch, precision, synth_rkbin):
    """The plan against the interpreter over prefill chunks and decode steps:
    the decode plan's int8 stretches run as one compiled call each (jit.residual_row,
    jit.gated_row: float32 in their own order, GELU / SiLU through exp_f32), so a
    value may land a float32 ulp away and, at an int8 rounding tie, a code step
    away (2-5e-3 of the largest logit, as the many-row plans below); the same top token."""
    assert_plan_is_the_interpreter(synth_rkbin(arch, precision), precision, STEPS, exact_int8=False,
                                   atol=1e-4 if precision == "fp16" else 5e-3)


def assert_plan_is_the_interpreter(path, precision: str, steps, exact_int8: bool = True, atol: float = 1e-4) -> None:
    for got, want in plan_and_interpreter_logits(path, steps):
        assert got.shape == want.shape and np.isfinite(want).all()
        if precision in ("int8", "int4") and exact_int8:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=atol * np.abs(want).max())
            assert np.argmax(got[-1]) == np.argmax(want[-1])


# chunks of 16 rows (one tile: the many-row kernels and fused stretches), whole and padded
MANY_ROWS = [("prefill_16", list(range(20, 36)), 0), ("prefill_16", list(range(40, 51)), 16),
             ("decode", [60], 27)]


# (precision, options, atol): int8's default multi-row programs read the fp16 FFN copy
# (compiler/llm/prefill_fp16.py), so have fp16 edges, whose half steps the int8 edges after them
# can turn into a code step (measured 2026-12-06: gemma3 2.7e-3 of the largest logit, the
# chunk at 16 padded then decode; llama and qwen2 <= 1e-7); prefill_fp16 int8 keeps the int8 FFN stretch,
# whose float32 order (the plan's tiles, the interpreter's rows, the machine's vector width) can move a value
# across an int8 rounding tie: one code step, 2-5e-3 of the largest logit (measured 2026-12-07 on an AMD EPYC
# without AVX-512: a 32-row chunk with 16 or 11 real tokens 3.9e-3 / 2.9e-3, where another CPU gave <= 1e-4)
PLANS = [("fp16", {}, 2e-3), ("int8", {}, 5e-3), ("int8", {"prefill_fp16": "none"}, 5e-3), ("int4", {}, 1e-4)]


@pytest.mark.parametrize("precision,options,atol", PLANS)
@pytest.mark.parametrize("arch", ARCHS)
def test_many_row_plan_gives_the_interpreters_logits(arch, precision, options, atol, synth_rkbin):
    """Prefill chunks of a tile's rows through the plan's many-row paths
    (runtime/llm/fused_rows.py, prefill_kernels.py, prefill_channels.py)
    against the interpreter: the fused stretches and the norms compute in
    float32 in their own order (issue 37), so within 1e-4 of the largest
    logit (2e-3 with fp16 edges: a float32 ulp's difference moves a value at an
    fp16 edge by a half's step, 2^-11 relative, and the next layers carry it),
    the same top token."""
    assert_plan_is_the_interpreter(synth_rkbin(arch, precision, **options), precision, MANY_ROWS, exact_int8=False,
                                   atol=atol)


# a 32-row chunk, then 11 tokens in it: the second tile is all pad rows, which the host leaves as the
# first run left them (runtime/llm/fused_rows.live_tiles)
PAD_TILES = [("prefill_32", list(range(20, 52)), 0), ("prefill_32", list(range(60, 71)), 32), ("decode", [80], 43)]


@pytest.mark.parametrize("precision,options,atol", PLANS[:3])
def test_pad_tiles_left_alone_give_the_interpreters_logits(precision, options, atol, synth_rkbin):
    """A chunk of fewer tokens than its program's rows: the host's many-row
    steps run over the real tokens' tiles only, the pad rows keeping the
    previous run's values; the real rows' logits and the next step's are the
    interpreter's (which computes every row), within the many-row bounds."""
    assert_plan_is_the_interpreter(synth_rkbin("gemma3", precision, chunks=(1, 32), **options), precision,
                                   PAD_TILES, exact_int8=False, atol=atol)


def test_two_term_edges_are_fused_and_give_the_interpreters_logits(synth_rkbin):
    """--int8-residual all (every int8 input a row and its residual row):
    the decode plan still fuses each layer's stretches (their edges read and
    write the two rows) and computes the interpreter's logits bit for bit."""
    path = synth_rkbin("gemma3", "int8", residual="all")
    engine = LlmEngine(path, device="null")
    labels = [getattr(c, "label", "") for c in engine.plans["decode"].calls]
    n = engine.cfg.n_layer
    engine.close()
    assert sum(lab.startswith("residual stretch") for lab in labels) >= 2 * n - 1
    assert sum(lab.startswith("ffn stretch") for lab in labels) == n
    assert sum(lab.startswith("attention stretch") for lab in labels) == n
    for got, want in plan_and_interpreter_logits(path, STEPS):
        assert np.isfinite(want).all()
        np.testing.assert_array_equal(got, want)


def test_plan_outputs_survive_the_next_run(synth_rkbin):
    """The logits a run returns are not overwritten by the run after it."""
    engine = LlmEngine(synth_rkbin("llama", "fp16"), device="sim")
    cache = engine.new_cache(32)
    first = engine.run("decode", np.asarray([5], np.int32), np.asarray([0], np.int32), cache)
    kept = first.copy()
    engine.run("decode", np.asarray([9], np.int32), np.asarray([1], np.int32), cache)
    np.testing.assert_array_equal(first, kept)


def _step(op, n_in, attrs):
    from rkc.ir.program import Step

    return Step(kind="cpu", name=op.lower(), op=op, inputs=[f"i{j}" for j in range(n_in)], outputs=["o", "s"],
                attrs=attrs)


@pytest.mark.parametrize("k,kind", [(64, "kron"), (640, "kron"), (896, "kron"), (640, "block"), (2048, "kron")])
@pytest.mark.parametrize("rows", [1, 32, 100])
def test_prepared_quantize_rows_is_the_kernel(k, kind, rows):
    """The prepared QuantizeRows (RowRotation, reused buffers) against the
    plain kernel, bit for bit: rotations with and without a block-mixing
    factor, one row and a chunk, called twice (its buffers are reused); 100
    rows of 2048 are past threads.SHARED_WORK, so its tiles are shared among
    the threads (a short last tile)."""
    from rkc.runtime.kernels.hadamard import make_rotation
    from rkc.runtime.llm import kernels, prepared

    rot = make_rotation(k, kind)
    consts = [rot.signs] + ([rot.factor] if rot.factor is not None else [])
    attrs = {"rotation": "hadamard", "block": rot.block}
    run = prepared.quantize_rows(_step("QuantizeRows", 1 + len(consts), attrs), [None, *consts], None)
    rng = np.random.default_rng(k + rows)
    for scale in (1e-3, 40.0):
        x = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
        x[0, :] = 0 if rows > 1 else x[0, :]  # an all-zero row: scale 1
        got, want = run([x, *consts]), kernels.quantize_rows_kernel([x, *consts], attrs, None)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    x[-1, 3] = np.nan  # a NaN row gets numpy's scale (1), whatever its codes
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(run([x, *consts])[1], kernels.quantize_rows_kernel([x, *consts], attrs, None)[1])


@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_prepared_norm_and_dequantize_are_the_kernels(order):
    """Prepared RMSNorm and DequantizeRows against the plain kernels, bit for
    bit and in the same memory order (later sums follow it), for row-major,
    column-major (as a plan reads an NPU output) and strided inputs."""
    from rkc.runtime.llm import kernels, prepared

    rng = np.random.default_rng(7)
    base = rng.standard_normal((8, 2 * 640)).astype(np.float32) * 30
    x = {"C": np.ascontiguousarray(base[:, :640]), "F": np.asfortranarray(base[:, :640]), "strided": base[:, ::2]}[order]
    w = rng.standard_normal(640).astype(np.float32)
    norm = prepared.rms_norm(_step("RMSNorm", 2, {"epsilon": 1e-6}), [None, w], None)
    got, want = norm([x, w])[0], kernels.rms_norm([x, w], {"epsilon": 1e-6}, None)[0]
    np.testing.assert_array_equal(got, want)
    assert got.flags.c_contiguous == want.flags.c_contiguous and got.flags.f_contiguous == want.flags.f_contiguous
    acc = (x * 1000).astype(np.int32)
    row_scale, ch, bias = rng.random(8).astype(np.float32), rng.random(640).astype(np.float32), w
    deq = prepared.dequantize_rows(_step("DequantizeRows", 4, {}), [None, None, ch, bias], None)
    for _ in range(2):  # the float64 buffer is reused
        got = deq([acc, row_scale, ch, bias])[0]
        want = kernels.dequantize_rows([acc, row_scale, ch, bias], {}, None)[0]
        np.testing.assert_array_equal(got, want)
        assert got.flags.f_contiguous == want.flags.f_contiguous


def test_prepared_kernels_leave_other_shapes_to_the_plain_kernels():
    """The compiled kernels index without bounds checks, so a weight that only
    broadcasts (as a crafted module may declare), or scales that do not match
    the accumulators, get the plain kernel's result or its numpy error."""
    from rkc.runtime.llm import kernels, prepared

    rng = np.random.default_rng(3)
    x, w1 = rng.standard_normal((2, 640)).astype(np.float32), np.float32([2.0])
    norm = prepared.rms_norm(_step("RMSNorm", 2, {"epsilon": 1e-6}), [None, w1], None)
    np.testing.assert_array_equal(norm([x, w1])[0], kernels.rms_norm([x, w1], {"epsilon": 1e-6}, None)[0])
    acc, ch = (x * 100).astype(np.int32), rng.random(640).astype(np.float32)
    deq = prepared.dequantize_rows(_step("DequantizeRows", 3, {}), [None, None, ch], None)
    with pytest.raises(ValueError):
        deq([acc, rng.random(3).astype(np.float32), ch])  # 3 row scales for 2 rows


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("arch", ARCHS)
def test_stretches_are_fused(arch, precision, synth_rkbin):
    """The decode plan runs each decoder layer's residual stretches (dequantize
    or cast, norms, the residual add, quantize or cast), its attention
    stretch and an integer gated FFN's as one call each, and reads the logits
    straight from their BO (runtime/llm/fused*.py), so
    test_plan_gives_the_interpreters_logits checks the fused paths; a prefill
    plan (more rows) keeps the per-step path. int8 with its prefill products
    int8 (not the default's fp16 copy, compiler/llm/prefill_fp16.py): its
    many-row int8 edges are what this checks."""
    engine = LlmEngine(synth_rkbin(arch, precision, **({"prefill_fp16": "none"} if precision == "int8" else {})),
                       device="null")
    labels = [getattr(c, "label", "") for c in engine.plans["decode"].calls]
    n = engine.cfg.n_layer
    assert sum(lab.startswith("residual stretch") for lab in labels) >= 2 * n - 1
    # an fp16 FFN has no CPU stretch: it runs in one NPU segment (compiler/llm/ffn_fusion.py); an integer
    # FFN's activation and gating stay on the CPU (its sums need the per-token scale first)
    assert sum(lab.startswith("ffn stretch") for lab in labels) == (0 if precision == "fp16" else n)
    assert sum(lab.startswith("attention stretch") for lab in labels) == n
    assert sum(lab.startswith("output (") for lab in labels) == 1  # the logits, read straight from the BO
    prefill = [getattr(c, "label", "") for c in engine.plans["prefill_4"].calls]
    assert not any(" stretch (" in lab for lab in prefill)
    if precision == "int4":  # every int4 edge of a prefill chunk compiled (fused_int4_rows.int4_edges)
        assert not {"CombineInt4", "QuantizeNibbles"} & set(prefill + labels)
        assert sum(lab.startswith("CombineInt4 edge") for lab in prefill) >= 4 * n
    # a chunk of a tile's rows: the stretches fused, and the attention stretch's int8 in edges compiled
    # (fused_rows.edge_rows), so test_many_row_plan_gives_the_interpreters_logits checks them (its out
    # edge is taken only for a rotation with a block-mixing factor, which these widths do not have)
    many = [getattr(c, "label", "") for c in engine.plans["prefill_16"].calls]
    if precision != "int4":
        assert sum(lab.startswith("residual stretch of rows") for lab in many) >= 2 * n - 1
    else:  # the int4 stretches (fused_int4_rows.int4_residual_rows, int4_ffn_rows), q, k, v by tiles
        assert sum(lab.startswith("int4 residual stretch of rows") for lab in many) >= 2 * n - 1
        assert sum(lab.startswith("int4 ffn stretch of rows") for lab in many) == n
        assert sum(lab == "CombineInt4 edge of rows (compiled)" for lab in many) >= n
        assert not {"CombineInt4", "QuantizeNibbles"} & set(many)
    if precision != "int4":  # q and k with their norms and RoPE in one edge each (fused_rows._heads_chain)
        assert sum(lab.endswith(" edge of heads (compiled)") for lab in many) == 2 * n
        assert "RoPE" not in many
    if precision == "int8":
        assert sum(lab == "DequantizeRows edge of rows" for lab in many) >= n  # v
        assert "DequantizeRows" not in many
    engine.close()


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("arch", ARCHS)
def test_attention_stretches_run_their_front_compiled(arch, precision, synth_rkbin, monkeypatch):
    """Each decode layer's attention stretch runs its norms, RoPEs and cache
    store as one compiled call (fused_attention._compiled_front), so
    test_plan_gives_the_interpreters_logits checks that path (a model whose
    stretch has another shape keeps the step-by-step runs)."""
    from rkc.runtime.llm import fused_attention

    made, front = [], fused_attention._compiled_front
    monkeypatch.setattr(fused_attention, "_compiled_front", lambda *a: made.append(front(*a)) or made[-1])
    engine = LlmEngine(synth_rkbin(arch, precision), device="null")
    n = engine.cfg.n_layer
    engine.close()
    assert len(made) == n and all(m is not None for m in made), made


def test_silu_does_not_overflow_and_keeps_the_formulas_values():
    """SiLU (the plain kernel and the plans') gives x / (1 + exp(-x))'s values,
    signed zeros and NaN included, without the exp's overflow warning; its
    threshold is the last float32 whose exp is finite."""
    import warnings

    from rkc.runtime.llm import jit, kernels, prepared

    edge = kernels.EXP_MAX
    with np.errstate(over="ignore"):
        assert np.isfinite(np.exp(edge)) and not np.isfinite(np.exp(np.nextafter(edge, np.float32(np.inf))))
    near = [edge, np.nextafter(edge, np.float32(0)), np.nextafter(edge, np.float32(np.inf))]
    x = np.concatenate([np.linspace(-300, 300, 200001), [np.nan, -0.0, 0.0], near, np.negative(near)]).astype(np.float32)
    with np.errstate(over="ignore"):
        want = x / (1.0 + np.exp(-x))
    run = prepared.BINDERS["SiLU"](_step("SiLU", 1, {}), [None], None)

    def fused(x):  # the one-row FFN stretch's compiled calls around numpy's exp (runtime/llm/fused_gate.py)
        x, t, act, out = x[None], np.empty((1, x.size), np.float32), np.empty((1, x.size), np.float32), np.empty(
            (1, x.size), np.float32)
        jit.silu_argument(x, kernels.EXP_MAX, t)
        np.exp(t, out=t)
        jit.silu_times(x, t, kernels.EXP_MAX, np.ones_like(x), act, out)
        np.testing.assert_array_equal(act, out)
        return out[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for got in (kernels.silu([x], {}, None)[0], run([x])[0], fused(x)):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_edges_read_from_atoms_are_the_kernels():
    """The fused stretches' in edges read a row straight from its NPU atoms
    [C1, C2]: the fp16 widening is numpy's for every one of the 65536 bit
    patterns (NaN payloads, subnormals, signed zeros), and the int32
    dequantization is kernels.dequantize_rows's, bit for bit, with and
    without a bias and with padding channels past K, of one row of sums or
    of two K ranges' (within one float32 rounding of the float64 value)."""
    from rkc.runtime.llm import jit, kernels

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32).view(np.uint32)
    for c2 in (32, 8):  # 8: fp16's atom, widened by chunks; row 0 of [C1, 4 rows, C2] atoms, as a BO holds them
        for n in (1 << 16, (1 << 16) - 3):
            stored = np.zeros((-(-bits.size // c2), 4, c2), np.uint16)
            stored[:, 0] = bits.reshape(-1, c2)
            out = np.zeros(n, np.uint32)
            jit.half_atoms_to_float(stored[:, 0], n, out)
            np.testing.assert_array_equal(out, want[:n])
    rng = np.random.default_rng(11)
    for k, c2 in ((640, 32), (1000, 16), (7, 8), (640, 4), (1001, 4)):  # 4: int32's atom (its fixed loop)
        c1 = -(-k // c2)
        stored = rng.integers(-2 ** 31, 2 ** 31, (c1, 4, c2), dtype=np.int64).astype(np.int32)
        atoms = stored[:, 0]
        acc = np.ascontiguousarray(atoms).reshape(1, -1)[:, :k]
        rs, ch, bias = rng.random(1, np.float32) * 1e-3, rng.random(k, np.float32), rng.standard_normal(k).astype(np.float32)
        for inputs in ([acc, rs, ch], [acc, rs, ch, bias]):
            got = np.zeros(k, np.float32)
            jit.dequantize_atoms(atoms, k, rs[0], ch, inputs[-1], len(inputs) == 4, got)
            np.testing.assert_array_equal(got, kernels.dequantize_rows(inputs, {}, None)[0][0])
        second = rng.integers(-2 ** 31, 2 ** 31, (c1, 4, c2), dtype=np.int64).astype(np.int32)[:, 0]
        acc2 = np.ascontiguousarray(second).reshape(1, -1)[:, :k]
        for inputs in ([acc, acc2, rs, ch], [acc, acc2, rs, ch, bias]):  # two K ranges' sums, added exactly
            got = np.zeros(k, np.float32)
            jit.dequantize_atoms_partials(atoms, second, k, rs[0], ch, inputs[-1], len(inputs) == 5, got)
            want = kernels.dequantize_rows(inputs, {"partials": 2}, None)[0][0]
            np.testing.assert_array_equal(got, want)
            exact = (acc.astype(np.float64) + acc2) * np.float64(rs[0]) * ch + (bias if len(inputs) == 5 else 0)
            np.testing.assert_allclose(got, exact[0], rtol=2 ** -23, atol=0)  # one float32 rounding of float64


def test_edges_written_to_atoms_are_numpys_cast():
    """The fused stretches' fp16 out edges write a float32 row straight into
    the next segment's atoms [C1, rows, C2]: numpy's astype(float16) bits for every
    fp16 value, its neighbours and the ties between them (round to nearest
    even), overflow, infinities, signalling and quiet NaNs with their
    payloads, random patterns; channels past K and the pad rows zero."""
    from rkc.runtime.half import narrow_into_atoms

    rng = np.random.default_rng(12)
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    tie = np.uint32(1 << 12)  # half of an fp16 ulp, in float32 bits, for normal values
    x = np.concatenate([halves, halves + 1, halves - 1, halves + tie, halves - tie, halves + tie + 1,
                        np.arange(0x7F800000, 0x80000000, 4093, dtype=np.uint32),
                        np.arange(0xFF800000, 0xFFFFFFFF, 4099, dtype=np.uint32),
                        rng.integers(0, 2 ** 32, 1 << 20, dtype=np.uint64).astype(np.uint32)])
    c2 = 16
    n = x.size - 5  # a partial last atom: its channels past n are zero
    dst = np.full((-(-x.size // c2), 3, c2), 0xFFFF, np.uint16)  # [C1, rows, C2]: one row and two pad rows
    narrow_into_atoms(x[:n].reshape(1, n), dst)
    with np.errstate(all="ignore"):
        want = x[:n].view(np.float32).astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(dst[:, 0].reshape(-1)[:n], want)
    assert not dst[:, 0].reshape(-1)[n:].any() and not dst[:, 1:].any()


@pytest.mark.slow  # its own rkbin (groups of 32), three programs: ~40 s CPU
def test_paired_int4_head_gives_the_interpreters_logits(synth_rkbin):
    """int4 groups of 32 split the head's K of 64 in two: its nibble rows carry
    both groups in the 4 rows a token's 2 leave (int4_rows.pair_rows) in every
    program (decode, prefill's last row, a score chunk's every row), the plan's
    compiled edges give the interpreter's numpy kernels' logits bit for bit."""
    from rkc.ir.rkbin import read_rkbin

    path = synth_rkbin("qwen2", "int4", int4_group=32)
    module = read_rkbin(path).module
    for name in ("decode", "prefill_4", "score_4"):
        paired = [s for s in module.program(name).steps if s.op in ("QuantizeNibbles", "CombineInt4")
                  and s.attrs.get("pair_group") == 32]
        assert len(paired) == 2, name  # the head's two edges, no other product's
    assert_plan_is_the_interpreter(path, "int4", [*STEPS, ("score_4", [3, 4, 5, 6], 0)], exact_int8=False, atol=5e-3)
    # many rows: the fused stretches' own float32 order can move a value across an int4 rounding
    # tie, one nibble step (1.3e-2 of the largest logit on an AMD EPYC without AVX-512, stop 46's
    # tree and this one alike, 2026-12-07; 1e-4 held on the previous CPU)
    assert_plan_is_the_interpreter(path, "int4", MANY_ROWS, exact_int8=False, atol=2e-2)
