"""Every op rkc knows, in one place per op (family): its shape rule, its NPU
constraints, its NPU lowering and the name of its CPU kernel.

The `lower` of an OpSpec is the one declaration of how the op reaches the NPU
(an `NpuLowering`): compiler/emitter_ops.py derives from it which ops anchor an
NPU group, which builder makes their emitter operation and which fold into an
epilogue; tests/npu/test_op_declarations.py checks the tables agree
(docs/adding-an-op.md).

Op support is data: an `OpSpec` per op type. Each NPU constraint is a small
function of an `OpContext` whose docstring is the reason a user reads when the
op falls back to the CPU (`rkc compile --explain`, `rkc ops`,
docs/supported-ops.md). The numpy kernels themselves live in runtime/kernels
(the runtime runs an rkbin without the compiler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from rkc.compiler.npu import api
from rkc.ir.errors import UnsupportedError
from rkc.ir.graph import Graph, Op, ShapeRule
from rkc.ir.types import TensorType
from rkc.runtime.kernels import KERNELS, check_binding


@dataclass
class OpContext:
    """What a shape rule or a constraint may look at: the op, its graph (types
    and constant payloads) and the compile options."""

    op: Op
    graph: Graph
    precision: str = "fp16"
    in_types: Sequence[TensorType | None] | None = None

    def type(self, i: int) -> TensorType | None:
        if self.in_types is not None:
            return self.in_types[i] if i < len(self.in_types) else None
        name = self.op.inputs[i] if i < len(self.op.inputs) else ""
        return self.graph.tensors[name].type if name else None

    def out_type(self, i: int = 0) -> TensorType:
        return self.graph.tensors[self.op.outputs[i]].type

    def has(self, i: int) -> bool:
        return i < len(self.op.inputs) and bool(self.op.inputs[i])

    def const(self, i: int) -> np.ndarray | None:
        """The value of input i when it is a constant with a loaded payload."""
        return self.graph.const_value(self.op.inputs[i]) if self.has(i) else None

    def attr(self, name: str, default=None):
        return self.op.attrs.get(name, default)

    @property
    def n_inputs(self) -> int:
        return len(self.op.inputs)


Constraint = Callable[[OpContext], bool]
InferRule = Callable[[OpContext], Sequence[TensorType]]


@dataclass(frozen=True)
class NpuLowering:
    """How a graph op reaches the NPU.

    `operation`: the emitter API operation it becomes on its own (an anchor of an
    NPU group; compiler/emitter_builders.BUILDERS builds it), or None when it only
    folds into the epilogue of the convolution or matrix product before it.
    `function`: the DPU's name for what it computes: the `Elementwise.op`
    (api.ELEMENTWISE_OPS), the lookup-table or epilogue activation
    (api.ACTIVATIONS). `exact`: for an activation, whether the DPU's function is
    this op's as ONNX defines it, given its attributes (default: always)."""

    operation: type | None
    function: str | None = None
    exact: Callable[[Op], bool] | None = None

    @property
    def anchors(self) -> bool:
        return self.operation is not None

    def activation(self, op: Op) -> str | None:
        """The DPU activation computing `op` (a lookup table or an epilogue stage), or None."""
        if self.function not in api.ACTIVATIONS or (self.exact is not None and not self.exact(op)):
            return None
        return self.function


@dataclass(frozen=True)
class OpSpec:
    name: str
    infer: InferRule
    # every constraint must hold for the op to run on the NPU; the docstring of
    # the first that fails is the reason it runs on the CPU instead
    npu: Sequence[Constraint] = ()
    # how the op reaches the NPU (compiler/emitter_ops.py), None: not yet
    lower: NpuLowering | None = None
    kernel: str = ""  # CPU kernel name in runtime.kernels; defaults to the op name
    summary: str = ""  # one line for the supported-op table
    # checks on the CPU kernel's limits (docstring: why the model cannot compile)
    cpu: Sequence[Constraint] = field(default_factory=tuple)

    @property
    def kernel_name(self) -> str:
        return self.kernel or self.name


def _load_specs() -> dict[str, OpSpec]:
    # here: each op module imports this package (OpSpec, NpuLowering)
    from rkc.compiler.ops import conv, elementwise, matmul, norm, pool, quant, reduce, resize, shape

    specs: dict[str, OpSpec] = {}
    for module in (elementwise, conv, matmul, pool, norm, reduce, shape, resize, quant):
        for spec in module.SPECS:
            if spec.name in specs:
                raise RuntimeError(f"op {spec.name} is specified twice")
            specs[spec.name] = spec
    return specs


OPS: dict[str, OpSpec] = _load_specs()


def spec_for(op_type: str) -> OpSpec | None:
    return OPS.get(op_type)


def infer_for(graph: Graph, precision: str = "fp16") -> ShapeRule:
    """A Graph.verify `infer` callback that knows every op in OPS (and can read
    the graph's constants, which some shape rules need)."""

    def infer(op: Op, in_types: Sequence[TensorType | None]):
        spec = OPS.get(op.type)
        if spec is None:
            return None
        return spec.infer(OpContext(op, graph, precision, in_types))

    return infer


def npu_verdict(ctx: OpContext) -> tuple[bool, str]:
    """(runs on the NPU?, why) for one op."""
    spec = OPS.get(ctx.op.type)
    if spec is None:
        return False, f"rkc has no NPU lowering for {ctx.op.type}"
    for check in spec.npu:
        if not check(ctx):
            return False, (check.__doc__ or check.__name__).strip().splitlines()[0]
    if spec.lower is None:
        return False, f"no NPU lowering for {ctx.op.type} yet"
    return True, "all NPU constraints hold"


def check_cpu(ctx: OpContext) -> None:
    """Raise UnsupportedError when the op cannot run on the CPU either."""
    spec = OPS.get(ctx.op.type)
    name = spec.kernel_name if spec else ctx.op.type
    if name not in KERNELS:
        raise UnsupportedError(f"op {ctx.op.describe()}: rkc does not support {ctx.op.type} "
                               "(no NPU lowering and no CPU kernel)")
    for check in (spec.cpu if spec else ()):
        if not check(ctx):
            reason = (check.__doc__ or check.__name__).strip().splitlines()[0]
            raise UnsupportedError(f"op {ctx.op.describe()}: {reason}")
    check_binding(name, len(ctx.op.inputs), ctx.op.attrs, f"op {ctx.op.describe()}")
