"""The verifier names the first inconsistency: one test per class of error."""

import numpy as np
import pytest

from rkc.ir.errors import VerifyError
from rkc.ir.graph import Graph
from rkc.ir.text import parse_graph
from rkc.ir.types import DType, PerAxisQuant, TensorType

F = TensorType(DType.FP32, (1, 4))


def same_shape(op, in_types):
    """A toy shape rule: every op returns its first input's type."""
    return [in_types[0]] * len(op.outputs)


def test_a_well_formed_graph_verifies():
    g = parse_graph('graph "g" { input %x: fp32[1,4]  %y: fp32[1,4] = Relu(%x)  output %y }')
    g.verify(same_shape)


def test_dangling_input_is_rejected():
    g = parse_graph('graph "g" { input %x: fp32[1,4]  %y: fp32[1,4] = Add(%x, %ghost)  output %y }')
    with pytest.raises(VerifyError, match="dangling tensor 'ghost'"):
        g.verify()


def test_dangling_output_is_rejected():
    g = parse_graph('graph "g" { input %x: fp32[1,4]  output %nowhere }')
    with pytest.raises(VerifyError, match="graph output 'nowhere' is dangling"):
        g.verify()


def test_cycle_is_rejected():
    g = parse_graph('graph "g" { input %x: fp32[1,4]  %a: fp32[1,4] = Add(%x, %b)  '
                    '%b: fp32[1,4] = Relu(%a)  output %b }')
    with pytest.raises(VerifyError, match="cycle"):
        g.verify()


def test_tensor_declared_twice_is_rejected():
    with pytest.raises(VerifyError, match="declared twice"):
        parse_graph('graph "g" { input %x: fp32[1,4]  %x: fp32[1,4] = Relu(%x) }')


def test_shape_mismatch_is_rejected():
    g = parse_graph('graph "g" { input %x: fp32[1,4]  %y: fp32[1,5] = Relu(%x)  output %y }')
    with pytest.raises(VerifyError, match=r"output 'y' is \[1, 5\], the op gives \[1, 4\]"):
        g.verify(same_shape)


def test_dtype_mismatch_is_rejected():
    g = parse_graph('graph "g" { input %x: fp32[1,4]  %y: fp16[1,4] = Relu(%x)  output %y }')
    with pytest.raises(VerifyError, match="output 'y' is fp16, the op gives fp32"):
        g.verify(same_shape)


def test_constant_payload_must_match_its_declaration():
    g = Graph()
    g.add_const("w", F, np.zeros((2, 4), np.float32))
    with pytest.raises(VerifyError, match=r"declared \[1, 4\] but its payload is \[2, 4\]"):
        g.verify()
    g = Graph()
    g.add_const("w", F, np.zeros((1, 4), np.float16))
    with pytest.raises(VerifyError, match="declared fp32 but its payload is float16"):
        g.verify()


def test_per_axis_quantization_must_match_its_axis():
    g = Graph()
    g.payloads.update({"s": np.ones(3, np.float32), "z": np.zeros(3, np.int8)})
    g.add_const("w", TensorType(DType.INT8, (4, 2), PerAxisQuant(0, "s", "z")), np.zeros((4, 2), np.int8))
    with pytest.raises(VerifyError, match="3 quantization parameters in 's' for axis 0 of size 4"):
        g.verify()


def test_value_without_producer_is_rejected():
    g = Graph()
    g.add_input("x", F)
    g.tensors["orphan"] = g.tensors["x"].__class__("orphan", F, "value")
    with pytest.raises(VerifyError, match="no op produces it"):
        g.verify()


def test_malformed_text_gives_one_line():
    from rkc.ir.errors import FormatError

    with pytest.raises(FormatError) as info:
        parse_graph('graph "g" { input %x fp32[1,4] }', source="bad.txt")
    assert "\n" not in str(info.value) and str(info.value).startswith("bad.txt: not valid IR text")


def test_size_bound_spares_a_constant_whose_bytes_are_at_hand():
    """The 2 GiB bound guards what a shape would allocate: a constant with its
    payload (a mapped GGUF tensor: Gemma 4 E2B's per-layer table, 262144 x 8960,
    9.4 GB as fp32, read by rows) passes; the same shape as a value, or as a
    constant whose payload is not loaded, is refused."""
    from rkc.ir.types import BlockQuant

    big = (262144, 8960)
    g = Graph(name="g")
    g.add_input("ids", TensorType(DType.INT32, (1,)))
    g.add_const("table", TensorType(DType.FP32, big, BlockQuant("Q8_0")), np.zeros(16, np.uint8))
    g.add_op("Gather", ["table", "ids"], [("row", TensorType(DType.FP32, (1, 8960)))])
    g.outputs.append("row")
    g.verify()
    unloaded = parse_graph('graph "g" { input %x: fp32[1,4]  %y: fp32[1,4] = Relu(%x)  output %y }')
    unloaded.add_const("w", TensorType(DType.FP32, big), payload="w")
    with pytest.raises(VerifyError, match="tensor 'w': .* more than the 2 GiB"):
        unloaded.verify()
    value = parse_graph('graph "g" { input %x: fp32[262144,8960]  %y: fp32[262144,8960] = Relu(%x)  output %y }')
    with pytest.raises(VerifyError, match="tensor 'x': .* more than the 2 GiB"):
        value.verify()
