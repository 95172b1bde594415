"""The fp16 gated FFN in one NPU segment (compiler/llm/ffn_fusion.py): the
gate product's LUT activation and the up product's EW gating multiply on the
simulator against numpy over a sweep of rows (decode's 1 included), the graph
pattern, and what a compiled model keeps on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.compiler.emitter_graph import CHAINABLE, EMIT_OPTIONS
from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.compiler.llm.ffn_fusion import ACTIVATION_LUT, gated_ffns, operand_rows
from rkc.compiler.llm.prefill_fp16 import AUTO_MAX_COPY_BYTES, body_weights, copied_kind, copied_weights, \
    copy_bytes, ffn_weights
from rkc.compiler.npu import api, lut
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.placement import place_segment
from rkc.ir.errors import UnsupportedError
from rkc.ir.rkbin import read_rkbin
from rkc.ir.types import TensorType
from rkc.runtime import sim
from npu_runner import run

D, F = 64, 96  # model width, FFN width


def _products(m: int, act: str, wg, wu, wd):
    """The three GEMMs as the program builder lowers a fused FFN."""
    x = api.Feature.gemm("x", 0, m, D, "fp16")
    rows = api.gemm_rows(m)
    s = api.Feature.gemm("s", 0, operand_rows(m), F, "fp16").view(rows=rows)
    h = api.Feature.gemm("h", 0, m, F, "fp16")
    y = api.Feature.gemm("y", 0, m, D, "fp16")
    gemms = [api.Gemm(x, wg.T, s, m, name="gate", epilogue=api.Epilogue(activation=act)),
             api.Gemm(x, wu.T, h, m, name="up", epilogue=api.Epilogue(residual=api.Residual(s, "mul"))),
             api.Gemm(h, wd.T, y, m, name="down")]
    placed = place_segment(gemms, EMIT_OPTIONS, per_task_kicks=not CHAINABLE["fp16"])
    return [emit(g, EMIT_OPTIONS) for g in placed], x, s, h, y


@pytest.mark.parametrize("act", sorted(set(ACTIVATION_LUT.values())))
@pytest.mark.parametrize("m", [1, 3, 12, 21])
def test_fused_ffn_on_the_simulator_matches_numpy(m, act):
    rng = np.random.default_rng(100 + m)
    wg = (rng.standard_normal((F, D)) * 0.3).astype(np.float16)
    wu = (rng.standard_normal((F, D)) * 0.3).astype(np.float16)
    wd = (rng.standard_normal((D, F)) * 0.2).astype(np.float16)
    xv = rng.standard_normal((m, D)).astype(np.float16)
    results, x, s, h, y = _products(m, act, wg, wu, wd)
    padded = np.zeros((x.height, D), np.float16)
    padded[:m] = xv
    got = run(results, sim.SimDevice(), {"x": (x, padded.T[:, :, None])}, merge_jobs=True)
    f64 = np.float64
    g = xv.astype(f64) @ wg.astype(f64).T
    u = xv.astype(f64) @ wu.astype(f64).T
    plan = lut.plan(act)
    want_s = plan.function(g)
    got_s = got.feature(s)[:, :m, 0].T.astype(f64)
    # the table's bound, the fp16 gate output it indexes and the fp16 write
    slope = np.abs(plan.function(g + 1e-3) - want_s) / 1e-3 + 1
    assert np.all(np.abs(got_s - want_s) <= plan.tolerance() + slope * 2e-3 * np.abs(g) + 1e-3 * np.abs(want_s))
    # the gating multiply: the NPU's own s times up (fp32 product, one fp16 rounding of up and of h)
    got_h = got.feature(h)[:, :m, 0].T.astype(f64)
    assert np.all(np.abs(got_h - got_s * u) <= 2e-3 * np.abs(got_s * u) + 1e-3 * np.abs(got_s) * np.abs(u).max()
                  + 1e-6)
    # the down product of the NPU's h (fp32 sums of exact products, one fp16 rounding)
    ref_y = got_h @ wd.astype(f64).T
    got_y = got.feature(y)[:, :m, 0].T.astype(f64)
    assert np.all(np.abs(got_y - ref_y) <= 1e-3 * (np.abs(got_h) @ np.abs(wd.astype(f64)).T) + 1e-6)


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_the_pattern_is_each_layers_ffn(arch, synth_gguf):
    graph = graph_from_gguf(GgufFile(str(synth_gguf(arch))))
    downs = [i for i, op in enumerate(graph.ops) if op.type == "Linear" and "ffn_down" in op.inputs[1]]
    found = gated_ffns(graph, lambda w: True)
    assert [f.down for f in found] == downs and downs
    for f in found:
        assert graph.ops[f.act].type in ACTIVATION_LUT and graph.ops[f.mul].type == "Mul"
        assert graph.ops[f.down].inputs[0] == graph.ops[f.mul].outputs[0]
    assert gated_ffns(graph, lambda w: "ffn_down" not in w) == []


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_fp16_programs_keep_no_ffn_step_on_the_cpu(arch, synth_rkbin):
    fp16 = read_rkbin(synth_rkbin(arch, "fp16")).module
    int8 = read_rkbin(synth_rkbin(arch, "int8", prefill_fp16="none")).module
    ffn_ops = {"SiLU", "GeluTanh", "Mul"}
    for program in fp16.programs:
        assert not ffn_ops & {s.op for s in program.steps if s.kind == "cpu"}, program.name
    for program in int8.programs:  # int8 keeps the boundary (Q22, per-token scales)
        assert ffn_ops & {s.op for s in program.steps if s.kind == "cpu"}, program.name
    for a, b in zip(fp16.programs, int8.programs):  # one segment fewer per layer
        fused = [x for s in a.steps if s.kind == "npu" for x in s.stats["layers"] if "Mul" in x["op"]]
        assert fused and all(x["op"] == "Linear+Mul" for x in fused)
        assert sum(s.kind == "npu" for s in b.steps) - sum(s.kind == "npu" for s in a.steps) == len(fused)


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
@pytest.mark.parametrize("kind", ["ffn", "all"])
def test_int8_prefill_programs_read_the_fp16_copy(arch, kind, synth_rkbin, synth_gguf):
    """--prefill-fp16 ffn / all (compiler/llm/prefill_fp16.py): decode reads the
    int8 weights and keeps its program; the multi-row programs read the fp16
    copy, the FFN in one fused segment, as an fp16 build's; with all, the only
    int8 product left on their path is the head's; the copy adds 2 bytes a weight."""
    copied = read_rkbin(synth_rkbin(arch, "int8", prefill_fp16=kind))
    plain = read_rkbin(synth_rkbin(arch, "int8", prefill_fp16="none"))
    fp16 = read_rkbin(synth_rkbin(arch, "fp16")).module
    ffn_ops = {"SiLU", "GeluTanh", "Mul"}
    for program in copied.module.programs:
        on_cpu = [s.op for s in program.steps if s.kind == "cpu"]
        segments = sum(s.kind == "npu" for s in program.steps)
        if program.name == "decode":
            assert [(s.kind, s.op) for s in program.steps] == \
                [(s.kind, s.op) for s in plain.module.program("decode").steps]
        else:
            assert not ffn_ops & set(on_cpu), program.name
            assert segments == sum(s.kind == "npu" for s in fp16.program(program.name).steps), program.name
            if kind == "all":
                assert on_cpu.count("QuantizeRows") == 1, program.name  # the head's input
    graph = graph_from_gguf(GgufFile(str(synth_gguf(arch))))
    names = ffn_weights(graph) if kind == "ffn" else body_weights(graph)
    prefill = copied.module.metadata["quantization"]["prefill_fp16"]
    assert prefill["products"] == kind and prefill["copies"] == len(names)
    assert prefill["extra_weight_bytes"] == copy_bytes(graph, names)
    assert copied.blobs["weights"].size - plain.blobs["weights"].size >= copy_bytes(graph, names)
    assert plain.module.metadata["quantization"]["prefill_fp16"]["copies"] == 0


def test_auto_copies_what_fits_its_bound(synth_gguf):
    """auto: every product's copy but the head's, else the FFN's, while it adds at most
    AUTO_MAX_COPY_BYTES; int8 builds only; --keep-fp16 weights need none."""
    graph = graph_from_gguf(GgufFile(str(synth_gguf("gemma3"))))
    ffn, body = ffn_weights(graph), body_weights(graph)
    assert set(ffn) < set(body) and len(ffn) == 3 * len(gated_ffns(graph, lambda w: True))
    assert copied_kind(graph, "int8", "auto") == "all" and copied_weights(graph, "int8", "auto") == body
    assert copied_weights(graph, "int8", "none") == [] and copied_weights(graph, "int8", "ffn") == ffn
    assert copied_weights(graph, "fp16", "all") == [] and copied_weights(graph, "int4", "auto") == []
    assert copied_weights(graph, "int8", "ffn", keep_fp16=("ffn_down",)) == [n for n in ffn if "ffn_down" not in n]

    def resize(names: list[str], side: int) -> None:
        for n in names:
            graph.tensors[n].type = TensorType(graph.tensors[n].type.dtype, (side, side))

    attention = [n for n in body if n not in ffn]
    resize(attention, int(np.sqrt(AUTO_MAX_COPY_BYTES / 2 / len(attention))) + 1)  # all over the bound, ffn not
    assert copied_kind(graph, "int8", "auto") == "ffn" and copied_weights(graph, "int8", "auto") == ffn
    resize(ffn, int(np.sqrt(AUTO_MAX_COPY_BYTES / 2 / len(ffn))) + 1)  # both over
    assert copied_kind(graph, "int8", "auto") == "none" and copied_weights(graph, "int8", "auto") == []
    assert copied_weights(graph, "int8", "all") == body
    with pytest.raises(UnsupportedError):
        copied_weights(graph, "int8", "bf16")
