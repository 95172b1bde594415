"""Weight preparation's cost estimated before it starts (compiler/llm/budget.py):
GPTQ's X^T X bytes and rounding work counted from the graph's shapes, the
fallback a default compile takes when over budget, the calibration cut to
whole windows; and int4 weights held two to a byte."""

from __future__ import annotations

import numpy as np
import pytest

from llm.synth import write_model
from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.compiler.llm import budget
from rkc.compiler.llm.build import CompileReport, LlmCompileOptions, within_budget
from rkc.compiler.llm.encode import encode_int4
from rkc.compiler.llm.int4 import quantize_weight
from rkc.compiler.llm.quantize import HIDDEN_INPUT_KINDS
from rkc.compiler.llm.weights import row_source
from rkc.ir.errors import UnsupportedError


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return graph_from_gguf(GgufFile(write_model(tmp_path_factory.mktemp("budget") / "llama.gguf", "llama")))


def _linears(graph):
    """(weight, input, N, K) of each product, read from the ops independently of budget.py."""
    out = {}
    for op in graph.ops:
        if op.type == "Linear":
            n, k = graph.tensors[op.inputs[1]].type.shape
            out[op.inputs[1]] = (op.inputs[0], n, k, op.outputs[0] == "logits")
    return out


def test_gptq_cost_counts_each_shared_input_once(graph):
    products = _linears(graph)
    every = budget.gptq_cost(graph, "gptq")
    inputs = {x: k for x, _, k, _ in products.values()}
    assert every.hessian_bytes == sum(8 * k * k for k in inputs.values())
    assert len(inputs) < len(products)  # q/k/v and gate/up share theirs
    assert every.seconds == pytest.approx(sum(n * k * k for _, n, k, _ in products.values())
                                          * budget.GPTQ_NS_PER_NK2 * 1e-9)
    head = budget.gptq_cost(graph, "head-gptq")
    (x, n, k, _), = [v for v in products.values() if v[3]]
    assert (head.hessian_bytes, head.seconds) == (8 * k * k, pytest.approx(n * k * k * budget.GPTQ_NS_PER_NK2 * 1e-9))
    hidden = budget.gptq_cost(graph, "hidden-gptq")
    assert head.hessian_bytes < hidden.hessian_bytes < every.hessian_bytes
    assert budget.gptq_cost(graph, "rtn") == budget.GptqCost(0, 0.0)
    hidden_inputs = {x: k for w, (x, _, k, is_head) in products.items()
                     if is_head or any(kind in w for kind in HIDDEN_INPUT_KINDS)}
    assert hidden.hessian_bytes == sum(8 * k * k for k in hidden_inputs.values())


def test_over_budget_falls_back_to_the_first_scheme_that_fits(graph, monkeypatch):
    hidden = budget.gptq_cost(graph, "hidden-gptq")
    monkeypatch.setattr(budget, "HESSIAN_BUDGET_BYTES", hidden.hessian_bytes)
    assert budget.affordable_rounding(graph, "gptq")[0] == "hidden-gptq"
    monkeypatch.setattr(budget, "HESSIAN_BUDGET_BYTES", hidden.hessian_bytes - 1)
    assert budget.affordable_rounding(graph, "gptq")[0] == "head-gptq"
    monkeypatch.setattr(budget, "GPTQ_BUDGET_S", 0.0)
    assert budget.affordable_rounding(graph, "gptq")[0] == "rtn"


def test_a_default_compile_says_when_it_rounds_cheaper(graph, monkeypatch):
    monkeypatch.setattr(budget, "HESSIAN_BUDGET_BYTES", 0)
    report = CompileReport()
    options = within_budget(graph, LlmCompileOptions("int4", (1,)), report)
    assert options.rounding == "rtn" and len(report.lines) == 1 and "GPTQ would need" in report.lines[0]
    told = CompileReport()  # a rounding the user chose is kept, whatever it costs
    assert within_budget(graph, LlmCompileOptions("int4", (1,), rounding="gptq"), told).rounding == "gptq"
    assert not told.lines


@pytest.mark.parametrize("macs_budget", [0.5, 3.7, 1000.0])
def test_calibration_tokens_are_whole_windows_within_budget(graph, monkeypatch, macs_budget):
    macs = sum(n * k for _, n, k, _ in _linears(graph).values())
    # a budget of `macs_budget` tokens' work
    monkeypatch.setattr(budget, "CALIBRATION_BUDGET_S", macs_budget * macs * budget.CALIBRATION_NS_PER_MAC * 1e-9)
    got = budget.calibration_tokens(graph, 2048, 4)
    want = min(2048, max(4, int(macs_budget) // 4 * 4))
    assert got == want and got % 4 == 0


def test_int4_weights_are_held_two_to_a_byte():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((96, 160)).astype(np.float32)
    enc = encode_int4(row_source(w), 64)
    q = quantize_weight(w, 64)
    assert enc.data.shape == (96, 80) and enc.data.dtype == np.uint8
    np.testing.assert_array_equal(enc.int4_values(), q.data)
    np.testing.assert_array_equal(enc.int4_scales, q.scales)


@pytest.mark.parametrize("gptq", [False, True])
def test_int4_rounding_by_row_blocks_is_the_whole_matrix_rounding(monkeypatch, gptq):
    from rkc.compiler.llm import int4

    rng = np.random.default_rng(11)
    w = rng.standard_normal((53, 96)).astype(np.float32)
    x = rng.standard_normal((200, 96)) * rng.uniform(0.2, 3.0, 96)
    h = x.T @ x if gptq else None
    whole = quantize_weight(w, 32, h)
    monkeypatch.setattr(int4, "ROUND_ELEMENTS", 7 * 96)  # blocks of 7 rows, the last of 4
    blocked = quantize_weight(w, 32, h)
    np.testing.assert_array_equal(blocked.data, whole.data)
    np.testing.assert_array_equal(blocked.scales, whole.scales)


@pytest.mark.parametrize("probe_rows", [1, 5, 256])
def test_int4_auto_groups_probed_on_the_first_rows_are_the_full_search(monkeypatch, probe_rows):
    """AUTO_GROUP: the fewest K groups whose partials are safe for the whole
    matrix, whether the first rows were probed or not (a probe that passes
    where a later row fails still ends at the whole matrix's count)."""
    from rkc.compiler.llm import encode
    from rkc.compiler.llm.int4 import AUTO_GROUP, group_for, safe

    rng = np.random.default_rng(5)
    w = rng.standard_normal((40, 4096)).astype(np.float32)
    # the last rows uniform: larger |int4| sums than Gaussian rows, so they need more groups
    w[30:] = rng.uniform(-1.0, 1.0, (10, 4096))
    want = next(group_for(4096, parts) for parts in range(1, 129) if safe(quantize_weight(w, group_for(4096, parts))))
    monkeypatch.setattr(encode, "INT4_PROBE_ROWS", probe_rows)
    monkeypatch.setattr(encode, "ENCODE_ROWS", 16)  # three row blocks: a later one may fail after the first passed
    enc = encode_int4(row_source(w), AUTO_GROUP)
    assert enc.int4_group == want and want < 4096
    np.testing.assert_array_equal(enc.int4_values(), quantize_weight(w, want).data)


def test_weights_past_the_iova_window_are_refused_before_quantizing(graph):
    """The products' weight bytes (a lower bound of the NPU regions) against the window:
    int8 a byte a weight, int4 half, fp16 two; exactly at the window is refused."""
    from rkc.compiler.llm.build import check_npu_weights_fit
    from rkc.compiler.llm.prefill_fp16 import body_weights, copy_bytes

    weights = sum(n * k for _, n, k, _ in _linears(graph).values())
    # an int8 build's fp16 copies for prefill (compiler/llm/prefill_fp16.py): the FFN's, every product's but the head's
    ffn, body = copy_bytes(graph), copy_bytes(graph, body_weights(graph))
    assert 0 < ffn < body
    for precision, prefill, need in (("int8", "none", weights), ("int8", "ffn", weights + ffn),
                                     ("int8", "all", weights + body),
                                     ("int4", "auto", weights // 2), ("fp16", "auto", 2 * weights)):
        options = LlmCompileOptions(precision=precision, prefill_fp16=prefill)
        check_npu_weights_fit(graph, options, window=need + 1)
        with pytest.raises(UnsupportedError, match=f"{precision} NPU weights need at least .* IOVA window"):
            check_npu_weights_fit(graph, options, window=need)


def test_prefill_chunks_not_given_are_the_compilers_choice():
    """Chunks not given (None) are DEFAULT_CHUNKS and may give way to the IOVA window; chunks
    given may not, even when they are the default list, and gain the one-row chunk."""
    from rkc.compiler.llm.build import DEFAULT_CHUNKS, prefill_chunks

    assert LlmCompileOptions().prefill_chunks is None
    assert prefill_chunks(LlmCompileOptions()) == (DEFAULT_CHUNKS, True)
    assert prefill_chunks(LlmCompileOptions(prefill_chunks=DEFAULT_CHUNKS)) == (DEFAULT_CHUNKS, False)
    assert prefill_chunks(LlmCompileOptions(prefill_chunks=(512, 32))) == ((1, 32, 512), False)
    with pytest.raises(UnsupportedError, match="must be positive"):
        prefill_chunks(LlmCompileOptions(prefill_chunks=(0, 32)))


def test_default_chunks_give_way_to_the_iova_window(tmp_path, monkeypatch):
    """With the default prefill chunks, a chunk whose activations (estimated from the smaller
    chunks' scratch per row) would not fit beside the weights in the IOVA window is left out,
    with the larger ones, and the file still runs; chunks asked for are all kept, the default
    list typed out too: past the window, that module is refused (one error, nothing written)."""
    from rkc.compiler import module_builder
    from rkc.compiler.llm import build
    from rkc.compiler.llm.build import DEFAULT_CHUNKS, compile_gguf
    from rkc.ir.rkbin import read_rkbin
    from rkc.runtime.llm.engine import LlmEngine

    gguf = write_model(tmp_path / "llama.gguf", "llama", context_length=1024)
    options = LlmCompileOptions("int8", rounding="rtn")
    compile_gguf(gguf, tmp_path / "whole.rkbin", options)
    regions = {r.kind: r.size for r in read_rkbin(tmp_path / "whole.rkbin").module.regions}
    window = regions["weights"] + regions["regcmd"] + regions["scratch"] - 1  # the 512-chunk's scratch: one byte short
    monkeypatch.setattr(build, "IOVA_WINDOW", window)
    check = module_builder.check_iova_window  # the end check, against the same window
    monkeypatch.setattr(module_builder, "check_iova_window", lambda regions: check(regions, window))
    report = compile_gguf(gguf, tmp_path / "fit.rkbin", options)
    module = read_rkbin(tmp_path / "fit.rkbin").module
    kept = module.metadata["prefill_chunks"]
    assert 512 not in kept and kept == [c for c in DEFAULT_CHUNKS if c in kept] and 1 in kept, kept
    assert {p.name for p in module.programs} == {"decode"} | {f"{k}_{c}" for c in kept if c > 1
                                                             for k in ("prefill", "score")}
    assert sum(r.size for r in module.regions if r.kind != "host") < window
    assert any("left out" in line and "512" in line for line in report.lines), report.lines
    engine = LlmEngine(tmp_path / "fit.rkbin", device="sim")
    cache = engine.new_cache(2 * max(kept))
    program = engine.program_for(max(kept), all_logits=False).name
    logits = engine.run(program, np.arange(max(kept), dtype=np.int32) % 50, np.arange(max(kept), dtype=np.int32), cache)
    assert np.isfinite(logits).all()
    engine.close()
    asked = compile_gguf(gguf, tmp_path / "asked.rkbin", LlmCompileOptions("int8", (1, 32, 512), rounding="rtn"))
    assert read_rkbin(tmp_path / "asked.rkbin").module.metadata["prefill_chunks"] == [1, 32, 512]
    assert not any("left out" in line for line in asked.lines)
    typed = LlmCompileOptions("int8", DEFAULT_CHUNKS, rounding="rtn")  # the defaults given: every one kept
    files = set(tmp_path.iterdir())
    with pytest.raises(UnsupportedError, match="IOVA window"):
        compile_gguf(gguf, tmp_path / "typed.rkbin", typed)
    assert set(tmp_path.iterdir()) == files
