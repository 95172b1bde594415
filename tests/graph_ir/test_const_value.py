"""Graph.const_value: the one question every rewrite asks before folding a value."""

import numpy as np

from rkc.compiler.qdq import absorb_qdq
from rkc.ir.graph import Graph
from rkc.ir.types import DType, TensorType

F4 = TensorType(DType.FP32, (4,))


def _graph() -> Graph:
    g = Graph()
    g.add_input("x", F4)
    g.add_const("w", F4, np.arange(4, dtype=np.float32))
    g.add_const("unloaded", TensorType(DType.INT8, (4,)), payload="blob")  # as parsed from text
    g.add_op("Relu", ["x"], [("y", F4)])
    return g


def test_a_loaded_constant_gives_its_payload():
    np.testing.assert_array_equal(_graph().const_value("w"), np.arange(4, dtype=np.float32))


def test_anything_else_gives_none():
    g = _graph()
    for name in ("", "x", "y", "nowhere", "unloaded"):
        assert g.const_value(name) is None, name


def test_qdq_leaves_a_dequantize_of_an_unloaded_constant_alone():
    # qdq.py's own _const skipped the payload check and raised KeyError here
    g = _graph()
    g.add_const("s", TensorType(DType.FP32, ()), np.array(0.5, np.float32))
    g.add_op("DequantizeLinear", ["unloaded", "s"], [("dq", F4)])
    g.outputs = ["y", "dq"]
    absorb_qdq(g, fold_activations=True)
    assert [op.type for op in g.ops] == ["Relu", "DequantizeLinear"]
