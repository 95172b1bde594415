"""Fused CPU stretches of many rows between int4 products (the int4 side of
runtime/llm/fused_rows.py, whose stretch matchers and edge plumbing these
share). A residual or gated-FFN stretch between int4 products (CombineInt4
reading an int4 product's K-group partials, QuantizeNibbles writing the next
one's nibble rows) runs as one compiled call over tiles (`int4_residual_rows`,
`int4_ffn_rows`: runtime/llm/int4_prefill.py). A stretch with int4 edges that
no fuser took (attention's) runs those edges as compiled calls on the atoms,
threaded over rows (`int4_edges`: q, k and v combined by tiles into
column-major rows; the numpy kernels' bits, tests/llm/test_int4_edges.py,
test_int4_prefill.py), its other steps one call each.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.runtime.kernels.hadamard import compiled_form
from rkc.runtime.llm import int4_prefill as int4_kernels
from rkc.runtime.llm import fused_rows, int4_jit, jit
from rkc.runtime.llm.fused import raise_shape
from rkc.runtime.llm.fused_rows import (_ACTIVATIONS, _NONE_F32, _NONE_VEC, F32, _ffn_shape, _gemm_operand,
                                        _read_elsewhere, _residual_call, _residual_stretch, _rows,
                                        _with_edges, block_mix, mix_then_quantize)
from rkc.runtime.llm.int4_rows import ACT_LIMIT
from rkc.runtime.llm.prefill_kernels import LANES
from rkc.runtime.llm.prefill_kernels import hadamard_rows as prefill_hadamard
from rkc.runtime.llm.stretch_match import const, host, is_const, step_rotation
from rkc.runtime.llm.threads import over_ranges, threads_for

class _Int4In:
    """An int4 product's [M, N] output combined from its int16 K-group partials
    in their atoms (CombineInt4: row 2m the hi nibble row's sums, 2m + 1 the
    lo row's; group g's channels at columns g * n_pad..)."""

    def __init__(self, plan, step: Step) -> None:
        bt = plan._bo_tensor(step.inputs[0])
        self.paired = "pair_group" in step.attrs
        self.m, (self.g, self.n) = bt.shape[0] // (4 if self.paired else 2), \
            (int(d) for d in plan.model.tensors[step.inputs[2]].shape)
        self.n_pad, self.atoms = bt.shape[1] // (-(-self.g // 2) if self.paired else self.g), bt.atoms
        self.bos = [plan.model.bos[bt.info.region]]
        self.scales = const(plan, step.inputs[2], (self.g, self.n))
        self.has_bias = len(step.inputs) == 4
        self.bias = const(plan, step.inputs[3], (self.n,)) if self.has_bias else _NONE_VEC
        self.rs_slot = plan._slot(step.inputs[1])

    @staticmethod
    def matches(plan, step: Step) -> tuple[int, int] | None:
        """(M, N) when `step` is a CombineInt4 of M rows from a BO into a host [M, N] fp32 tensor."""
        if step.op != "CombineInt4" or len(step.inputs) not in (3, 4) or len(step.outputs) != 1:
            return None
        bt = _gemm_operand(plan, step.inputs[0], "int16")
        scales_info = plan.model.tensors.get(step.inputs[2])
        per_row = 4 if "pair_group" in step.attrs else 2  # (paired: two K groups per block, int4_rows.pair_rows)
        if bt is None or bt.shape[0] % per_row or scales_info is None or len(scales_info.shape) != 2:
            return None
        m, (g, n) = bt.shape[0] // per_row, (int(d) for d in scales_info.shape)
        if per_row == 4 and m != 1:  # (int4_jit.combine_int4_atoms pairs one row: a score program's head runs numpy's)
            return None
        blocks = -(-g // 2) if per_row == 4 else g
        n_pad = bt.shape[1] // blocks if g else 0
        rs_info = plan.model.tensors.get(step.inputs[1])
        if (not g or const(plan, step.inputs[2], (g, n)) is None
                or (len(step.inputs) == 4 and const(plan, step.inputs[3], (n,)) is None)
                or bt.shape[1] != blocks * n_pad or n_pad < n or n_pad % bt.c2
                or not host(plan, step.inputs[1]) or rs_info is None or list(rs_info.shape) != [m]
                or not host(plan, step.outputs[0]) or not _rows(plan, step.outputs[0], m, n)):
            return None
        return m, n

    def row_scale(self, slots, label: str) -> np.ndarray:
        rs = slots[self.rs_slot]
        if rs.shape != (self.m,) or rs.dtype != F32:
            raise_shape(label, "row scale", rs)
        return rs


def _combine_int4(plan, step: Step, outputs: set):
    """CombineInt4 of M rows read straight from the partials' atoms (int4_jit.combine_int4_atoms,
    rows shared among threads) into a buffer made once, or None when `step` is not one."""
    mn = _Int4In.matches(plan, step)
    if mn is None:
        return None
    m, n = mn
    edge, slots = _Int4In(plan, step), plan.slots
    atoms, n_pad, scales, bias, has_bias = edge.atoms, edge.n_pad, edge.scales, edge.bias, edge.has_bias
    o, fresh, paired = plan._slot(step.outputs[0]), step.outputs[0] in outputs, edge.paired
    if m >= LANES:  # by tiles into column-major rows, as _in_edge_call writes the int8 build's
        buf, tiled = np.empty((m, n), F32, order="F"), int4_kernels.combine_tiles
        tiles, threads = -(-m // LANES), threads_for(m * n)

        def call_tiles():
            rs = edge.row_scale(slots, "CombineInt4")
            out = np.empty((m, n), F32, order="F") if fresh else buf
            over_ranges(lambda lo, hi: tiled(atoms, n_pad, scales, rs, bias, has_bias, out.T, lo, hi), tiles, threads)
            slots[o] = out
        call_tiles.bos, call_tiles.label = edge.bos, "CombineInt4 edge of rows (compiled)"
        return call_tiles
    buf, run = np.empty((m, n), F32), int4_jit.combine_int4_atoms

    def call():
        rs = edge.row_scale(slots, "CombineInt4")
        out = np.empty((m, n), F32) if fresh else buf
        over_ranges(lambda lo, hi: run(atoms, n, n_pad, scales, rs, bias, has_bias, out, lo, hi, paired), m)
        slots[o] = out
    call.bos, call.label = edge.bos, "CombineInt4 edge (compiled)"
    return call


class _NibbleOut:
    """The next int4 product's input: [M, K] rows rotated (a compiled form:
    signs and butterflies, the block-mixing factor as block_mix's product) and
    quantized to codes in [-ACT_LIMIT, ACT_LIMIT], written as two nibble
    rows each into the int4 operand's atoms (QuantizeNibbles), the row
    scales into their slot."""

    def __init__(self, plan, step: Step) -> None:
        bt = plan._bo_tensor(step.outputs[0])
        self.bo, self.q = plan.model.bos[bt.info.region], bt.atoms.view(np.uint8)
        m, k = bt.shape[0] // 2, 2 * bt.shape[1]
        form = compiled_form(step_rotation(plan, step), k)  # (matches: one)
        self.signs, self.block, self.hnorm = form.signs, form.block, form.norm
        self.scale_slot, self.scale = plan._slot(step.outputs[1]), np.empty(m, F32)
        self.to_blocks = form.factor is not None
        self.mix = block_mix(form.factor) if self.to_blocks else None
        blocks = k // form.block  # by blocks [K / block, M x block]: the factor's product is one GEMM
        self.rotated = np.empty((blocks, m * form.block), F32) if self.to_blocks else _NONE_F32
        self.mixed = np.empty_like(self.rotated) if self.to_blocks else None

    @staticmethod
    def matches(plan, step: Step, src: str, m: int, k: int) -> bool:
        if (step.op != "QuantizeNibbles" or len(step.outputs) != 2 or not step.inputs or step.inputs[0] != src
                or "pair_group" in step.attrs):
            return False
        bt = _gemm_operand(plan, step.outputs[0], "int8")
        if bt is None or tuple(bt.shape) != (2 * m, k // 2) or k % 32 or not host(plan, step.outputs[1]):
            return False
        if not all(is_const(plan, n) for n in step.inputs[1:]):
            return False
        return compiled_form(step_rotation(plan, step), k) is not None

    def finish(self, slots) -> None:
        """After the tiles: a factor's product and the nibble rows; the scales into their slot."""
        if self.to_blocks:
            mixed, block, q, scale = self.mixed, self.block, self.q, self.scale
            run = int4_kernels.quantize_nibble_blocks_into_atoms
            mix_then_quantize(self.mix, self.rotated, mixed, block,
                              lambda lo, hi: run(mixed, block, q, scale, ACT_LIMIT, lo, hi))
        slots[self.scale_slot] = self.scale


def int4_residual_rows(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """A many-row residual stretch between two int4 products (CombineInt4,
    [RMSNorm], Add, RMSNorm, QuantizeNibbles; Gemma 4's bodies too, as
    fused_rows.residual_rows) as one compiled call over tiles
    (int4_prefill.residual_tiles, bracketed), else None."""
    found = _residual_stretch(plan, steps, outputs, _Int4In, _NibbleOut, min_rows=LANES,
                              bodies=fused_rows.ONE_ROW_BODIES)
    if found is None:
        return None
    first, last, m, k, residual, first_norm, (w1, e1), (w2, e2), keep, bufs, stores, matched = found
    has_scale, last_norm = matched.scale is not None, matched.last is not None
    body_scale = F32(matched.scale[0]) if has_scale else F32(1.0)
    edge_in, edge_out = _Int4In(plan, first), _NibbleOut(plan, last)
    slots, label = plan.slots, "int4 residual stretch of rows (CombineInt4, QuantizeNibbles)"

    def args_of(res: np.ndarray) -> tuple:
        return (edge_in.atoms, edge_in.n_pad, edge_in.scales, edge_in.row_scale(slots, label), edge_in.bias,
                edge_in.has_bias, first_norm, w1, e1, res, body_scale, has_scale, last_norm, w2, e2, *keep, *bufs,
                edge_out.signs, edge_out.block, edge_out.hnorm, edge_out.q, edge_out.scale, ACT_LIMIT,
                edge_out.rotated, edge_out.to_blocks)
    return _residual_call(plan, steps, label, int4_kernels.residual_tiles, args_of, edge_in, edge_out, residual,
                          m, k, stores)


def int4_ffn_rows(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """A many-row gated FFN stretch between int4 products (gate and up
    CombineInt4, act(gate), Mul by up, QuantizeNibbles) as one compiled call
    over tiles (int4_prefill.ffn_tiles, bracketed), else None; no value but
    the out edge's read elsewhere."""
    shape = _ffn_shape(plan, steps, outputs, _Int4In, _NibbleOut, min_rows=LANES)
    if shape is None:
        return None
    gate, up, act, last, m, k = shape
    g, u, edge_out = _Int4In(plan, gate), _Int4In(plan, up), _NibbleOut(plan, last)
    run, act_kind, slots = int4_kernels.ffn_tiles, _ACTIVATIONS[act.op], plan.slots
    label = f"int4 ffn stretch of rows (CombineInt4, {act.op}, QuantizeNibbles)"

    def call():
        args = (g.atoms, g.n_pad, g.scales, g.row_scale(slots, label), g.bias, g.has_bias,
                u.atoms, u.n_pad, u.scales, u.row_scale(slots, label), u.bias, u.has_bias, act_kind, m, k,
                edge_out.signs, edge_out.block, edge_out.hnorm, edge_out.q, edge_out.scale, ACT_LIMIT,
                edge_out.rotated, edge_out.to_blocks)
        over_ranges(lambda lo, hi: run(*args, lo, hi), -(-m // LANES))
        edge_out.finish(slots)
    call.label, call.ops = label, tuple(s.op for s in steps)
    return plan._bracketed([*g.bos, *u.bos, edge_out.bo], [call])


def _quantize_nibbles(plan, step: Step):
    """QuantizeNibbles of M rows (rotated by the compiled butterflies, the factor
    as numpy's product) written straight into the int4 operand's atoms
    (int4_jit.quantize_nibbles_into_atoms, rows shared among threads), or None."""
    if step.op != "QuantizeNibbles" or len(step.outputs) != 2 or not step.inputs:
        return None
    bt = _gemm_operand(plan, step.outputs[0], "int8")
    pair = int(step.attrs.get("pair_group", 0))  # four rows per row (int4_rows.pair_rows)
    per_row = 4 if pair else 2
    if bt is None or bt.shape[0] % per_row or not host(plan, step.outputs[1]) or not host(plan, step.inputs[0]):
        return None
    m, k = bt.shape[0] // per_row, 2 * bt.shape[1]
    if pair and m >= LANES:  # (the tiled rotation writes two rows per row)
        return None
    if k % 32 or not _rows(plan, step.inputs[0], m, k) or not all(is_const(plan, n) for n in step.inputs[1:]):
        return None
    rot = step_rotation(plan, step)
    form = compiled_form(rot, k)
    if rot is not None and form is None:
        return None
    codes, scale, slots = bt.atoms.view(np.uint8), np.empty(m, F32), plan.slots
    i, scale_slot, run = plan._slot(step.inputs[0]), plan._slot(step.outputs[1]), int4_jit.quantize_nibbles_into_atoms
    rotated = None if form is None else np.empty((m, k), F32)
    mixed = None if form is None or form.factor is None else np.empty((m, k // form.block, form.block), F32)
    hadamard = prefill_hadamard if m >= LANES else jit.hadamard_rows

    if form is not None and form.factor is None and m >= LANES:  # rotated and quantized by tiles, in one pass
        tiles, tiled = -(-m // LANES), int4_jit.rotate_nibbles_into_atoms

        def call_tiles():
            x = slots[i]
            if x.shape != (m, k) or x.dtype != F32:
                raise_shape("QuantizeNibbles", "input", x)
            over_ranges(lambda lo, hi: tiled(x, form.signs, form.block, form.norm, codes, scale, ACT_LIMIT, lo, hi),
                        tiles)
            slots[scale_slot] = scale
        call_tiles.bos, call_tiles.label = [plan.model.bos[bt.info.region]], "QuantizeNibbles edge (compiled)"
        return call_tiles

    def call():
        x = slots[i]
        if x.shape != (m, k) or x.dtype != F32:
            raise_shape("QuantizeNibbles", "input", x)
        if form is not None:
            hadamard(x, form.signs, form.block, form.norm, rotated)
            x = rotated
            if mixed is not None:  # F mixes the blocks
                np.matmul(form.factor, rotated.reshape(mixed.shape), out=mixed)
                x = mixed.reshape(m, k)
        over_ranges(lambda lo, hi: run(x, codes, scale, ACT_LIMIT, lo, hi, pair), m)
        slots[scale_slot] = scale
    call.bos, call.label = [plan.model.bos[bt.info.region]], "QuantizeNibbles edge (compiled)"
    return call


def int4_edges(plan, steps: Sequence[Step], bind, outputs: set) -> list[Callable[[], None]] | None:
    """A stretch with int4 edges (CombineInt4 from a BO, QuantizeNibbles into
    one) that no other fuser took: those edges compiled (_combine_int4,
    _quantize_nibbles; Gemma 4's per-layer inputs: prefill_per_layer), every
    other step its own call as the plan makes it; None when the stretch has
    no such edge."""
    if not any(s.op in ("CombineInt4", "QuantizeNibbles") for s in steps):
        return None
    edges = [_combine_int4(plan, s, outputs) or _quantize_nibbles(plan, s) for s in steps]
    taken: set = set()
    elsewhere = _read_elsewhere(plan, steps)
    for i in range(len(steps)):
        chain = None if edges[i] else fused_rows.per_layer_chain(plan, steps, i, outputs, None, elsewhere)
        if chain is not None:
            edges[i] = chain[0]
            taken.update(chain[1][1:])
    return _with_edges(plan, steps, edges, bind, outputs, taken)
