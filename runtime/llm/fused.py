"""Fused CPU stretches for the load-time plans (runtime/plan.py): a stretch
of CPU steps between two NPU segments that matches a known pattern runs as
one prepared call instead of one call per step (each step's own call, checks
and allocations were most of its cost at one row).

The pattern matched here is the residual stretch of a decoder layer, one row
(decode):

    in edge:  Cast (fp16 NPU output -> fp32) | DequantizeRows (int32 NPU output)
    body:     [RMSNorm] -> Add (residual) -> RMSNorm
    out edge: Cast (fp32 -> fp16 NPU input) | QuantizeRows (-> int8 NPU input)

It reads the previous segment's output from its BO and writes the next
segment's input into its BO, in their layouts, with the body one compiled
call (jit.norm_add_norm); every step's output still lands in its slot, so a
later step reading one sees what the per-step path gives it. The arithmetic
is the per-step kernels' (the same bits: tests/llm/test_plan.py). A stretch
that does not match runs step by step, as before.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.ir.types import DType
from rkc.runtime.llm import jit

F32 = np.float32


def _info(plan, name: str):
    return plan.model.tensors.get(name)


def _row(plan, name: str, k: int, dtype: str = "fp32") -> bool:
    """`name` a one-row [1, k] tensor of `dtype`."""
    info = _info(plan, name)
    return info is not None and list(info.shape) == [1, k] and info.dtype == dtype


def _host(plan, name: str) -> bool:
    """A host tensor (a slot of the plan), neither in a BO nor a constant."""
    info = _info(plan, name)
    return info is not None and plan._bo_tensor(name) is None and info.region not in plan.model.host_regions


def _const(plan, name: str, shape: tuple) -> np.ndarray | None:
    info = _info(plan, name)
    if info is None or info.region not in plan.model.host_regions or tuple(info.shape) != shape:
        return None
    return np.ascontiguousarray(plan.slots[plan._slot(name)], F32)


def residual_stretch(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """The stretch's calls (one, bracketed) when it is a residual stretch; else None."""
    if len(steps) not in (4, 5) or any(n in outputs for s in steps for n in s.outputs):
        return None
    first, *body, last = steps
    ops = [s.op for s in body]
    if ops not in (["RMSNorm", "Add", "RMSNorm"], ["Add", "RMSNorm"]):
        return None
    src = first.outputs[0] if len(first.outputs) == 1 else None
    bt_in = plan._bo_tensor(first.inputs[0]) if first.inputs and first.inputs[0] else None
    if src is None or bt_in is None or bt_in.info.layout != "native-gemm" or not _host(plan, src):
        return None
    k = int(bt_in.shape[-1]) if len(bt_in.shape) == 2 and bt_in.shape[0] == 1 else 0
    if not k or not _row(plan, src, k):
        return None
    # the in edge
    slots = plan.slots
    if first.op == "Cast" and len(first.inputs) == 1 and bt_in.info.dtype == "fp16" and DType(first.attrs["to"]).numpy == F32:
        read, dequant = bt_in.reader(F32), None
    elif (first.op == "DequantizeRows" and int(first.attrs.get("partials", 1)) == 1 and bt_in.info.dtype == "int32"
          and len(first.inputs) in (3, 4) and _host(plan, first.inputs[1])):
        ch = _const(plan, first.inputs[2], (k,))
        bias = _const(plan, first.inputs[3], (k,)) if len(first.inputs) == 4 else ch
        if ch is None or bias is None:
            return None
        read, dequant = bt_in.reader(), (plan._slot(first.inputs[1]), ch, bias, len(first.inputs) == 4)
    else:
        return None
    # the body: each step reads the one before it
    prev, norms, residual = src, [], None
    for step in body:
        if step.op == "RMSNorm":
            if len(step.inputs) != 2 or step.inputs[0] != prev:
                return None
            w = _const(plan, step.inputs[1], (k,))
            if w is None:
                return None
            norms.append((w, F32(step.attrs["epsilon"])))
        else:
            if len(step.inputs) != 2 or prev not in step.inputs:
                return None
            residual = step.inputs[1] if step.inputs[0] == prev else step.inputs[0]
            if residual == prev or not _host(plan, residual) or not _row(plan, residual, k):
                return None
        if len(step.outputs) != 1 or not _host(plan, step.outputs[0]) or not _row(plan, step.outputs[0], k):
            return None
        prev = step.outputs[0]
    # the out edge
    if not last.inputs or last.inputs[0] != prev:
        return None
    bt_out = plan._bo_tensor(last.outputs[0]) if last.outputs else None
    if bt_out is None or bt_out.info.layout != "native-gemm" or tuple(bt_out.shape) != (1, k):
        return None
    write, quantize, scale_slot = bt_out.writer(), None, None
    if last.op == "Cast" and len(last.inputs) == 1 and len(last.outputs) == 1 and bt_out.info.dtype == "fp16":
        pass
    elif (last.op == "QuantizeRows" and len(last.outputs) == 2 and bt_out.info.dtype == "int8"
          and _host(plan, last.outputs[1])):
        consts = [slots[plan._slot(n)] if n else None for n in last.inputs]
        if any(c is None for c in consts[1:]):
            return None
        quantize, scale_slot, qconsts = bind(last, [None, *consts[1:]]), plan._slot(last.outputs[1]), consts[1:]
    else:
        return None

    first_norm = len(norms) == 2
    w1, e1 = norms[0] if first_norm else norms[-1]
    w2, e2 = norms[-1]
    x_buf, n1, total, n2 = (np.empty((1, k), F32) for _ in range(4))
    o_src = plan._slot(src)
    o_body = [plan._slot(s.outputs[0]) for s in body]
    o_res = plan._slot(residual)
    kernel, dequantize = jit.norm_add_norm, jit.dequantize_rows
    body_out = [n1, total, n2] if first_norm else [total, n2]
    label = f"residual stretch ({first.op}, {last.op})"

    def call():
        a = read()
        if dequant is not None:
            rs_slot, ch_, bias_, has_bias = dequant
            rs = slots[rs_slot]
            if rs.shape != (1,):
                raise_shape(label, "row scale", rs)
            dequantize(a, rs, ch_, bias_, has_bias, x_buf)
            a = x_buf
        res = slots[o_res]
        if res.shape != (1, k) or res.dtype != F32:
            raise_shape(label, "residual", res)
        slots[o_src] = a
        kernel(a, w1, e1, first_norm, res, w2, e2, n1, total, n2)
        for o, v in zip(o_body, body_out):
            slots[o] = v
        if quantize is None:
            write(n2)
        else:
            q, s = quantize([n2, *qconsts])
            write(q)
            slots[scale_slot] = s
    call.label = label
    bos = [plan.model.bos[bt_in.info.region], plan.model.bos[bt_out.info.region]]
    return plan._bracketed(bos, [call])


def raise_shape(label: str, what: str, value) -> None:
    from rkc.ir.errors import RkcError

    raise RkcError(f"{label}: the {what} came out {list(np.shape(value))} {np.asarray(value).dtype}, "
                   "not what the program declares")


FUSERS = [residual_stretch]
