"""Fused CPU stretches for the load-time plans (runtime/plan.py): a stretch
of CPU steps between two NPU segments that matches a known pattern runs as
one prepared call instead of one call per step (each step's own call, checks
and allocations were most of its cost at one row).

The patterns matched here, one row (decode), between

    in edges: Cast (fp16 NPU output -> fp32) | DequantizeRows (int32 NPU output)
              | CombineInt4 (an int4 product's int16 partials, jit.combine_int4_atoms)
    out edge: Cast (fp32 -> fp16 NPU input) | QuantizeRows (-> int8 NPU input)
              | QuantizeNibbles (-> int4 nibble rows, jit.quantize_nibbles_into_atoms)

are a decoder layer's
  - residual stretch (in edge, [RMSNorm], Add of the residual, RMSNorm, out
    edge: the body one compiled call, jit.norm_add_norm);
  - attention stretch (q, k, v in edges, Reshape views, the q/k norms, RoPE,
    Attention over the KV cache with buffers made once, out edge);
  - gated FFN stretch (gate and up in edges, the activation, Mul, out edge);
and the head's output: the logits read from their BO (an in edge alone).
A fused call reads the previous segment's output from its BO and writes the
next segment's input into its BO, in their layouts; every step's output
still lands in its slot, so a later step reading one sees what the per-step
path gives it. The arithmetic is the per-step kernels' (the same bits:
tests/llm/test_plan.py). An int8 edge of two terms (--int8-residual: a row
and its residual row, `_terms`) is fused too. A stretch that does not match
runs step by step, as before.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.ir.types import DType
from rkc.runtime.half import narrow_into_atoms
from rkc.runtime.llm import decode_attention, int4_rows, jit, prepared
from rkc.runtime.llm import kernels as plain
from rkc.runtime.kernels.hadamard import compiled_form
from rkc.runtime.llm.prefill_fused import quantize_into_atoms
from rkc.runtime.llm.stretch_match import (ONE_ROW_BODIES, const, host, is_const, residual_body, residual_shape,
                                          step_rotation)

F32 = np.float32


def _info(plan, name: str):
    return plan.model.tensors.get(name)


def _row(plan, name: str, k: int, dtype: str = "fp32") -> bool:
    """`name` a one-row [1, k] tensor of `dtype`."""
    info = _info(plan, name)
    return info is not None and list(info.shape) == [1, k] and info.dtype == dtype


class _InEdge:
    """A segment's output read from its BO as a fp32 row [1, k] (an edge Cast
    from fp16, or DequantizeRows of int32 accumulators) into its slot,
    straight from the BO's atoms (one compiled call, no copy first); into a
    buffer made once, or (`fresh`: a program output) a new array each run."""

    def __init__(self, plan, step: Step, k: int, fresh: bool = False) -> None:
        self.slots, self.slot, self.k, self.fresh = plan.slots, plan._slot(step.outputs[0]), k, fresh
        bt = plan._bo_tensor(step.inputs[0])
        self.bo = plan.model.bos[bt.info.region]
        self.bos = [self.bo]
        self.atoms = bt.rows_view[0]  # [C1, C2]: the row's channels in their atoms
        self.residual = bt.rows_view[1] if _terms(step) == 2 else None  # a two-term row's residual term
        self.partial = None  # the second K range's sums (partials = 2), read from its own BO
        self.out = np.empty((1, k), F32)
        self.int4, self.flat = None, None
        if step.op == "CombineInt4":  # the two nibble rows' int16 partials per K group (int4_rows.combine)
            scales = const(plan, step.inputs[2], tuple(plan.model.tensors[step.inputs[2]].shape))
            bias = const(plan, step.inputs[3], (k,)) if len(step.inputs) == 4 else scales[0]
            paired = bool(step.attrs.get("pair_group"))  # two K groups per block of 4 rows (int4_rows.pair_rows)
            blocks = -(-len(scales) // 2) if paired else len(scales)
            self.int4 = (bt.atoms, bt.shape[1] // blocks, plan._slot(step.inputs[1]), scales, bias,
                         len(step.inputs) == 4, paired)
            self.dequant = None
            return
        if step.op == "Cast":
            self.atoms = self.atoms.view(np.uint16)
        self.flat = self._flat(self.out)  # what the compiled calls write (a view made once)
        if step.op == "Cast":
            self.dequant = None
            return
        p = _partials(step)
        if p == 2:
            second = plan._bo_tensor(step.inputs[1])
            self.partial = second.rows_view[0]
            self.bos.append(plan.model.bos[second.info.region])
        ch = const(plan, step.inputs[p + 1], (k,))
        bias = const(plan, step.inputs[p + 2], (k,)) if len(step.inputs) == p + 3 else ch
        self.dequant = (plan._slot(step.inputs[p]), ch, bias, len(step.inputs) == p + 3)

    @staticmethod
    def matches(plan, step: Step) -> int:
        """The row width k when `step` is such an edge, else 0."""
        if len(step.outputs) != 1 or not step.inputs or not step.inputs[0] or not _terms(step):
            return 0
        if step.op == "CombineInt4":
            return _int4_in_edge(plan, step)
        bt = plan._bo_tensor(step.inputs[0])
        if bt is None or bt.info.layout != "native-gemm" or len(bt.shape) != 2 or bt.shape[0] != _terms(step):
            return 0
        k = int(bt.shape[1])
        if not host(plan, step.outputs[0]) or not _row(plan, step.outputs[0], k):
            return 0
        if (step.op == "Cast" and bt.shape[0] == 1 and len(step.inputs) == 1 and bt.info.dtype == "fp16"
                and DType(step.attrs["to"]).numpy == F32):
            return k
        p = _partials(step)
        if (step.op == "DequantizeRows" and p and bt.info.dtype == "int32"
                and len(step.inputs) in (p + 2, p + 3) and host(plan, step.inputs[p])
                and const(plan, step.inputs[p + 1], (k,)) is not None
                and (len(step.inputs) == p + 2 or const(plan, step.inputs[p + 2], (k,)) is not None)):
            if p == 2:  # the second K range's sums: a one-term row of the same width in its own BO
                second = plan._bo_tensor(step.inputs[1])
                if (_terms(step) != 1 or second is None or second.info.layout != "native-gemm"
                        or second.info.dtype != "int32" or tuple(second.shape) != (1, k)):
                    return 0
            return k
        return 0

    def _flat(self, out: np.ndarray) -> np.ndarray:
        flat = out.reshape(-1)
        return flat.view(np.uint32) if self.atoms.dtype == np.uint16 else flat

    def run(self, label: str) -> np.ndarray:
        out, flat = self.out, self.flat
        if self.fresh:
            out = np.empty((1, self.k), F32)
            flat = None if self.int4 is not None else self._flat(out)
        if self.int4 is not None:
            atoms, n_pad, rs_slot, scales, bias, has_bias, paired = self.int4
            rs = self.slots[rs_slot]
            if rs.shape != (1,) or rs.dtype != F32:
                raise_shape(label, "row scale", rs)
            jit.combine_int4_atoms(atoms, self.k, n_pad, scales, rs, bias, has_bias, out, 0, 1, paired)
        elif self.dequant is None:
            jit.half_atoms_to_float(self.atoms, self.k, flat)
        else:
            rs_slot, ch, bias, has_bias = self.dequant
            rs = self.slots[rs_slot]
            if rs.shape != (1 if self.residual is None else 2,) or rs.dtype != F32:
                raise_shape(label, "row scale", rs)
            if self.partial is not None:
                jit.dequantize_atoms_partials(self.atoms, self.partial, self.k, rs[0], ch, bias, has_bias, flat)
            elif self.residual is None:
                jit.dequantize_atoms(self.atoms, self.k, rs[0], ch, bias, has_bias, flat)
            else:
                jit.dequantize_atoms_terms(self.atoms, self.residual, self.k, rs[0], rs[1], ch, bias, has_bias, flat)
        self.slots[self.slot] = out
        return out


def _int4_in_edge(plan, step: Step) -> int:
    """CombineInt4 of one row read from its BO (the hi and lo nibble rows'
    int16 partials [2, G x Np], or paired [4, ceil(G / 2) x Np], Np a multiple
    of the atom): its width N, else 0."""
    bt = plan._bo_tensor(step.inputs[0])
    paired = bool(step.attrs.get("pair_group"))
    if (bt is None or bt.info.layout != "native-gemm" or bt.info.dtype != "int16" or len(bt.shape) != 2
            or bt.shape[0] != (4 if paired else 2) or len(step.inputs) not in (3, 4)
            or not host(plan, step.inputs[1])):
        return 0
    info = _info(plan, step.inputs[2])
    if info is None or len(info.shape) != 2 or not info.shape[0]:
        return 0
    g, n = (int(d) for d in info.shape)
    blocks = -(-g // 2) if paired else g
    n_pad = bt.shape[1] // blocks
    if (bt.shape[1] % blocks or n_pad < n or n_pad % bt.c2 or const(plan, step.inputs[2], (g, n)) is None
            or not _row(plan, step.outputs[0], n) or not host(plan, step.outputs[0])
            or (len(step.inputs) == 4 and const(plan, step.inputs[3], (n,)) is None)):
        return 0
    return n


class _OutEdge:
    """The next segment's input written into its BO's atoms from a fp32 row
    [1, k], pad rows zeroed, in one compiled call: an edge Cast narrowed to
    fp16 (half.narrow_into_atoms), or QuantizeRows' codes (one or two terms)
    with the row scales into their slot, after the rotation's signs and
    butterflies (jit.hadamard_rows) and its block-mixing factor (numpy's
    product, as the prepared QuantizeRows runs it, for BLAS's sums)."""

    def __init__(self, plan, step: Step, bind) -> None:
        bt = plan._bo_tensor(step.outputs[0])
        self.bo, self.write, self.k = plan.model.bos[bt.info.region], bt.writer(), int(bt.shape[1])
        self.slots, self.half, self.codes = plan.slots, None, None
        if step.op == "Cast":
            self.half = bt.atoms.view(np.uint16)
            return
        self.codes, self.terms = bt.atoms, _terms(step)
        self.nibbles = step.op == "QuantizeNibbles"  # two int4 rows per row (int4_rows.npu_rows)
        self.pair_group = int(step.attrs.get("pair_group", 0))  # (two K groups' rows: int4_rows.pair_rows)
        if self.nibbles:
            self.k, self.codes = 2 * self.k, bt.atoms.view(np.uint8)
        self.scale, self.scale_slot = np.empty(self.terms, F32), plan._slot(step.outputs[1])
        self.two = np.empty((2, self.k), F32)  # (two terms: the row and its residual)
        form = compiled_form(step_rotation(plan, step), self.k)  # (matches: a compiled form, or no rotation)
        self.rotated = None if form is None else np.empty((1, self.k), F32)
        if form is not None:
            self.signs, self.block, self.norm, self.factor = form.signs, form.block, form.norm, form.factor
            self.mixed = None if form.factor is None else np.empty((1, self.k // form.block, form.block), F32)
            if self.factor is not None:  # views made once: the rotated row by blocks, the mixed blocks as a row
                self.blocks, self.mixed_row = self.rotated.reshape(self.mixed.shape), self.mixed.reshape(1, self.k)

    @staticmethod
    def matches(plan, step: Step, src: str, k: int) -> bool:
        if not step.inputs or step.inputs[0] != src or not step.outputs or not _terms(step):
            return False
        bt = plan._bo_tensor(step.outputs[0])
        if step.op == "QuantizeNibbles":  # the operand's bytes: two nibble rows of K / 2 bytes
            rows = 4 if step.attrs.get("pair_group") else 2
            if (bt is None or bt.info.layout != "native-gemm" or tuple(bt.shape) != (rows, k // 2) or k % 32
                    or bt.info.dtype != "int8" or len(step.outputs) != 2 or not host(plan, step.outputs[1])
                    or not all(is_const(plan, n) for n in step.inputs[1:])):
                return False
            rot = step_rotation(plan, step)
            return rot is None or compiled_form(rot, k) is not None
        if bt is None or bt.info.layout != "native-gemm" or tuple(bt.shape) != (_terms(step), k):
            return False
        if step.op == "Cast":
            return len(step.inputs) == 1 and len(step.outputs) == 1 and bt.info.dtype == "fp16" and bt.shape[0] == 1
        if not (step.op == "QuantizeRows" and len(step.outputs) == 2 and bt.info.dtype == "int8"
                and host(plan, step.outputs[1]) and all(is_const(plan, n) for n in step.inputs[1:])):
            return False
        rot = step_rotation(plan, step)
        return rot is None or compiled_form(rot, k) is not None

    def run(self, value: np.ndarray) -> None:
        if value.shape != (1, self.k) or value.dtype != F32 or not value.flags.c_contiguous:
            if self.half is not None:  # (every value the stretches make is such a row)
                self.write(value)  # the writer casts as numpy's astype
                return
            value = np.ascontiguousarray(value, F32)  # as the prepared QuantizeRows takes its input
            if value.shape != (1, self.k):
                raise_shape("QuantizeRows", "input", value)
        if self.half is not None:
            narrow_into_atoms(value.view(np.uint32), self.half)
            return
        x = value
        if self.rotated is not None:
            jit.hadamard_rows(x, self.signs, self.block, self.norm, self.rotated)
            x = self.rotated
            if self.factor is not None:  # F mixes the blocks
                np.matmul(self.factor, self.blocks, out=self.mixed)
                x = self.mixed_row
        if self.nibbles:
            jit.quantize_nibbles_into_atoms(x, self.codes, self.scale, int4_rows.ACT_LIMIT, 0, 1, self.pair_group)
        elif self.terms == 1:
            quantize_into_atoms(x, self.codes, self.scale)
        else:
            jit.quantize_terms_into_atoms(x, self.codes, self.scale, self.two)
        self.slots[self.scale_slot] = self.scale


def _partials(step: Step) -> int:
    """DequantizeRows' K ranges whose int32 sums it adds: 1, or 2 (each read from
    its own BO), are fused; any other count runs step by step (0)."""
    partials = int(step.attrs.get("partials", 1))
    return partials if partials in (1, 2) else 0


def _terms(step: Step) -> int:
    """The rule for two-term edges (--int8-residual: QuantizeRows writes a
    row's int8 value and its int8 residual as two rows of the BO, [2, k], and
    DequantizeRows adds the two rows' sums back): 1 or 2 are fused (the row
    and its residual row), any other count runs step by step (0)."""
    terms = int(step.attrs.get("terms", 1))
    return terms if terms in (1, 2) else 0


def _bracket(plan, steps: Sequence[Step], ins: list, out: _OutEdge, call, label: str) -> list[Callable[[], None]]:
    call.label, call.ops = label, tuple(s.op for s in steps)  # ops: what the profile's per-op costs share it by
    return plan._bracketed([bo for e in ins for bo in e.bos] + [out.bo], [call])


def residual_stretch(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """The stretch's calls (one, bracketed) when it is a residual stretch; else None."""
    shape = residual_shape(steps, outputs, ONE_ROW_BODIES)
    if shape is None:
        return None
    first, body, last = shape
    k = _InEdge.matches(plan, first)
    if not k:
        return None
    matched = residual_body(plan, body, first.outputs[0], k, lambda name: _row(plan, name, k))
    if matched is None or not _OutEdge.matches(plan, last, matched.out, k):
        return None
    edge_in, edge_out = _InEdge(plan, first, k), _OutEdge(plan, last, bind)
    slots = plan.slots
    first_norm, has_scale, last_norm = matched.first is not None, matched.scale is not None, matched.last is not None
    w1, e1 = matched.first or (_NO_WEIGHT, F32(0))
    w2, e2 = matched.last or (_NO_WEIGHT, F32(0))
    scale = matched.scale if has_scale else _NO_WEIGHT
    n1, total, scaled, n2 = (np.empty((1, k), F32) for _ in range(4))
    body_out = [v for v, on in ((n1, first_norm), (total, True), (scaled, has_scale), (n2, last_norm)) if on]
    o_body = [plan._slot(s.outputs[0]) for s in body]
    o_res = plan._slot(matched.residual)
    kernel, result = jit.norm_add_norm, body_out[-1]
    label = f"residual stretch ({first.op}, {last.op})"

    def call():
        a = edge_in.run(label)
        res = slots[o_res]
        if res.shape != (1, k) or res.dtype != F32:
            raise_shape(label, "residual", res)
        kernel(a, w1, e1, first_norm, res, scale, has_scale, w2, e2, last_norm, n1, total, scaled, n2)
        for o, v in zip(o_body, body_out):
            slots[o] = v
        edge_out.run(result)
    return _bracket(plan, steps, [edge_in], edge_out, call, label)


_NO_WEIGHT = np.ones(1, F32)  # (an absent norm's weight or scale: unread)


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


def output_stretch(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """The head's stretch: its one-row output (the logits) read from its BO
    into a new array (it must outlive the next run), as an in edge does;
    then any Scale and Tanh steps after it (Gemma's final soft-capping:
    Scale, Tanh, Scale) in place on that array, the scalings compiled
    (jit.scale_row: Scale's float32 product) and the tanh numpy's, when the
    last makes the program's output and nothing else reads the others."""
    first, *caps = steps
    if first.outputs[:1] != [o for o in first.outputs if o in outputs] and not caps:
        return None
    k = _InEdge.matches(plan, first)
    if not k:
        return None
    prev, ops = first.outputs[0], []
    for st in caps:
        if (st.op not in ("Scale", "Tanh") or st.inputs != [prev] or len(st.outputs) != 1
                or not host(plan, st.outputs[0]) or not _row(plan, st.outputs[0], k)):
            return None
        ops.append(F32(st.attrs["factor"]) if st.op == "Scale" else None)
        prev = st.outputs[0]
    if caps and ([n for s in steps for n in s.outputs if n in outputs] != [prev] or _read_outside(plan, steps, prev)):
        return None
    edge, label = _InEdge(plan, first, k, fresh=True), f"output ({first.op}{', soft-capped' if caps else ''})"
    slots, o, scale, tanh = plan.slots, plan._slot(prev), jit.scale_row, np.tanh

    def call():
        x = edge.run(label)
        for f in ops:
            if f is None:
                tanh(x, out=x)
            else:
                scale(x, f)
        slots[o] = x
    call.label, call.ops = label, tuple(s.op for s in steps)
    return plan._bracketed(edge.bos, [call])


def _read_outside(plan, steps: Sequence[Step], but: str) -> bool:
    """Some step outside `steps` reads a value they make, other than `but`."""
    inside, made = {id(s) for s in steps}, {n for s in steps for n in s.outputs} - {but}
    return any(n in made for s in plan.program.steps if id(s) not in inside for n in s.inputs)


def _declared(plan, name: str) -> tuple | None:
    info = _info(plan, name)
    return tuple(info.shape) if info is not None and info.dtype == "fp32" else None


def attention_stretch(plan, steps: Sequence[Step], bind, outputs: set, state) -> list[Callable[[], None]] | None:
    """A layer's attention stretch, one row: q (and k, v) read from their BOs
    (in edges), then Reshape, RMSNorm (q/k norms), RMSNormPlain (Gemma 4's v
    norm), RoPE and Attention steps (or AttentionShared: q alone, over an
    earlier layer's cache), the attention's output written into the output
    product's input BO (the out edge). Reshapes are views, the norms and
    rotations compiled calls into buffers made once (jit.rms_norm, jit.rope),
    the attention its prepared kernel; every value is one the stretch itself
    made, of its declared shape, so the compiled calls need no checks per token.
    Steps the attention and the out edge do not need, reading nothing the
    attention's steps make (Gemma 4's per-layer inputs, summed in layer 0's
    stretch), run first, each its own call (an in edge's compiled read, else
    the step's prepared kernel)."""
    if len(steps) < 3 or any(n in outputs for s in steps for n in s.outputs):
        return None
    *front, last = steps
    side, front = _side_steps(front, last)
    if side is None:
        return None
    side_bos: list = []
    side_calls = [_side_call(plan, st, bind, outputs, side_bos) for st in side]
    edges, n_edges = [], 0
    while n_edges < len(front) and _InEdge.matches(plan, front[n_edges]):
        n_edges += 1
    if not n_edges:
        return None
    made: dict[str, tuple] = {}  # values the stretch makes -> declared shape
    for e in front[:n_edges]:
        made[e.outputs[0]] = _declared(plan, e.outputs[0])
        edges.append(_InEdge(plan, e, made[e.outputs[0]][1]))
    slots = plan.slots
    runs: list[Callable[[], None]] = []
    attention_seen = False
    for step in front[n_edges:]:
        if len(step.outputs) != 1 or not host(plan, step.outputs[0]):
            return None
        o, shape = plan._slot(step.outputs[0]), _declared(plan, step.outputs[0])
        src = step.inputs[0] if step.inputs else None
        if shape is None or src not in made:
            return None
        if step.op == "Reshape":
            if [int(d) for d in step.attrs["shape"]] != list(shape) or len(step.inputs) != 1:
                return None
            runs.append(_reshape_run(slots, plan._slot(src), o, shape))
        elif step.op in ("RMSNorm", "RMSNormPlain"):
            w = _norm_weight(plan, step, made[src][-1])
            if w is None or shape != made[src]:
                return None
            runs.append(_norm_run(slots, plan._slot(src), o, shape, w, F32(step.attrs["epsilon"])))
        elif step.op == "RoPE":
            tables, x = _rope_tables(plan, step, state), made[src]
            if tables is None or shape != x or len(x) != 3 or x[0] != 1 or int(step.attrs["dims"]) > x[-1]:
                return None
            runs.append(_rope_run(slots, plan._slot(src), plan._slot(step.inputs[1]), o, shape, tables,
                                  int(step.attrs["dims"]), step.attrs["mode"] == "neox"))
        elif step.op == "Attention" and not attention_seen:
            if len(step.inputs) != 4 or any(n not in made for n in step.inputs[:3]) \
                    or not _is_positions(plan, step.inputs[3]):
                return None
            ins = [plan._slot(n) for n in step.inputs]
            general = _kernel_run(slots, ins, o, bind(step, [None] * 4), shape)
            runs.append(_attention_run(slots, ins, o, step, [made[n] for n in step.inputs[:3]], shape, general, state)
                        or general)
            attention_seen = True
        elif step.op == "AttentionShared" and not attention_seen:  # the prepared kernel (fp32 views)
            if len(step.inputs) != 2 or not _is_positions(plan, step.inputs[1]):
                return None
            runs.append(_kernel_run(slots, [plan._slot(n) for n in step.inputs], o, bind(step, [None] * 2), shape))
            attention_seen = True
        else:
            return None
        made[step.outputs[0]] = shape
    if not attention_seen or last.inputs[:1] != [front[-1].outputs[0]] or len(made[front[-1].outputs[0]]) != 2:
        return None
    k = made[front[-1].outputs[0]][1]
    if made[front[-1].outputs[0]][0] != 1 or not _OutEdge.matches(plan, last, front[-1].outputs[0], k):
        return None
    edge_out = _OutEdge(plan, last, bind)
    result = plan._slot(front[-1].outputs[0])
    label = f"attention stretch ({front[0].op}, {last.op})"
    compiled = _compiled_front(plan, front[:n_edges], front[n_edges:], edges, state)

    def call():
        for c in side_calls:
            c()
        for e in edges:
            e.run(label)
        if compiled is None or not compiled():
            for run in runs:
                run()
        edge_out.run(slots[result])
    if not side:
        return _bracket(plan, steps, edges, edge_out, call, label)
    call.label, call.ops = label, tuple(s.op for s in steps)
    return plan._bracketed([bo for e in edges for bo in e.bos] + side_bos + [edge_out.bo], [call])


def _side_steps(front: Sequence[Step], last: Step) -> tuple[list | None, list]:
    """(steps the attention step and `last` do not need, the others), in
    order; (None, front) when a step not needed reads one that is (it could
    not run first)."""
    att = [st for st in front if st.op in ("Attention", "AttentionShared")]
    if len(att) != 1:
        return [], list(front)
    by_out = {n: st for st in front for n in st.outputs}
    needed, todo = set(), list(att[0].inputs) + list(last.inputs)
    while todo:
        st = by_out.get(todo.pop())
        if st is not None and id(st) not in needed:
            needed.add(id(st))
            todo.extend(st.inputs)
    needed.add(id(att[0]))
    side = [st for st in front if id(st) not in needed]
    made = {n for st in front if id(st) in needed for n in st.outputs}
    if any(n in made for st in side for n in st.inputs):
        return None, list(front)
    return side, [st for st in front if id(st) in needed]


def _side_call(plan, step: Step, bind, outputs: set, bos: list) -> Callable[[], None]:
    """A side step's call: an in edge's compiled read (its BO into `bos`),
    else the plan's call of the step's prepared kernel."""
    k = _InEdge.matches(plan, step)
    if not k:
        return plan._cpu_call(step, bind, outputs, bos)
    edge, label = _InEdge(plan, step, k), step.op
    bos.extend(edge.bos)
    return lambda: edge.run(label)


def _norm_weight(plan, step: Step, k: int) -> np.ndarray | None:
    """An RMSNorm's constant weight [k], RMSNormPlain's ones (x / root * 1 is
    x / root: kernels.rms_norm_plain's values), else None."""
    if step.op == "RMSNorm":
        return const(plan, step.inputs[1], (k,)) if len(step.inputs) == 2 else None
    return np.ones(k, F32) if step.op == "RMSNormPlain" and len(step.inputs) == 1 else None


def _rope_tables(plan, step: Step, state):
    """A RoPE step's tables (prepared.rope_tables) when it rotates by the
    program's positions, with constant frequency factors if any; else None."""
    if len(step.inputs) not in (2, 3) or not _is_positions(plan, step.inputs[1]):
        return None
    consts = [None, None]
    if len(step.inputs) == 3:
        if not is_const(plan, step.inputs[2]):
            return None
        consts.append(plan.slots[plan._slot(step.inputs[2])])
    return prepared.rope_tables(step, consts, state)


_V_CHAINS = (["Reshape"], ["Reshape", "RMSNormPlain"])  # v as its product gives it, or Gemma 4's plain norm


def _compiled_front(plan, edge_steps: Sequence[Step], steps: Sequence[Step], edges: list, state):
    """The common attention stretch (q, k, v edges; their Reshapes; q/k
    norms or none; a v norm or none; the two RoPEs; Attention over the
    cache's fp16 rows) with its norms, RoPEs and cache store in one compiled
    call (jit.attention_front), into buffers made once, every step's output
    in its slot; or q's edge, Reshape, norm and RoPE before AttentionShared
    (jit.query_front), which reads its source layer's fp16 rows: a function
    of no arguments that runs them and the attention, False when the run is
    not a one-row decode (then the step-by-step runs take it); None for any
    other stretch. attention_stretch has checked the steps' shapes and
    constants. v may be k's product (Gemma 4's layers without a V
    projection: v's chain starts at k's Reshape)."""
    att, by_out = steps[-1], {st.outputs[0]: st for st in steps}
    edge_of = {st.outputs[0]: e for st, e in zip(edge_steps, edges)}
    own = att.op == "Attention"
    if att.op not in ("Attention", "AttentionShared"):
        return None

    def chain(name):  # (edge, steps from it to `name`)
        made = []
        while name in by_out:
            made.append(by_out[name])
            name = made[-1].inputs[0]
        return edge_of.get(name), made[::-1]

    def ops(c):
        return [st.op for st in c]
    eq, cq = chain(att.inputs[0])
    norms = len(cq) == 3
    want = ["Reshape", "RMSNorm", "RoPE"] if norms else ["Reshape", "RoPE"]
    if eq is None or ops(cq) != want:
        return None
    ropes, chained, used = [cq[-1]], list(cq), [eq]
    if own:
        (ek, ck), (ev, cv) = chain(att.inputs[1]), chain(att.inputs[2])
        if None in (ek, ev) or ops(ck) != want or ops(cv) not in _V_CHAINS or eq in (ek, ev):
            return None
        v_is_k = cv[0] is ck[0]
        if (ev is ek) != v_is_k:
            return None
        ropes.append(ck[-1])
        chained += ck + cv[1 if v_is_k else 0:]
        used += [ek] if v_is_k else [ek, ev]
    positions = att.inputs[3 if own else 1]
    if (len(chained) + 1 != len(steps) or len({id(st) for st in chained}) != len(chained)
            or len(used) != len(edges) or len({id(e) for e in used}) != len(edges)):
        return None
    if any(r.inputs[1] != positions for r in ropes) or len({(r.attrs["dims"], r.attrs["mode"]) for r in ropes}) != 1:
        return None
    tables = _rope_tables(plan, ropes[0], state)
    if tables is None or any(_rope_tables(plan, r, state) is not tables for r in ropes[1:]):
        return None
    _, heads, hd = tuple(cq[0].attrs["shape"])
    q3 = eq.out.reshape(tuple(cq[0].attrs["shape"]))
    q2 = q3.reshape(heads, hd)
    qw = const(plan, cq[1].inputs[1], (hd,)) if norms else np.ones(hd, F32)  # (unread without norms)
    qeps = F32(cq[1].attrs["epsilon"]) if norms else F32(0)
    qx = np.empty(q3.shape, F32) if norms else q3
    qn = qx.reshape(heads, hd)
    qr = np.empty(q3.shape, F32)
    dims, neox = int(ropes[0].attrs["dims"]), ropes[0].attrs["mode"] == "neox"
    slots, out_width = plan.slots, int(plan.model.tensors[att.outputs[0]].shape[1])
    work = state.__dict__.setdefault("_row_work", decode_attention.RowWork())
    made = [(plan._slot(cq[0].outputs[0]), q3)] + ([(plan._slot(cq[1].outputs[0]), qx)] if norms else [])
    made.append((plan._slot(cq[-1].outputs[0]), qr))
    ip, o, scale, window = plan._slot(positions), plan._slot(att.outputs[0]), float(att.attrs["scale"]), int(
        att.attrs["window"])
    if not own:
        hkv = int(att.attrs.get("kv_heads", 0))
        if hkv <= 0 or heads % hkv or out_width % heads:
            return None
        attend = decode_attention.RowAttention(heads, hkv, hd, out_width // heads, scale, window, work)
        source, query = int(att.attrs["source"]), jit.query_front

        def run_shared() -> bool:
            pos = slots[ip]
            if state.valid != 1 or pos.shape != (1,):
                return False
            cos, sin = tables.at(pos)
            query(q2, qw, qeps, norms, qn, qx, cos, sin, dims, neox, qr)
            for i, x in made:
                slots[i] = x
            cache = state.cache
            keys, values, kpos = cache.shared_half(source) or cache.shared(source)
            if keys.shape[1:] != (hkv, hd) or values.shape[1:] != (hkv, out_width // heads):
                raise_shape("AttentionShared", "source's cache row", keys)
            slots[o] = attend(qr, keys, values, kpos, int(pos[0]))
            return True
        return run_shared
    (_, hkv, hdk), (_, hkv_v, hdv) = (tuple(st.attrs["shape"]) for st in (ck[0], cv[0]))
    if hdk != hd or hkv_v != hkv or hkv == 0 or heads % hkv or out_width != heads * hdv:
        return None
    k3 = ek.out.reshape(tuple(ck[0].attrs["shape"]))
    v3 = k3 if v_is_k else ev.out.reshape(tuple(cv[0].attrs["shape"]))
    k2, v2 = k3.reshape(hkv, hd), v3.reshape(hkv, hdv)
    kw = const(plan, ck[1].inputs[1], (hd,)) if norms else qw
    keps = F32(ck[1].attrs["epsilon"]) if norms else F32(0)
    kx = np.empty(k3.shape, F32) if norms else k3
    kn = kx.reshape(hkv, hd)
    v_norm = len(cv) == 2
    veps = F32(cv[1].attrs["epsilon"]) if v_norm else F32(0)
    vx = np.empty(v3.shape, F32) if v_norm else v3
    vn, vw = vx.reshape(hkv, hdv), np.ones(hdv, F32)
    kr = np.empty(k3.shape, F32)
    kr_bits, v_bits = kr.view(np.uint32), vx.view(np.uint32)
    layer = int(att.attrs["layer"])
    attend = decode_attention.RowAttention(heads, hkv, hd, hdv, scale, window, work)
    if not v_is_k:
        made.append((plan._slot(cv[0].outputs[0]), v3))
    made.append((plan._slot(ck[0].outputs[0]), k3))
    if norms:
        made.append((plan._slot(ck[1].outputs[0]), kx))
    if v_norm:
        made.append((plan._slot(cv[1].outputs[0]), vx))
    made.append((plan._slot(ck[-1].outputs[0]), kr))
    k_shape, v_shape, front = (hkv, hd), (hkv, hdv), jit.attention_front

    def run() -> bool:
        pos = slots[ip]
        if state.valid != 1 or pos.shape != (1,):
            return False
        cos, sin = tables.at(pos)
        cache = state.cache
        s, e = cache.half_row(layer, pos, k_shape, v_shape)
        k16, v16, kpos = cache.half_buffers(layer)
        front(q2, k2, v2, qw, qeps, kw, keps, vw, veps, norms, v_norm, qn, kn, vn, qx, kx, cos, sin, dims, neox,
              qr, kr, kr_bits, v_bits, k16.view(np.uint16), v16.view(np.uint16), e - 1)
        for i, x in made:
            slots[i] = x
        slots[o] = attend(qr, k16[s:e], v16[s:e], kpos[s:e], int(pos[0]))
        return True
    return run


def _is_positions(plan, name: str) -> bool:
    """The program's positions input (one int32 per row: one here)."""
    info = _info(plan, name)
    return info is not None and name in plan.program.inputs and info.dtype == "int32" and list(info.shape) == [1]


def _reshape_run(slots, i: int, o: int, shape: tuple):
    def run():
        slots[o] = slots[i].reshape(shape)
    return run


def _norm_run(slots, i: int, o: int, shape: tuple, w: np.ndarray, eps):
    """RMSNorm over the last axis into a buffer of x's shape (C order, as the
    prepared kernel's empty_like of a C-order row)."""
    out = np.empty(shape, F32)
    out2, k, norm = out.reshape(-1, shape[-1]), shape[-1], jit.rms_norm

    def run():
        norm(slots[i].reshape(-1, k), w, eps, out2)
        slots[o] = out
    return run


def _rope_run(slots, i: int, p: int, o: int, shape: tuple, tables, dims: int, neox: bool):
    out, rope = np.empty(shape, F32), jit.rope

    def run():
        pos = slots[p]
        if pos.shape != (1,):
            raise_shape("RoPE", "positions", pos)
        cos, sin = tables.at(pos)
        rope(slots[i], cos, sin, dims, neox, out)
        slots[o] = out
    return run


def _attention_run(slots, ins: list, o: int, step: Step, shapes: list, shape: tuple, general, state):
    """The Attention step over the KV cache's fp16 rows (decode_attention.RowAttention:
    its output row and work buffers made once) for q [1, H, hd], k [1, Hkv, hd],
    v [1, Hkv, hdv] as the stretch makes them; None for other shapes. A run
    of more than one valid row (not a decode) takes `general` (the bound kernel's run)."""
    (q, k, v), layer = shapes, int(step.attrs["layer"])
    if (len(q) != 3 or len(k) != 3 or len(v) != 3 or q[0] != 1 or k[0] != 1 or v[:2] != k[:2]
            or k[1] == 0 or q[1] % k[1] or q[2] != k[2] or shape != (1, q[1] * v[2])):
        return None
    work = state.__dict__.setdefault("_row_work", decode_attention.RowWork())
    attend = decode_attention.RowAttention(q[1], k[1], q[2], v[2], float(step.attrs["scale"]),
                                           int(step.attrs["window"]), work)
    iq, ik, iv, ip = ins

    def run():
        pos = slots[ip]
        if state.valid != 1 or pos.shape != (1,):
            return general()
        k16, v16, kpos = state.cache.store_half(layer, slots[ik], slots[iv], pos)
        slots[o] = attend(slots[iq], k16, v16, kpos, int(pos[0]))
    return run


def _kernel_run(slots, ins: list, o: int, kernel, shape: tuple):
    def run():
        value = kernel([slots[i] for i in ins])[0]
        if value.shape != shape:
            raise_shape("Attention", "output", value)
        slots[o] = value
    return run


def raise_shape(label: str, what: str, value) -> None:
    from rkc.ir.errors import RkcError

    raise RkcError(f"{label}: the {what} came out {list(np.shape(value))} {np.asarray(value).dtype}, "
                   "not what the program declares")


def fusers_for(state) -> list:
    """The fusers of runtime/plan.py's hook, for plans sharing one generation state."""
    def attention(plan, steps, bind, outputs):
        return attention_stretch(plan, steps, bind, outputs, state)
    return [residual_stretch, ffn_stretch, attention, output_stretch]
