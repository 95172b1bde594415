"""The NPU op declarations agree: every operation of the emitter API has one
emitter, every graph op declared to run on the NPU has a builder and the other
way round, and compiler/npu/api.py stays a leaf (the contract, no implementers)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc.compiler import emitter_builders, emitter_graph, emitter_norm, emitter_ops
from rkc.compiler.frontend import load_graph
from rkc.compiler.npu import api, dispatch, mesa
from rkc.compiler.ops import OPS
from onnx_models import save, single_op


def test_every_api_operation_has_one_emitter():
    assert set(dispatch.LOWERINGS) == {*api.OPERATIONS, mesa.MesaConv}


def test_every_lookup_table_function_of_the_api_has_a_table():
    from rkc.compiler.npu import lut

    assert set(api.LUT_FUNCTIONS) == set(lut.FUNCTIONS)


def test_api_is_a_leaf():
    """Importing the contract loads no emitter, dispatcher or assembler."""
    code = ("import sys, rkc.compiler.npu.api\n"
            "print(' '.join(m for m in sys.modules if m.startswith('rkc.compiler') and m not in "
            "('rkc.compiler', 'rkc.compiler.npu', 'rkc.compiler.npu.api')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []


# -- graph ops: the OpSpec's NpuLowering is the one declaration ----------------------------
X = np.zeros((1, 16, 8, 8), np.float32)
A = np.zeros((4, 32), np.float32)
RNG = np.random.default_rng(0)

# one small model per op declared to anchor an NPU group: (inputs, constants, attributes, opset)
ANCHOR_CASES = {
    "Conv": ({"x": X}, {"w": RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)}, {"pads": [1, 1, 1, 1]}, 17),
    "Gemm": ({"x": A}, {"b": RNG.standard_normal((32, 16)).astype(np.float32)}, {}, 17),
    "MatMul": ({"x": A}, {"b": RNG.standard_normal((32, 16)).astype(np.float32)}, {}, 17),
    **{op: ({"x": X, "x2": X}, {}, {}, 17) for op in ("Add", "Mul", "Max", "Min", "Sum")},
    **{op: ({"x": X}, {}, {}, 17) for op in ("Sigmoid", "Tanh", "HardSwish")},
    "HardSigmoid": ({"x": X}, {}, {"alpha": 1 / 6, "beta": 0.5}, 17),
    "Gelu": ({"x": X}, {}, {}, 20),
    "Swish": ({"x": X}, {}, {}, 24),
    "AveragePool": ({"x": X}, {}, {"kernel_shape": [2, 2], "strides": [2, 2]}, 17),
    "GlobalAveragePool": ({"x": X}, {}, {}, 17),
    "MaxPool": ({"x": X}, {}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 17),
    "ConvTranspose": ({"x": X}, {"w": RNG.standard_normal((16, 8, 2, 2)).astype(np.float32)},
                      {"kernel_shape": [2, 2], "strides": [2, 2]}, 17),
    "Resize": ({"x": np.zeros((1, 32, 8, 8), np.float32)},
               {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
               {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, 17),
    "LRN": ({"x": X}, {}, {"size": 5}, 17),
}


def _declared(anchors: bool) -> dict[str, object]:
    return {name: spec.lower for name, spec in OPS.items() if spec.lower is not None and spec.lower.anchors == anchors}


def test_every_declared_operation_has_a_builder_and_every_builder_a_declaration():
    declared = {how.operation for how in _declared(True).values()}
    assert declared == set(emitter_builders.BUILDERS), "an NpuLowering names an operation without a builder, or a " \
                                                  "builder serves no OpSpec"
    assert set(emitter_builders.BUILDERS) <= set(dispatch.LOWERINGS)


def test_declared_functions_are_the_dpu_functions():
    for name, spec in OPS.items():
        how = spec.lower
        if how is None:
            continue
        allowed = {api.Elementwise: api.ELEMENTWISE_OPS, api.Activation: api.LUT_FUNCTIONS, api.Pool: ("avg", "max"),
                   None: api.ACTIVATIONS}.get(how.operation)
        if allowed is not None:
            assert how.function in allowed, (name, how.function)


def test_every_anchor_op_has_a_case_here():
    """Declaring a new NPU op makes this fail until it has a model below."""
    assert set(_declared(True)) == set(ANCHOR_CASES)


@pytest.mark.parametrize("op_type", sorted(ANCHOR_CASES))
def test_a_declared_op_lowers_to_its_operation(tmp_path, op_type):
    inputs, consts, attrs, opset = ANCHOR_CASES[op_type]
    graph = load_graph(save(single_op(op_type, inputs, consts, opset=opset, **attrs), tmp_path / "m.onnx"))
    # the inputs' ranges as a calibration gives them (LRN's table needs its input's)
    graph.metadata[emitter_norm.CALIBRATED_MAX] = [[name, 1.0] for name in graph.inputs]
    # fp16 max pooling is a PPU task for a kernel that completes those (--kernel-ppu-irq); elsewhere DPU
    # taps, kept only where they model less NPU time than the CPU kernel takes
    options = emitter_graph.emit_options(3, ppu_completes=op_type == "MaxPool")
    groups, reasons = emitter_ops.plan_groups(graph, "fp16", lambda i: True, options=options)
    assert 0 in groups, reasons
    how = OPS[op_type].lower
    built = groups[0].result.op
    assert isinstance(built, how.operation)
    field = {api.Elementwise: "op", api.Activation: "function", api.Pool: "method"}.get(how.operation)
    if field is not None:
        assert getattr(built, field) == how.function


@pytest.mark.parametrize("op_type", sorted(name for name, how in OPS.items()
                                           if how.lower is not None and how.lower.operation in (None, api.Activation)))
def test_an_epilogue_op_folds_into_the_conv_before_it(tmp_path, op_type):
    attrs = dict(ANCHOR_CASES.get(op_type, ({}, {}, {}, 17))[2])
    extra = []
    consts = {"w": RNG.standard_normal((16, 16, 1, 1)).astype(np.float32)}
    if op_type == "Clip":
        consts |= {"lo": np.float32(0), "hi": np.float32(6)}
        extra = ["lo", "hi"]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node(op_type, ["c", *extra], ["y"], **attrs)]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    opset = ANCHOR_CASES.get(op_type, ({}, {}, {}, 17))[3]
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    graph = load_graph(save(model, tmp_path / "m.onnx"))
    groups, reasons = emitter_ops.plan_groups(graph, "fp16", lambda i: True)
    assert groups[0].ops == [0, 1], reasons
    want = {"clip": "relu6"}.get(OPS[op_type].lower.function, OPS[op_type].lower.function)
    assert groups[0].result.op.epilogue.activation == want
