"""Fused CPU stretches for the load-time plans (runtime/plan.py): a stretch
of CPU steps between two NPU segments that matches a known pattern runs as
one prepared call instead of one call per step (each step's own call, checks
and allocations were most of its cost at one row).

The patterns are matched one row (decode) between

    in edges: Cast (fp16 NPU output -> fp32) | DequantizeRows (int32 NPU output)
              | CombineInt4 (an int4 product's int16 partials, int4_jit.combine_int4_atoms)
    out edge: Cast (fp32 -> fp16 NPU input) | QuantizeRows (-> int8 NPU input)
              | QuantizeNibbles (-> int4 nibble rows, int4_jit.quantize_nibbles_into_atoms)

(this module's _InEdge and _OutEdge), and are a decoder layer's
  - residual stretch (in edge, [RMSNorm], Add of the residual, RMSNorm, out
    edge: the body one compiled call, jit.norm_add_norm): here;
  - attention stretch (q, k, v in edges, Reshape views, the q/k norms, RoPE,
    Attention over the KV cache with buffers made once, out edge):
    runtime/llm/fused_attention.py;
  - gated stretch (gate and up in edges, the activation, Mul, out edge: the
    FFN's, or Gemma 4's per-layer input gate): runtime/llm/fused_gate.py;
and the head's output: the logits read from their BO (an in edge alone), and
an int8 token's embedding stretch (GatherPacked to the first QuantizeRows): here.
A fused call reads the previous segment's output from its BO and writes the
next segment's input into its BO, in their layouts; every step's output
still lands in its slot, so a later step reading one sees what the per-step
path gives it. The fp16 stretches' arithmetic is the per-step kernels' (the
same bits); the int8 ones between int8 products run as one compiled call
each in float32 of their own order (jit.residual_row, gated_row,
embedding_row: float64 shape sweeps in tests/llm/test_decode_stretches.py,
the plan's logits within tests/llm/test_plan.py's bounds). An int8 edge of two terms (--int8-residual: a row
and its residual row, `_terms`) is fused too. A stretch that does not match
runs step by step, as before.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.ir.types import DType
from rkc.runtime.half import narrow_into_atoms
from rkc.runtime.llm import int4_jit, int4_rows, jit
from rkc.runtime.kernels.hadamard import compiled_form
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

    def plain_int8(self) -> bool:
        """An int32 row of one K range and one term, dequantized into a buffer made once."""
        return (self.dequant is not None and self.partial is None and self.residual is None
                and self.int4 is None and not self.fresh)

    def half_row(self) -> bool:
        """A fp16 row of one term, widened into a buffer made once."""
        return self.atoms.dtype == np.uint16 and self.residual is None and self.int4 is None and not self.fresh

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
            int4_jit.combine_int4_atoms(atoms, self.k, n_pad, scales, rs, bias, has_bias, out, 0, 1, paired)
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


def in_edges_run(edges: Sequence[_InEdge], label: str) -> Callable[[], None]:
    """A function running `edges` in turn: two or three plain int8 ones (an
    attention stretch's q, k, v) as one compiled call (jit.dequantize_three),
    or fp16 ones (jit.half_three), their values into their slots."""
    if len(edges) in (2, 3) and all(e.half_row() for e in edges):
        return _half_edges_run(edges)
    if len(edges) not in (2, 3) or not all(e.plain_int8() for e in edges):
        def each():
            for e in edges:
                e.run(label)
        return each
    slots, third = edges[0].slots, edges[2] if len(edges) == 3 else edges[1]
    n2 = third.k if len(edges) == 3 else 0
    parts = [(e.dequant[0], e.atoms, e.k, e.dequant[1], e.dequant[2], e.dequant[3], e.flat) for e in edges]
    (s0, a0, k0, c0, b0, h0, f0), (s1, a1, k1, c1, b1, h1, f1) = parts[:2]
    s2, a2, _, c2, b2, h2, f2 = parts[-1]
    stores, kernel = [(e.slot, e.out) for e in edges], jit.dequantize_three

    def rows_scale(i: int):  # (the [1] array: the kernel reads its value, jit.row_value)
        rs = slots[i]
        if rs.shape != (1,) or rs.dtype != F32:
            raise_shape(label, "row scale", rs)
        return rs

    def three():
        kernel(a0, k0, rows_scale(s0), c0, b0, h0, f0, a1, k1, rows_scale(s1), c1, b1, h1, f1,
               a2, n2, rows_scale(s2), c2, b2, h2, f2)
        for i, v in stores:
            slots[i] = v
    return three


def _half_edges_run(edges: Sequence[_InEdge]) -> Callable[[], None]:
    """Two or three fp16 in edges as one compiled call (jit.half_three)."""
    slots, third = edges[0].slots, edges[2] if len(edges) == 3 else edges[1]
    (a0, k0, f0), (a1, k1, f1) = ((e.atoms, e.k, e.flat) for e in edges[:2])
    a2, k2, f2 = third.atoms, third.k if len(edges) == 3 else 0, third.flat
    stores, kernel = [(e.slot, e.out) for e in edges], jit.half_three

    def three():
        kernel(a0, k0, f0, a1, k1, f1, a2, k2, f2)
        for i, v in stores:
            slots[i] = v
    return three


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
        # jit.rotate_row's operands: block 0 is no rotation, a factor of no rows no block mixing
        self.signs, self.block, self.norm, self.factor = _NO_WEIGHT, 0, F32(1.0), _NO_FACTOR
        if form is not None:
            self.signs, self.block, self.norm = form.signs, form.block, form.norm
            self.factor = _NO_FACTOR if form.factor is None else form.factor
        self.work = np.empty((4, self.k), F32)  # the rotation's scratch rows, its rotated and mixed rows

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

    def plain_int8(self) -> bool:
        """QuantizeRows of one term into int8 codes."""
        return self.codes is not None and self.terms == 1 and not self.nibbles

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
        if self.terms == 1 and not self.nibbles:
            jit.rotate_quantize_row(value, self.signs, self.block, self.norm, self.factor, self.work, self.codes,
                                    self.scale)
        else:
            x = jit.rotate_row(value, self.signs, self.block, self.norm, self.factor, self.work)
            if self.nibbles:
                int4_jit.quantize_nibbles_into_atoms(x, self.codes, self.scale, int4_rows.ACT_LIMIT, 0, 1,
                                                     self.pair_group)
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
    if edge_in.plain_int8() and edge_out.plain_int8():  # int8 in and out: one compiled call
        return _bracket(plan, steps, [edge_in], edge_out,
                        _residual_int8(edge_in, edge_out, slots, o_res, k, (w1, e1, first_norm, scale, has_scale,
                                       w2, e2, last_norm, n1, total, scaled, n2), list(zip(o_body, body_out)),
                                       label), label)
    if edge_in.half_row() and edge_out.half is not None:  # fp16 in and out: one compiled call
        return _bracket(plan, steps, [edge_in], edge_out,
                        _residual_half(edge_in, edge_out, slots, o_res, k, (w1, e1, first_norm, scale, has_scale,
                                       w2, e2, last_norm, n1, total, scaled, n2), list(zip(o_body, body_out)),
                                       label), label)

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


def _residual_int8(edge_in: _InEdge, edge_out: _OutEdge, slots, o_res: int, k: int, body: tuple,
                   stores: list, label: str) -> Callable[[], None]:
    """The residual stretch between an int8 product's int32 row and the next
    int8 product's codes as one compiled call (jit.residual_row): a decode
    token's 2 x layers such stretches each paid five dispatches and their glue."""
    rs_slot, ch, bias, has_bias = edge_in.dequant
    w1, e1, first_norm, scale, has_scale, w2, e2, last_norm, n1, total, scaled, n2 = body
    atoms, flat, x, x_slot, kernel = edge_in.atoms, edge_in.flat, edge_in.out, edge_in.slot, jit.residual_row
    out, codes, qscale, q_slot = edge_out, edge_out.codes, edge_out.scale, edge_out.scale_slot
    # floats and the row scale's [1] array: numpy float32 scalars cost more to dispatch (residual_row
    # narrows the floats back to the same float32s and reads the row scale from its array)
    e1, e2, norm = float(e1), float(e2), float(out.norm)

    def call():
        rs, res = slots[rs_slot], slots[o_res]
        if rs.shape != (1,) or rs.dtype != F32:
            raise_shape(label, "row scale", rs)
        if res.shape != (1, k) or res.dtype != F32:
            raise_shape(label, "residual", res)
        kernel(atoms, k, rs, ch, bias, has_bias, flat, x, w1, e1, first_norm, res, scale, has_scale, w2, e2,
               last_norm, n1, total, scaled, n2, out.signs, out.block, norm, out.factor, out.work, codes, qscale)
        slots[x_slot] = x
        for o, v in stores:
            slots[o] = v
        slots[q_slot] = qscale
    return call


def _residual_half(edge_in: _InEdge, edge_out: _OutEdge, slots, o_res: int, k: int, body: tuple,
                   stores: list, label: str) -> Callable[[], None]:
    """The residual stretch between two fp16 products as one compiled call
    (jit.residual_half_row): three dispatches and their glue before."""
    w1, e1, first_norm, scale, has_scale, w2, e2, last_norm, n1, total, scaled, n2 = body
    atoms, flat, x, x_slot, half, kernel = edge_in.atoms, edge_in.flat, edge_in.out, edge_in.slot, edge_out.half, \
        jit.residual_half_row

    def call():
        res = slots[o_res]
        if res.shape != (1, k) or res.dtype != F32:
            raise_shape(label, "residual", res)
        kernel(atoms, k, flat, x, w1, e1, first_norm, res, scale, has_scale, w2, e2, last_norm, n1, total, scaled,
               n2, half)
        slots[x_slot] = x
        for o, v in stores:
            slots[o] = v
    return call


_NO_WEIGHT = np.ones(1, F32)  # (an absent norm's weight or scale: unread)
_NO_FACTOR = np.zeros((0, 0), F32)  # (no block-mixing factor)


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


def embedding_stretch(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """A decode token's first stretch: its embedding row gathered from the
    packed int8 head (GatherPacked, times its row scale, rotated back), Scale,
    RMSNorm, then QuantizeRows into the first segment's codes, as one compiled
    call (jit.embedding_row; four calls, numpy's indexing and products, ~60 us
    of an int8 token before); each step's value into its slot."""
    from rkc.ir.errors import FormatError
    from rkc.runtime.constants import constant_bytes
    from rkc.runtime.kernels.hadamard import compiled_form
    from rkc.runtime.llm.kernels import packed_view, rotation_of

    if [s.op for s in steps] != ["GatherPacked", "Scale", "RMSNorm", "QuantizeRows"]:
        return None
    gather, scale, norm, last = steps
    a, cols = gather.attrs, int(gather.attrs["cols"])
    tokens = gather.inputs[0]
    t_info = _info(plan, tokens)
    if (a.get("dtype") != "int8" or t_info is None or tokens not in plan.program.inputs or t_info.dtype != "int32"
            or list(t_info.shape) != [1] or len(gather.inputs) < 2 or not all(is_const(plan, n) for n in gather.inputs[1:])
            or any(n in outputs for st in steps for n in st.outputs)):
        return None
    chain = [(scale, gather.outputs[0]), (norm, scale.outputs[0])]
    if any(len(st.outputs) != 1 or not st.inputs or st.inputs[0] != src or not _row(plan, st.outputs[0], cols)
           for st, src in chain) or not _row(plan, gather.outputs[0], cols) or len(norm.inputs) != 2:
        return None
    w = const(plan, norm.inputs[1], (cols,))
    row_scale = const(plan, gather.inputs[1], (int(a["rows"]),))
    if w is None or row_scale is None or not _OutEdge.matches(plan, last, norm.outputs[0], cols):
        return None
    consts = [plan.slots[plan._slot(n)] for n in gather.inputs[2:]]
    rot = rotation_of(a, consts)
    form = compiled_form(rot, cols)
    if rot is not None and form is None:
        return None
    raw = constant_bytes(plan.model, plan.model.tensors[a["packed"]])
    if raw is None:
        return None
    try:
        view, kg, _ = packed_view(raw, int(a["rows"]), cols, np.dtype(np.int8))
    except FormatError:
        return None
    edge_out = _OutEdge(plan, last, bind)
    if not edge_out.plain_int8():
        return None
    signs, block, hnorm, factor_t = _NO_WEIGHT, 0, F32(1.0), _NO_FACTOR
    if form is not None:
        signs, block, hnorm = form.signs, form.block, form.norm
        factor_t = _NO_FACTOR if form.factor_t is None else np.ascontiguousarray(form.factor_t)
    ones, work = np.ones(cols, F32), np.empty((4, cols), F32)
    embd, scaled, normed = (np.empty((1, cols), F32) for _ in range(3))
    factor, eps, rows, kernel = F32(scale.attrs["factor"]), F32(norm.attrs["epsilon"]), int(a["rows"]), jit.embedding_row
    slots, i_tok = plan.slots, plan._slot(tokens)
    stores = [(plan._slot(st.outputs[0]), v) for st, v in zip(steps, (embd, scaled, normed))]
    q_slot, label = edge_out.scale_slot, "embedding stretch (GatherPacked, QuantizeRows)"

    def call():
        ids = slots[i_tok]
        token = int(ids[0])
        if ids.shape != (1,) or not 0 <= token < rows:
            from rkc.ir.errors import RkcError

            raise RkcError(f"{label}: token {token} is not a row of the {rows}-row embedding")
        kernel(view, token, kg, cols, row_scale, signs, block, hnorm, factor_t, ones, factor, w, eps, work, embd,
               scaled, normed, edge_out.signs, edge_out.block, edge_out.norm, edge_out.factor, edge_out.work,
               edge_out.codes, edge_out.scale)
        for o, v in stores:
            slots[o] = v
        slots[q_slot] = edge_out.scale
    call.label, call.ops = label, tuple(st.op for st in steps)
    return plan._bracketed([edge_out.bo], [call])


def _read_outside(plan, steps: Sequence[Step], but: str) -> bool:
    """Some step outside `steps` reads a value they make, other than `but`."""
    inside, made = {id(s) for s in steps}, {n for s in steps for n in s.outputs} - {but}
    return any(n in made for s in plan.program.steps if id(s) not in inside for n in s.inputs)


def raise_shape(label: str, what: str, value) -> None:
    from rkc.ir.errors import RkcError

    raise RkcError(f"{label}: the {what} came out {list(np.shape(value))} {np.asarray(value).dtype}, "
                   "not what the program declares")


def fusers_for(state) -> list:
    """The fusers of runtime/plan.py's hook, for plans sharing one generation state."""
    from rkc.runtime.llm.fused_attention import attention_stretch  # (they import this module's edges)
    from rkc.runtime.llm.fused_gate import ffn_stretch

    def attention(plan, steps, bind, outputs):
        return attention_stretch(plan, steps, bind, outputs, state)
    return [residual_stretch, ffn_stretch, attention, output_stretch, embedding_stretch]
