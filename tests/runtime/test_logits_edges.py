"""A classifier's tail in one pass (runtime/logits_edges.py, softmax_jit.softmax_of_logits):
the logits' atoms (int8 codes, fp16 bits; padding lanes holding garbage; rows stored padded)
dequantized or widened and their softmax taken, against a float64 reference over class
counts that leave atoms whole and partial; and a classifier compiled int8 and fp16 gives,
end to end, the interpreter's probabilities within float32 rounding and onnxruntime's
within the precision's bound."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from rkc import runtime
from rkc.runtime import logits_edges
from rkc.runtime.kernels import softmax_jit
from onnx_models import compile_calibrated, cosine, graph_model, onnxruntime_outputs, save

CLASSES = [1, 2, 7, 8, 16, 37, 1000, 1001]


def _atoms(codes: np.ndarray, c2: int, rows: int, rng) -> np.ndarray:
    """codes [C] as one pixel's atoms [C1, rows, 1, C2] (row 0 holds them; the other rows and
    the lanes past C garbage), the way the NPU stores a [1, C, 1, 1] map."""
    c1 = -(-codes.size // c2)
    fm = rng.integers(0, 256, (c1, rows, 1, c2 * codes.itemsize), dtype=np.uint8).view(codes.dtype)
    k = np.arange(codes.size)
    fm[k // c2, 0, 0, k % c2] = codes
    return fm


def _softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# float32's exp (a polynomial within ~2 ulp), its sum and the division: relative error ~1e-6
RTOL, ATOL = 4e-6, 1e-30


@pytest.mark.parametrize("c", CLASSES)
@pytest.mark.parametrize("rows", [1, 4])
def test_int8_logits_softmax_is_the_float64_reference(c, rows):
    rng = np.random.default_rng(c * 10 + rows)
    codes = rng.integers(-128, 128, c, dtype=np.int8)
    codes[: min(c, 2)] = [127, -128][: min(c, 2)]  # both ends
    for scale, zp in ((0.0625, 0), (0.173, -9), (2.0 ** -9, 127)):
        fm = _atoms(codes, 16, rows, rng)
        out = np.full(c, np.nan, np.float32)
        softmax_jit.softmax_of_logits(fm[:, :1][:, 0, 0], (np.float32(scale), zp), out)
        want = _softmax64((codes.astype(np.float64) - zp) * np.float64(np.float32(scale)))
        np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c", CLASSES)
@pytest.mark.parametrize("rows", [1, 4])
def test_fp16_logits_softmax_is_the_float64_reference(c, rows):
    rng = np.random.default_rng(c * 10 + rows + 5)
    values = (rng.standard_normal(c) * 8).astype(np.float16)
    values[: min(c, 3)] = np.array([65504, -65504, 6e-8], np.float16)[: min(c, 3)]  # the max dominates
    fm = _atoms(values.view(np.uint16), 8, rows, rng)
    out = np.full(c, np.nan, np.float32)
    softmax_jit.softmax_of_logits(fm[:, :1][:, 0, 0], None, out)
    np.testing.assert_allclose(out, _softmax64(values.astype(np.float64)), rtol=RTOL, atol=ATOL)
    if c > 3:  # ordinary logits: every probability well inside float32's range
        values[:3] = 0
        fm = _atoms(values.view(np.uint16), 8, rows, rng)
        softmax_jit.softmax_of_logits(fm[:, :1][:, 0, 0], None, out)
        np.testing.assert_allclose(out, _softmax64(values.astype(np.float64)), rtol=RTOL, atol=ATOL)


def _classifier(classes: int, reshape: bool):
    """Conv -> ReLU -> global average pool -> 1x1 Conv (the logits) -> Flatten (or Reshape) ->
    Softmax."""
    rng = np.random.default_rng(classes)
    flat = helper.make_node("Reshape", ["l", "shape"], ["f"]) if reshape else helper.make_node("Flatten", ["l"], ["f"])
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]), helper.make_node("GlobalAveragePool", ["r0"], ["g"]),
             helper.make_node("Conv", ["g", "w1", "b1"], ["l"]), flat,
             helper.make_node("Softmax", ["f"], ["y"], axis=1)]
    inits = {"w0": rng.standard_normal((24, 3, 3, 3)) / 3, "b0": rng.standard_normal(24) * 0.1,
             "w1": rng.standard_normal((classes, 24, 1, 1)) / 2, "b1": rng.standard_normal(classes) * 0.1}
    if reshape:
        inits["shape"] = np.array([1, classes], np.int64)
    model = graph_model(nodes, {k: v for k, v in inits.items() if k != "shape"}, [1, 3, 10, 12])
    if reshape:
        model.graph.initializer.append(numpy_helper.from_array(inits["shape"], "shape"))
    return model


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("classes, reshape", [(37, False), (1000, True)])
def test_a_classifier_tail_is_the_interpreters_steps(tmp_path, precision, classes, reshape, monkeypatch):
    path = save(_classifier(classes, reshape), tmp_path / "m.onnx")
    _, rng = compile_calibrated(tmp_path, path, (1, 3, 10, 12), precision, 5, int8_only=precision == "int8")
    x, x2 = rng.standard_normal((2, 1, 3, 10, 12)).astype(np.float32)
    tails = []
    real_plan = logits_edges.logits_plan

    def counted(run, steps):
        tail = real_plan(run, steps)
        tails.append(tail is not None)
        return tail
    monkeypatch.setattr(logits_edges, "logits_plan", counted)
    with runtime.load(tmp_path / "m.rkbin") as model:
        fast, again = model.run({"x": x})["y"], model.run({"x": x2})["y"]  # the second: the kept closure
    assert tails == [True], tails
    monkeypatch.setattr(logits_edges, "logits_chain_end", lambda *args: None)
    with runtime.load(tmp_path / "m.rkbin") as model:
        slow, slow2 = model.run({"x": x})["y"], model.run({"x": x2})["y"]
    assert fast.shape == slow.shape == (1, classes) and fast.dtype == np.float32
    np.testing.assert_allclose(fast, slow, rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(again, slow2, rtol=RTOL, atol=1e-12)
    want = onnxruntime_outputs(path, {"x": x})["y"]
    assert cosine(fast, want) >= (0.999 if precision == "fp16" else 0.99)  # test_feature_edges' bounds
