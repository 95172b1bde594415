"""What the fused-stretch matchers (runtime/llm/fused.py one row,
fused_rows.py many rows) ask of a plan's tensors and steps, in one place:
host tensors, constants, and the residual stretch's shape and body."""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.runtime.kernels.hadamard import Rotation
from rkc.runtime.llm.kernels import rotation_of

F32 = np.float32
RESIDUAL_BODIES = (["RMSNorm", "Add", "RMSNorm"], ["Add", "RMSNorm"])  # between the in and out edge
# one row (runtime/llm/fused.py) also: Gemma 4's FFN output added to the residual and quantized for the
# per-layer input's gate (no second norm), and its per-layer projection's residual scaled by the layer
# output scale before the next layer's norm
ONE_ROW_BODIES = RESIDUAL_BODIES + (["RMSNorm", "Add"], ["RMSNorm", "Add", "ScaleBy", "RMSNorm"])


def host(plan, name: str) -> bool:
    """A host tensor (a slot of the plan), neither in a BO nor a constant."""
    info = plan.model.tensors.get(name)
    return info is not None and plan._bo_tensor(name) is None and info.region not in plan.model.host_regions


def is_const(plan, name: str) -> bool:
    """A constant (a host region's tensor)."""
    info = plan.model.tensors.get(name)
    return bool(name) and info is not None and info.region in plan.model.host_regions


def const(plan, name: str, shape: tuple) -> np.ndarray | None:
    """The constant `name` of `shape` as a C-order float32 array, else None."""
    info = plan.model.tensors.get(name)
    if info is None or info.region not in plan.model.host_regions or tuple(info.shape) != shape:
        return None
    return np.ascontiguousarray(plan.slots[plan._slot(name)], F32)



def step_rotation(plan, step: Step) -> Rotation | None:
    """A QuantizeRows step's rotation, built from its constant inputs' slots."""
    return rotation_of(step.attrs, [plan.slots[plan._slot(n)] for n in step.inputs[1:]])


def residual_shape(steps: Sequence[Step], outputs: set,
                   bodies: tuple = RESIDUAL_BODIES) -> tuple[Step, list[Step], Step] | None:
    """(in edge, body, out edge) when `steps` have a residual stretch's shape:
    none making a program output, the body one of `bodies` ([RMSNorm,] Add,
    RMSNorm by default); else None (the edges and the body's data flow are
    the caller's and residual_body's to check)."""
    if len(steps) < 3 or any(n in outputs for s in steps for n in s.outputs):
        return None
    first, *body, last = steps
    if [s.op for s in body] not in bodies:
        return None
    return first, body, last


class ResidualBody(NamedTuple):
    """A residual stretch's body: out = [norm2](scale * (norm1(x) + residual)),
    each part optional but the Add; norms as (weight, epsilon)."""
    first: tuple | None  # RMSNorm of the in edge's row
    residual: str  # the residual's name
    scale: np.ndarray | None  # ScaleBy's one-element factor (float32)
    last: tuple | None  # RMSNorm of the (scaled) sum
    out: str  # the last step's output: what the out edge reads


def residual_body(plan, body: Sequence[Step], prev: str, k: int,
                  shaped: Callable[[str], bool]) -> ResidualBody | None:
    """A residual stretch's body ([RMSNorm], Add, [ScaleBy], [RMSNorm], each
    reading the one before it, from `prev`), or None. `shaped(name)`: a host
    tensor of the stretch's row shape."""
    first = residual = scale = last = None
    for step in body:
        if step.op == "RMSNorm":
            if len(step.inputs) != 2 or step.inputs[0] != prev:
                return None
            w = const(plan, step.inputs[1], (k,))
            if w is None:
                return None
            if residual is None:
                first = (w, F32(step.attrs["epsilon"]))
            else:
                last = (w, F32(step.attrs["epsilon"]))
        elif step.op == "ScaleBy":
            scale = const(plan, step.inputs[1], (1,)) if len(step.inputs) == 2 and step.inputs[0] == prev else None
            if scale is None or residual is None:
                return None
        else:
            if len(step.inputs) != 2 or prev not in step.inputs:
                return None
            residual = step.inputs[1] if step.inputs[0] == prev else step.inputs[0]
            if residual == prev or not host(plan, residual) or not shaped(residual):
                return None
        if len(step.outputs) != 1 or not host(plan, step.outputs[0]) or not shaped(step.outputs[0]):
            return None
        prev = step.outputs[0]
    return None if residual is None else ResidualBody(first, residual, scale, last, prev)
