"""compiler/llm/quantize.gptq (the nearest-plane recurrence, transposed and
blocked) against the textbook GPTQ algorithm (Frantar et al., arXiv:2210.17323,
Algorithm 1: columns in act order, each rounding error spread over the later
columns through the upper Cholesky factor of H^-1), written out here in float64
one column at a time; and GPTQ's purpose: a smaller output error on the
calibration inputs than rounding to nearest."""

import numpy as np
import pytest

from rkc.compiler.llm.quantize import GPTQ_DAMP, QMAX, gptq, round_to_nearest, row_scales


def textbook_gptq(w: np.ndarray, h: np.ndarray, scale: np.ndarray, damp: float) -> np.ndarray:
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = np.argsort(-np.diag(h), kind="stable")
    w, h = w[:, order], h[np.ix_(order, order)]
    h += np.eye(len(h)) * damp * np.mean(np.diag(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # H^-1 = U^T U, U upper
    q = np.empty(w.shape, np.int8)
    for c in range(w.shape[1]):
        qc = np.clip(np.rint(w[:, c] / scale), -QMAX, QMAX)
        q[:, c] = qc
        err = (w[:, c] - qc * scale) / u[c, c]
        w[:, c + 1:] -= np.outer(err, u[c, c + 1:])
    out = np.empty_like(q)
    out[:, order] = q
    return out


def _case(n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((3 * k // 2, k))
    x[:, 3] *= 25  # a loud input channel (act order takes it first)
    x[:, 5] = 0.9 * x[:, 4] + 0.1 * x[:, 5]  # correlated inputs: where GPTQ's compensation pays
    x[:, 7] = 0.0  # an input never seen
    return w, x


@pytest.mark.parametrize("n, k", [(48, 64), (40, 200), (300, 130)])  # K below, across and past a column block
def test_gptq_is_the_textbook_algorithm(n, k):
    w, x = _case(n, k, seed=n + k)
    h = x.T @ x
    scale = row_scales(w)
    got, want = gptq(w, h, scale), textbook_gptq(w, h, scale, GPTQ_DAMP)
    # the same choices up to float32 rounding at a few half-step ties
    assert np.mean(got != want) < 2e-3
    assert np.max(np.abs(got.astype(int) - want)) <= 1

    def output_error(q):
        return float(np.sum((x @ (w - q * scale[:, None]).T) ** 2))

    assert output_error(got) == pytest.approx(output_error(want), rel=1e-3)
    assert output_error(got) < 0.7 * output_error(round_to_nearest(w, scale))


@pytest.mark.parametrize("arch", ["gemma3", "llama"])  # a tied head (token_embd), an untied one (output)
def test_mixed_roundings_take_each_product_from_gptq_or_rtn(arch, synth_gguf):
    """The schemes between rtn and gptq (head-gptq, hidden-gptq): each
    product's int8 weights are those of the gptq scheme (same calibration, same
    X^T X) where the scheme names it, else rtn's; calibration gathers X^T X for
    those products only, equal to a full run's."""
    from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
    from rkc.compiler.llm.build import CompileReport, LlmCompileOptions, prepare_weights
    from rkc.compiler.llm.calibrate import calibrate
    from rkc.compiler.llm.quantize import ROUNDINGS, method_for
    from rkc.compiler.llm.weights import dequantize_all
    from rkc.runtime.llm.tokenizer import LlmTokenizer

    path = synth_gguf(arch)
    gf = GgufFile(path)
    graph, cfg = graph_from_gguf(gf), gf.config()
    tokenizer = LlmTokenizer.from_gguf(str(path))
    consts = [n for n, t in graph.tensors.items() if t.kind == "const"]
    head = next(op.inputs[1] for op in graph.ops if op.type == "Linear" and op.outputs[0] == "logits")
    built, reports = {}, {}
    for rounding in ROUNDINGS:
        reports[rounding] = CompileReport()
        built[rounding], _ = prepare_weights(graph, cfg, tokenizer, dequantize_all(gf, consts),
                                             LlmCompileOptions("int8", (1,), rounding=rounding), reports[rounding])
    products = [n for n, e in built["rtn"].items() if e.scale is not None]
    differ = [n for n in products if not np.array_equal(built["gptq"][n].data, built["rtn"][n].data)]
    assert head in differ and len(differ) > len(products) // 2  # so the checks below can fail
    weights = dequantize_all(gf, consts)
    every = calibrate(graph, cfg, weights, tokenizer, hessians=True)
    for rounding in set(ROUNDINGS) - {"rtn", "gptq"}:
        chosen = {n: method_for(rounding, n, n == head) for n in products}
        assert chosen[head] == "gptq" and "rtn" in chosen.values()
        for name in products:
            assert np.array_equal(built[rounding][name].data, built[chosen[name]][name].data), (rounding, name)
        assert f"rounded by {rounding} ({ROUNDINGS[rounding].summary})" in "\n".join(reports[rounding].lines)
        assert reports[rounding].quantization["rounding"] == rounding
        gptq_only = {n for n, m in chosen.items() if m == "gptq"}
        cal = calibrate(graph, cfg, weights, tokenizer, hessians=gptq_only)
        assert set(cal.hessians) == gptq_only
        for name in gptq_only:
            assert np.array_equal(cal.hessians[name], every.hessians[name]), name
