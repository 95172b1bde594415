"""The graph IR: tensors, ops and a graph with a verifier.

A Graph is a list of ops over named tensors. Graph inputs and constants are
declared; every other tensor is declared by the one op that produces it.
Constant payloads live in `Graph.payloads` under a name the tensor refers to,
so the text form can reference them instead of inlining megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence, Union

import networkx as nx
import numpy as np

from rkc.ir.errors import VerifyError
from rkc.ir.types import BlockQuant, PerAxisQuant, TensorType, check_tensor_size


@dataclass(frozen=True)
class PayloadRef:
    """An attribute value that refers to a graph payload by name."""

    name: str


AttrValue = Union[int, float, str, PayloadRef, list]


@dataclass
class Tensor:
    name: str
    type: TensorType
    # "input", "const" or "value" (produced by an op)
    kind: str = "value"
    # for constants: the key of the payload in Graph.payloads
    payload: str | None = None

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def shape(self):
        return self.type.shape


@dataclass
class Op:
    type: str
    inputs: list[str]  # "" marks an absent optional input
    outputs: list[str]
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    name: str | None = None

    def present_inputs(self) -> list[str]:
        return [i for i in self.inputs if i]

    def describe(self) -> str:
        return f"{self.type} {self.name!r}" if self.name else f"{self.type} -> {', '.join(self.outputs)}"


# infer(op, input types) -> output types, or None when the rule does not know the op
ShapeRule = Callable[[Op, Sequence[TensorType | None]], Sequence[TensorType] | None]


@dataclass
class Graph:
    name: str = "graph"
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    payloads: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict[str, AttrValue] = field(default_factory=dict)

    # -- building -------------------------------------------------------------
    def _declare(self, tensor: Tensor) -> Tensor:
        if tensor.name in self.tensors:
            raise VerifyError(f"tensor {tensor.name!r} is declared twice")
        if not tensor.name:
            raise VerifyError("a tensor needs a non-empty name")
        self.tensors[tensor.name] = tensor
        return tensor

    def add_input(self, name: str, type: TensorType) -> Tensor:
        self.inputs.append(name)
        return self._declare(Tensor(name, type, "input"))

    def add_const(self, name: str, type: TensorType, data: np.ndarray | None = None,
                  payload: str | None = None) -> Tensor:
        key = payload or name
        if data is not None:
            self.payloads[key] = data
        return self._declare(Tensor(name, type, "const", key))

    def add_op(self, type: str, inputs: Iterable[str], outputs: Iterable[tuple[str, TensorType]],
               attrs: Mapping[str, AttrValue] | None = None, name: str | None = None) -> Op:
        outs = list(outputs)
        for out_name, out_type in outs:
            self._declare(Tensor(out_name, out_type, "value"))
        op = Op(type, list(inputs), [n for n, _ in outs], dict(attrs or {}), name)
        self.ops.append(op)
        return op

    # -- queries --------------------------------------------------------------
    def producers(self) -> dict[str, Op]:
        return {o: op for op in self.ops for o in op.outputs}

    def consumers(self) -> dict[str, list[Op]]:
        result: dict[str, list[Op]] = {name: [] for name in self.tensors}
        for op in self.ops:
            for i in op.present_inputs():
                result.setdefault(i, []).append(op)
        return result

    def payload(self, tensor: str) -> np.ndarray:
        t = self.tensors[tensor]
        if t.payload is None or t.payload not in self.payloads:
            raise VerifyError(f"constant {tensor!r} has no payload loaded")
        return self.payloads[t.payload]

    def const_value(self, name: str) -> np.ndarray | None:
        """The payload of constant `name`; None when `name` is empty (an absent
        optional input), not a constant, or a constant whose payload is not loaded
        (parsed from text): what a rewrite asks before it folds a value."""
        t = self.tensors.get(name) if name else None
        if t is None or t.kind != "const" or t.payload not in self.payloads:
            return None
        return self.payloads[t.payload]

    def dependency_graph(self) -> nx.DiGraph:
        """Op-level DiGraph: nodes are op indices, edges producer -> consumer."""
        g = nx.DiGraph()
        g.add_nodes_from(range(len(self.ops)))
        producer_index = {o: i for i, op in enumerate(self.ops) for o in op.outputs}
        for i, op in enumerate(self.ops):
            for name in op.present_inputs():
                if name in producer_index:
                    g.add_edge(producer_index[name], i)
        return g

    def topological_ops(self) -> list[Op]:
        """Ops in a dependency order, stable with respect to the current list."""
        g = self.dependency_graph()
        try:
            order = list(nx.lexicographical_topological_sort(g))
        except nx.NetworkXUnfeasible:
            raise VerifyError(f"graph {self.name!r} has a cycle: {self._cycle_text(g)}") from None
        return [self.ops[i] for i in order]

    def _cycle_text(self, g: nx.DiGraph) -> str:
        cycle = nx.find_cycle(g)
        return " -> ".join(self.ops[a].describe() for a, _ in cycle)

    # -- verification ---------------------------------------------------------
    def verify(self, infer: ShapeRule | None = None) -> None:
        """Raise VerifyError naming the first inconsistency found."""
        produced: set[str] = set()
        for op in self.ops:
            if not op.outputs:
                raise VerifyError(f"op {op.describe()} has no outputs")
            for out in op.outputs:
                t = self.tensors.get(out)
                if t is None:
                    raise VerifyError(f"op {op.describe()} writes undeclared tensor {out!r}")
                if t.kind != "value":
                    raise VerifyError(f"op {op.describe()} overwrites {t.kind} tensor {out!r}")
                if out in produced:
                    raise VerifyError(f"tensor {out!r} is produced by more than one op")
                produced.add(out)
            for name in op.present_inputs():
                if name not in self.tensors:
                    raise VerifyError(f"op {op.describe()} reads dangling tensor {name!r} (never declared)")
        for name, t in self.tensors.items():
            if t.kind == "value" and name not in produced:
                raise VerifyError(f"tensor {name!r} is declared but no op produces it")
            # a constant whose bytes are at hand (e.g. mapped from a GGUF file, read by
            # rows: Gemma 4 E2B's per-layer table is 262144 x 8960) allocates nothing by
            # its shape; the NPU's copies are bounded by the IOVA window (memplan)
            if t.type is not None and not (t.kind == "const" and t.payload in self.payloads):
                check_tensor_size(t.type.shape, t.type.dtype.itemsize, f"tensor {name!r}")
            if t.kind == "const":
                self._verify_const(t)
            if isinstance(t.type.quant, PerAxisQuant):
                self._verify_axis_quant(t)
        for name in self.inputs:
            if self.tensors.get(name, Tensor(name, None, "?")).kind != "input":  # type: ignore[arg-type]
                raise VerifyError(f"graph input {name!r} is not declared as an input")
        for name in self.outputs:
            if name not in self.tensors:
                raise VerifyError(f"graph output {name!r} is dangling (never declared)")
        ordered = self.topological_ops()  # raises on a cycle
        if infer is not None:
            for op in ordered:
                self._verify_types(op, infer)

    def _verify_const(self, t: Tensor) -> None:
        if t.payload is None:
            raise VerifyError(f"constant {t.name!r} has no payload reference")
        data = self.payloads.get(t.payload)
        if data is None:
            return  # payloads not loaded (e.g. parsed from text): reference only
        if isinstance(t.type.quant, BlockQuant):
            return  # raw GGUF blocks: byte layout, not the logical shape
        if tuple(data.shape) != tuple(t.shape):
            raise VerifyError(f"constant {t.name!r} is declared {list(t.shape)} but its payload is "
                              f"{list(data.shape)}")
        if data.dtype != t.dtype.numpy:
            raise VerifyError(f"constant {t.name!r} is declared {t.dtype.value} but its payload is {data.dtype}")

    def _verify_axis_quant(self, t: Tensor) -> None:
        q = t.type.quant
        assert isinstance(q, PerAxisQuant)
        rank = len(t.shape)
        if not -rank <= q.axis < max(rank, 1):
            raise VerifyError(f"tensor {t.name!r}: quantization axis {q.axis} out of range for rank {rank}")
        for ref in (q.scale, q.zero_point):
            data = self.payloads.get(ref)
            if data is not None and isinstance(t.shape[q.axis], int) and data.size != t.shape[q.axis]:
                raise VerifyError(f"tensor {t.name!r}: {data.size} quantization parameters in {ref!r} "
                                  f"for axis {q.axis} of size {t.shape[q.axis]}")

    def _verify_types(self, op: Op, infer: ShapeRule) -> None:
        in_types = [self.tensors[i].type if i else None for i in op.inputs]
        expected = infer(op, in_types)
        if expected is None:
            return
        if len(expected) != len(op.outputs):
            raise VerifyError(f"op {op.describe()} has {len(op.outputs)} outputs, its rule gives {len(expected)}")
        for name, want in zip(op.outputs, expected):
            got = self.tensors[name].type
            if got.dtype != want.dtype:
                raise VerifyError(f"op {op.describe()}: output {name!r} is {got.dtype.value}, "
                                  f"the op gives {want.dtype.value}")
            if len(got.shape) != len(want.shape) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(got.shape, want.shape)
            ):
                raise VerifyError(f"op {op.describe()}: output {name!r} is {list(got.shape)}, "
                                  f"the op gives {list(want.shape)}")
