"""Rewrites keep the numbers: BatchNorm folding, Erf-GELU and LayerNorm fusion."""

import numpy as np

from compiler.frontend import load_graph
from compiler.passes import run_passes
from compiler.reference import run_graph
from onnx_models import example, save


def _before_after(tmp_path, module: str, shape):
    g = load_graph(save(example(module).build_model(), tmp_path / "m.onnx"))
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    before = run_graph(g, {"x": x})
    types_before = [op.type for op in g.ops]
    run_passes(g)
    after = run_graph(g, {"x": x})
    return types_before, [op.type for op in g.ops], before, after


def test_batchnorm_folds_into_conv(tmp_path):
    before_types, after_types, before, after = _before_after(tmp_path, "small_cnn", (1, 3, 32, 32))
    assert "BatchNormalization" in before_types and "BatchNormalization" not in after_types
    np.testing.assert_allclose(after["probs"], before["probs"], rtol=1e-5, atol=1e-6)


def test_gelu_and_layernorm_patterns_fuse(tmp_path):
    before_types, after_types, before, after = _before_after(tmp_path, "mlp", (4, 64))
    assert "Erf" in before_types and "Erf" not in after_types and after_types.count("Gelu") == 2
    assert "LayerNormalization" in after_types and "ReduceMean" not in after_types
    (name,) = before
    np.testing.assert_allclose(after[name], before[name], rtol=1e-4, atol=1e-5)
