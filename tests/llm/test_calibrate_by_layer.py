"""Calibration runs the float model one layer at a time (only that layer's
weights in fp32, the embedding's rows read from the file): its ranges and X^T X
are exactly those of a whole-model run over the same chunks."""

import numpy as np
import pytest

from llm.synth import SHAPES
from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf
from rkc.compiler.llm.calibrate import (CALIBRATION_TEXT, WINDOW, GraphRunner, _run_windows, calibrate,
                                        calibration_windows, layer_stages)
from rkc.compiler.llm.weights import LazyWeights, dequantize_all
from rkc.runtime.llm.tokenizer import LlmTokenizer
from rkc.runtime.llm.weights import Weight


def _whole_model_ranges(graph, cfg, weights, tokenizer, text):
    """Every Linear's input max |x| and X^T X from a whole-model run (the
    calibration before it streamed), recorded independently of calibrate()."""
    ranges, hessians, seen = {}, {}, set()

    def observe(op, ins, chunk_no):
        if op.type != "Linear":
            return True
        x = np.asarray(ins[0], np.float32)
        w = op.inputs[1]
        ranges[w] = np.maximum(ranges.get(w, 0), np.abs(x).max(axis=0))
        if (op.inputs[0], chunk_no) not in seen:
            seen.add((op.inputs[0], chunk_no))
            h = hessians.setdefault(op.inputs[0], np.zeros((x.shape[1], x.shape[1])))
            h += x.astype(np.float64).T @ x.astype(np.float64)
        return op.outputs[0] != "logits"

    runner = GraphRunner(graph, cfg, {n: Weight(w) for n, w in weights.items()}, WINDOW + 1)
    _run_windows(runner, calibration_windows(tokenizer, text), 64, observe)
    return ranges, hessians


@pytest.mark.parametrize("arch", sorted(SHAPES) + ["gemma4", "gemma4-shared"])
def test_layer_by_layer_calibration_equals_whole_model_run(arch, synth_gguf, tmp_path):
    """Also for gemma4's shared KV: a later layer attends over an earlier
    layer's cache, carried per chunk from the earlier layer's stage."""
    path = _gguf(arch, synth_gguf, tmp_path)
    gf = GgufFile(path)
    graph, cfg = graph_from_gguf(gf), gf.config()
    tokenizer = LlmTokenizer.from_gguf(str(path))
    consts = [n for n, t in graph.tensors.items() if t.kind == "const"]
    text = CALIBRATION_TEXT.read_text()[:4000]  # several windows, a shorter test
    ranges, hessians = _whole_model_ranges(graph, cfg, dequantize_all(gf, consts), tokenizer, text)
    assert len(layer_stages(graph)) == cfg.n_layer + 1
    for weights in (dequantize_all(gf, consts), LazyWeights(gf, consts)):
        cal = calibrate(graph, cfg, weights, tokenizer, hessians=True, text=text)
        assert sorted(cal.ranges) == sorted(ranges)
        for name, r in ranges.items():
            assert np.array_equal(cal.ranges[name], r), name
        linear_input = {op.inputs[1]: op.inputs[0] for op in graph.ops if op.type == "Linear"}
        for name, h in cal.hessians.items():
            assert np.array_equal(h, hessians[linear_input[name]]), name


def _gguf(kind: str, synth_gguf, tmp_path):
    from llm.synth import write_gemma4

    return write_gemma4(tmp_path / f"{kind}.gguf", kind) if kind.startswith("gemma4") else synth_gguf(kind)


@pytest.mark.parametrize("kind", sorted(SHAPES) + ["gemma4", "gemma4-shared"])
def test_streamed_weight_preparation_equals_whole_model(kind, synth_gguf, tmp_path):
    """prepare_streamed (layer by layer from the mapped file) encodes every
    matrix and vector exactly as prepare_weights does from a whole fp32 copy,
    under the default int8 scheme (calibration, SmoothQuant, rotation)."""
    from rkc.compiler.llm.build import LlmCompileOptions, prepare_weights
    from rkc.compiler.llm.weights import RowTable, gather_only_tables

    path = _gguf(kind, synth_gguf, tmp_path)
    gf = GgufFile(path)
    graph, cfg = graph_from_gguf(gf), gf.config()
    tokenizer = LlmTokenizer.from_gguf(str(path))
    tables = gather_only_tables(graph)
    consts = [n for n, t in graph.tensors.items() if t.kind == "const" and n not in tables]
    results = []
    whole = {**dequantize_all(gf, consts), **{name: RowTable(gf, name) for name in tables}}
    for weights in (whole, LazyWeights(gf, consts, tables)):
        results.append(prepare_weights(graph, cfg, tokenizer, weights, LlmCompileOptions("int8", (1, 4, 16))))
    (whole_m, whole_v), (streamed_m, streamed_v) = results
    assert sorted(whole_m) == sorted(streamed_m) and sorted(whole_v) == sorted(streamed_v)
    for name, enc in whole_m.items():
        assert np.array_equal(np.asarray(enc.data), np.asarray(streamed_m[name].data)), name
        assert (enc.scale is None) == (streamed_m[name].scale is None), name
        if enc.scale is not None:
            assert np.array_equal(enc.scale, streamed_m[name].scale), name
    for name, v in whole_v.items():
        assert np.array_equal(v, streamed_v[name]), name
