"""A classifier's tail as one host pass: the last segment's logits [1, C, 1, 1] (an NPU
feature map: int8 codes or fp16 values), their DequantizeLinear or Cast to float32, a
Flatten to [1, C] and the Softmax over C, read where the NPU wrote them and written as
the probabilities (runtime/kernels/softmax_jit.py `softmax_of_logits`). Three steps
through the interpreter cost ~50 us a run (a dequantized map, a flattened view, a
softmax, each with its checks, places and allocations) around ~2 us of arithmetic.
runtime/execute.py's `fused_end` runs it; tests/runtime/test_logits_edges.py checks it
against a float64 reference."""

from __future__ import annotations

from typing import Callable

import numpy as np

from rkc.ir.program import Step
from rkc.runtime import feature_edges, native_maps

_CONVERSIONS = ("DequantizeLinear", "Cast")


def logits_chain_end(steps, i: int, last_use: dict, outputs) -> int | None:
    """The index of the Softmax if steps[i:] start a conversion out of a tensor, a Flatten
    (or Reshape) and a Softmax, each step's first input the previous step's single output
    that nothing else reads. `logits_plan` checks the tensors and attributes."""
    if steps[i].kind != "cpu" or steps[i].op not in _CONVERSIONS or i + 2 >= len(steps):
        return None
    if steps[i + 1].op not in ("Flatten", "Reshape") or steps[i + 2].op != "Softmax":
        return None
    if not all(feature_edges.chained(steps, j, last_use, outputs) for j in (i + 1, i + 2)):
        return None
    return i + 2


def logits_plan(run, steps: list[Step]) -> Callable[[object], None] | None:
    """A closure running `steps` (a logits_chain_end chain) on this program's tensors, or
    None if they are no such tail: the source a one-pixel feature map in a BO ([1, C, 1, 1],
    int8 with one constant scale, or fp16), the float32 host tensors [1, C, 1, 1] and [1, C]
    between, the Softmax over C."""
    from rkc.runtime import half
    from rkc.runtime.kernels import softmax_jit  # numba: loaded by programs with such a tail

    convert, flat, soft = steps
    tensors = run.model.tensors
    src, mid, flat_info, dst = (tensors.get(n) for n in (convert.inputs[0], convert.outputs[0], flat.outputs[0],
                                                          soft.outputs[0]))
    if None in (src, mid, flat_info, dst) or native_maps.edge_form(run, src) != "map":
        return None
    c = int(src.shape[1]) if len(src.shape) == 4 else 0
    if list(src.shape) != [1, c, 1, 1] or list(mid.shape) != [1, c, 1, 1] or list(flat_info.shape) != [1, c] \
            or list(dst.shape) != [1, c] or any(t.region is not None or t.dtype != "fp32" for t in (mid, flat_info, dst)):
        return None
    if soft.attrs.get("axis", -1) not in (1, -1) or (flat.op == "Flatten" and flat.attrs.get("axis", 1) != 1):
        return None  # (a Reshape's target is the declared [1, C]: the kernel checked it at compile)
    if convert.op == "Cast":
        params, codes = None, np.uint16
        if src.dtype != "fp16":
            return None
    else:
        params, codes = feature_edges.one_scale(run, convert), np.int8
        if params is None or src.dtype != "int8" or not feature_edges.scale_is_constant(run, convert):
            return None  # (its scale not a constant of the program)
    bo, lo, hi, _, stored, _ = native_maps.place(run, src)
    hold, name = native_maps.Hold(run.model.device, [bo]), soft.outputs[0]

    def tail(run) -> None:
        out = np.empty((1, c), np.float32)
        with hold:
            lanes = half.one_pixel_lanes(bo.host[lo:hi].view(codes).reshape(stored)[:, :1], out.reshape(c, 1, 1))
            softmax_jit.softmax_of_logits(lanes, params, out[0])
        run.env[name] = out  # (a host tensor: dst has no region)
    return tail
