"""The one-row gated stretches (runtime/llm/fused.py's fusers): act(gate) * up
between two NPU segments, gate and up read from their BOs (fused.py's in
edges), the product written into the down product's input BO (an out edge):
a gated FFN, or Gemma 4's per-layer input gate, whose `up` is its layer's row
of the per-layer inputs (a Pick of a host tensor). Same bits as the per-step
kernels (tests/llm/test_plan.py, tests/llm/test_gemma4.py), but for an FFN
between int8 products: one compiled call in float32 (jit.gated_row).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.runtime.llm import jit, prepared
from rkc.runtime.llm import kernels as plain
from rkc.runtime.llm.fused import _bracket, _info, _InEdge, _OutEdge, _row, raise_shape
from rkc.runtime.llm.prefill_kernels import ACT_GELU_TANH, ACT_SILU
from rkc.runtime.llm.stretch_match import host

F32 = np.float32


_ACTIVATIONS = ("GeluTanh", "SiLU")


def ffn_stretch(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """The gated FFN's stretch, one row: gate and up read from their BOs
    (two in edges), act(gate) * up, the product written into the down
    product's input BO (the out edge). GELU's arithmetic and the product
    are compiled calls around numpy's tanh (a compiled tanh would not give
    its bits), SiLU's around numpy's exp, likewise. Gemma 4's per-layer
    input gate has this shape with `up` a Pick of the per-layer inputs
    [1, L, P] (a host tensor) instead of a second in edge: read as a view."""
    if len(steps) != 5 or any(n in outputs for s in steps for n in s.outputs):
        return None
    e1, *middle, last = steps
    k = _InEdge.matches(plan, e1)
    if not k:
        return None
    edges = {e1.outputs[0]: e1}
    pick = None
    if _InEdge.matches(plan, middle[0]) == k:
        e2 = middle.pop(0)
        edges[e2.outputs[0]] = e2
    else:
        picks = [st for st in middle if st.op == "Pick"]
        if len(picks) != 1:
            return None
        pick = picks[0]
        middle.remove(pick)
        if not _picks_a_row(plan, pick, k):
            return None
    act, mul = middle
    if act.op not in _ACTIVATIONS or mul.op != "Mul":
        return None
    if len(act.inputs) != 1 or act.inputs[0] not in edges or len(mul.inputs) != 2:
        return None
    gate = act.inputs[0]
    up = pick.outputs[0] if pick is not None else next(n for n in edges if n != gate)
    if sorted(mul.inputs) != sorted([act.outputs[0], up]):
        return None
    for step in (act, mul):
        if len(step.outputs) != 1 or not host(plan, step.outputs[0]) or not _row(plan, step.outputs[0], k):
            return None
    if not _OutEdge.matches(plan, last, mul.outputs[0], k):
        return None
    edge_gate = _InEdge(plan, edges[gate], k)
    if pick is None:
        edge_up = _InEdge(plan, edges[up], k)
        ins = [edge_gate, edge_up]
    else:
        edge_up = _PickEdge(plan, pick)
        ins = [edge_gate]
    edge_out = _OutEdge(plan, last, bind)
    slots = plan.slots
    o_act, o_mul = plan._slot(act.outputs[0]), plan._slot(mul.outputs[0])
    hidden = np.empty((1, k), F32)
    label = f"{'ffn' if pick is None else 'per-layer gate'} stretch ({e1.op}, {act.op}, {last.op})"
    if pick is None and edge_gate.plain_int8() and edge_up.plain_int8() and edge_out.plain_int8():
        return _bracket(plan, steps, ins, edge_out, _gated_int8(edge_gate, edge_up, edge_out, act.op, slots, o_act,
                                                                o_mul, hidden, label), label)
    if act.op == "GeluTanh":  # compiled around numpy's tanh (its bits), buffers made once
        t, a = np.empty((1, k), F32), np.empty((1, k), F32)
        argument, times, tanh = jit.gelu_tanh_argument, jit.gelu_tanh_times, np.tanh
        c, kk = prepared.GELU_C, prepared.GELU_K

        def call():
            g = edge_gate.run(label)
            u = edge_up.run(label)
            argument(g, c, kk, t)
            tanh(t, out=t)
            times(g, t, u, a, hidden)
            slots[o_act] = a
            slots[o_mul] = hidden
            edge_out.run(hidden)
        return _bracket(plan, steps, ins, edge_out, call, label)
    if act.op == "SiLU":  # compiled around numpy's exp (its bits), buffers made once
        t, a = np.empty((1, k), F32), np.empty((1, k), F32)
        argument, times, exp, exp_max = jit.silu_argument, jit.silu_times, np.exp, plain.EXP_MAX

        def call_silu():
            g = edge_gate.run(label)
            u = edge_up.run(label)
            argument(g, exp_max, t)
            exp(t, out=t)
            times(g, t, exp_max, u, a, hidden)
            slots[o_act] = a
            slots[o_mul] = hidden
            edge_out.run(hidden)
        return _bracket(plan, steps, ins, edge_out, call_silu, label)
    activation, multiply = bind(act, [None]), np.multiply

    def call_any():
        g = edge_gate.run(label)
        u = edge_up.run(label)
        a = activation([g])[0]
        if a.shape != (1, k) or a.dtype != F32:
            raise_shape(label, "activation", a)
        slots[o_act] = a
        multiply(a, u, out=hidden)  # as Mul's a * b (float32)
        slots[o_mul] = hidden
        edge_out.run(hidden)
    return _bracket(plan, steps, ins, edge_out, call_any, label)


def _gated_int8(edge_gate: _InEdge, edge_up: _InEdge, edge_out: _OutEdge, op: str, slots, o_act: int, o_mul: int,
                hidden: np.ndarray, label: str) -> Callable[[], None]:
    """An FFN stretch between int8 products (gate and up int32 rows, the
    down product's int8 codes) as one compiled call (jit.gated_row): the
    stretch fp16 builds do not have (their FFN is one NPU segment), ~30 us of
    an int8 token's ~18 such calls in three dispatches, numpy's tanh and glue."""
    act = ACT_GELU_TANH if op == "GeluTanh" else ACT_SILU
    (g_slot, g_ch, g_bias, g_hb), (u_slot, u_ch, u_bias, u_hb) = edge_gate.dequant, edge_up.dequant
    g, u, k, a, out, kernel = edge_gate.out, edge_up.out, edge_gate.k, np.empty_like(hidden), edge_out, jit.gated_row
    gate, up, g_flat, u_flat = edge_gate.atoms, edge_up.atoms, edge_gate.flat, edge_up.flat
    gs, us, q_slot = edge_gate.slot, edge_up.slot, edge_out.scale_slot
    norm = float(out.norm)  # (a float and the row scales' [1] arrays: cheaper to dispatch, the same values)

    def call():
        g_rs, u_rs = slots[g_slot], slots[u_slot]
        if g_rs.shape != (1,) or g_rs.dtype != F32:
            raise_shape(label, "row scale", g_rs)
        if u_rs.shape != (1,) or u_rs.dtype != F32:
            raise_shape(label, "row scale", u_rs)
        kernel(gate, g_rs, g_ch, g_bias, g_hb, up, u_rs, u_ch, u_bias, u_hb, k, act, g_flat, u_flat, g, u, a,
               hidden, out.signs, out.block, norm, out.factor, out.work, out.codes, out.scale)
        slots[gs], slots[us], slots[o_act], slots[o_mul], slots[q_slot] = g, u, a, hidden, out.scale
    return call


def _picks_a_row(plan, step: Step, k: int) -> bool:
    """`step` a Pick of one layer's row [1, k] from a host tensor [1, L, k]."""
    info = _info(plan, step.inputs[0]) if len(step.inputs) == 1 else None
    return (info is not None and host(plan, step.inputs[0]) and info.dtype == "fp32" and len(info.shape) == 3
            and list(info.shape)[::2] == [1, k] and 0 <= int(step.attrs["index"]) < info.shape[1]
            and len(step.outputs) == 1 and host(plan, step.outputs[0]) and _row(plan, step.outputs[0], k))


class _PickEdge:
    """A Pick's row [1, k] of a host tensor [1, L, k] as an in edge: a view of the tensor's row (the values
    kernels.pick copies), into the Pick's slot."""

    def __init__(self, plan, step: Step) -> None:
        self.slots, self.src, self.slot = plan.slots, plan._slot(step.inputs[0]), plan._slot(step.outputs[0])
        self.index, self.shape = int(step.attrs["index"]), tuple(plan.model.tensors[step.inputs[0]].shape)
        self.bos = []

    def run(self, label: str) -> np.ndarray:
        x = self.slots[self.src]
        if x.shape != self.shape or x.dtype != F32:
            raise_shape(label, "per-layer input", x)
        row = x[:, self.index]
        self.slots[self.slot] = row
        return row
