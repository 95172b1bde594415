"""numpy CPU kernels, registered by op name (ONNX op types).

A kernel is ``fn(*inputs, **attrs)``: inputs in the op's order (None for an
absent optional input), attributes by their ONNX names; it returns one array
or a tuple of arrays (one per output). The runtime looks kernels up here by
the name a CPU step gives; the compiler checks at compile time that the op's
attributes bind to the kernel's signature (`check_binding`).
"""

from __future__ import annotations

import inspect
from typing import Callable, Mapping, Sequence

import numpy as np

from rkc.ir.errors import UnsupportedError
from rkc.runtime.kernels import conv, elementwise, nn, quant, reduce, shape

Kernel = Callable[..., "np.ndarray | tuple[np.ndarray, ...]"]

KERNELS: Mapping[str, Kernel] = {
    **elementwise.KERNELS, **conv.KERNELS, **nn.KERNELS, **reduce.KERNELS,
    **shape.KERNELS, **quant.KERNELS,
}

# kernels only the compiler's lowering emits (compiler/program_steps.py, compiler/relayout.py): steps
# between NPU buffers, not ONNX ops a model may contain
LOWERING_ONLY: frozenset[str] = frozenset({"Relayout", "ScaledSoftmax", "SoftmaxTranspose"})

# what a step's first output must be, decidable from its inputs' declared shapes
# (runtime/module_check.py): numpy elementwise semantics broadcast every input;
# normalizations keep their first input's shape
BROADCASTING: frozenset[str] = frozenset(elementwise.KERNELS)
SHAPE_OF_FIRST: frozenset[str] = frozenset({"Softmax", "ScaledSoftmax", "LogSoftmax", "LayerNormalization",
                                            "BatchNormalization", "InstanceNormalization"})


# kernels that never reach a BLAS product (element-wise, shape and reduction ops, softmax, layer
# normalization, per-tensor (de)quantization: no np.matmul / dot / einsum in them): a run whose
# host kernels are these alone leaves BLAS's thread count alone (runtime/execute.py `one_thread`)
NO_PRODUCTS: frozenset[str] = frozenset({*elementwise.KERNELS, *shape.KERNELS, *reduce.KERNELS, "Softmax",
                                         "LogSoftmax", "LayerNormalization", "QuantizeLinear",
                                         "DequantizeLinear"})


def kernel_for(name: str) -> Kernel:
    try:
        return KERNELS[name]
    except KeyError:
        raise UnsupportedError(f"no CPU kernel for op {name!r}") from None


def check_binding(name: str, n_inputs: int, attrs: Mapping[str, object], what: str) -> None:
    """Raise UnsupportedError when the kernel cannot take these inputs/attributes."""
    sig = inspect.signature(kernel_for(name))
    try:
        sig.bind(*([None] * n_inputs), **attrs)
    except TypeError as exc:
        raise UnsupportedError(f"{what}: the CPU kernel does not support this form ({exc})") from None


# kernels with optional outputs take `n_outputs`: how many outputs the step reads
# (MaxPool's argmax indices are computed only when read)
COUNTS_OUTPUTS: frozenset[str] = frozenset(name for name, k in KERNELS.items()
                                           if "n_outputs" in inspect.signature(k).parameters)


def run_kernel(name: str, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, object],
               n_outputs: int | None = None) -> list[np.ndarray]:
    """Run one kernel (`n_outputs`: the outputs the caller reads; None: all). An
    rkbin is untrusted: attributes that disagree with the inputs (a window of the
    wrong rank, an axis past the end) make numpy raise, and that is the file's
    fault, so it becomes one UnsupportedError line."""
    kernel = kernel_for(name)
    if name in COUNTS_OUTPUTS:
        attrs = {k: v for k, v in attrs.items() if k != "n_outputs"}
        if n_outputs is not None:
            attrs["n_outputs"] = n_outputs
    try:
        result = kernel(*inputs, **attrs)
    except (ValueError, TypeError, IndexError, ArithmeticError) as exc:  # numpy's AxisError is a ValueError
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise UnsupportedError(f"CPU kernel {name} cannot run on these inputs and attributes "
                               f"({type(exc).__name__}: {detail})") from None
    return list(result) if isinstance(result, tuple) else [result]
