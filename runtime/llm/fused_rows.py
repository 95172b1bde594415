"""Fused CPU stretches of many rows (prefill chunks) for the load-time plans
(runtime/plan.py's fusers hook; runtime/llm/fused.py holds the one-row forms
decode runs). A decoder layer's residual stretch between two NPU segments

    in edge: Cast (fp16 NPU output -> fp32) | DequantizeRows (int32 NPU output)
    [RMSNorm], Add of the residual, [ScaleBy], [RMSNorm] (Gemma 4's: the sum
    scaled by the layer output scale, or quantized with no second norm)
    out edge: Cast (fp32 -> fp16 NPU input) | QuantizeRows (-> int8 NPU input)

runs as one compiled call over tiles of rows (runtime/llm/prefill_fused.py)
that reads the previous segment's output from its BO's atoms and writes the
next segment's input into its BO's atoms, no array in between. A rotation
with a block-mixing factor takes its product and the codes in a second
compiled call after the tiles (prefill_fused.mix_into_atoms). The values a later step reads (the residual sum, the
row scales) land in their slots, in buffers made once; values nothing else
reads are not stored. The arithmetic is the per-step kernels' (the same bits:
tests/llm/test_plan.py, tests/llm/test_prefill_fused.py).

The stretches between int4 products (CombineInt4 and QuantizeNibbles edges)
are runtime/llm/fused_int4_rows.py's, built on this module's matchers.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.ir.types import DType
from rkc.runtime.llm import prefill_channels as channels
from rkc.runtime.llm import prefill_fused as kernels
from rkc.runtime.llm import prefill_rows
from rkc.runtime.llm.fused import raise_shape
from rkc.runtime.llm.prepared import rope_tables
from rkc.runtime.llm.stretch_match import (ONE_ROW_BODIES, RESIDUAL_BODIES, const, host, is_const, residual_body,
                                           residual_shape, step_rotation)
from rkc.runtime.kernels.hadamard import compiled_form, hartley_matrix, hartley_split
from rkc.runtime.llm.prefill_kernels import ACT_GELU_TANH, ACT_SILU, LANES, live_rows
from rkc.runtime.llm.prefill_per_layer import gate_rows, per_layer_chain
from rkc.runtime.llm.threads import THREADS, over_ranges, threads_for

F32 = np.float32
_NONE_F32 = np.zeros((0, 0), F32)  # an output the kernel does not store
_NONE_VEC = np.zeros(0, F32)
_SLAB = LANES  # rows of a factor's product then codes at once: 573 KB of mixed rows at K = 8960 (an L2)


def live_tiles(state, m: int) -> int:
    """Tiles of LANES rows of an [m, K] chunk that hold its real tokens
    (prefill_kernels.live_rows: the pad rows past them are left as the last
    run left them). Without a state: all."""
    return -(-live_rows(state, m) // LANES)


def _rows(plan, name: str, m: int, k: int) -> bool:
    info = plan.model.tensors.get(name)
    return info is not None and list(info.shape) == [m, k] and info.dtype == "fp32"


def _gemm_operand(plan, name: str, dtype: str):
    bt = plan._bo_tensor(name)
    if bt is None or bt.info.layout != "native-gemm" or bt.info.dtype != dtype or len(bt.shape) != 2:
        return None
    return bt


_NO_PARTIAL = np.zeros((0, 0, 0), np.int32)


class _InEdge:
    """The previous segment's [M, K] output: fp16 widened, or int32 dequantized
    (one K partial, or two added: a product with K > 8192)."""

    def __init__(self, plan, step: Step) -> None:
        self.kind = kernels.IN_HALF if step.op == "Cast" else kernels.IN_DEQUANT
        p = _partials(step)
        bt = plan._bo_tensor(step.inputs[0])
        self.bo, self.m, self.k = plan.model.bos[bt.info.region], bt.m, bt.k
        self.bos = [self.bo]
        atoms = bt.atoms
        self.src = atoms.view(np.uint16) if self.kind == kernels.IN_HALF else atoms
        self.extra = _NO_PARTIAL
        if p == 2:
            second = plan._bo_tensor(step.inputs[1])
            self.extra = second.atoms
            self.bos.append(plan.model.bos[second.info.region])
        self.rs_slot, self.ch, self.bias, self.has_bias = None, _NONE_VEC, _NONE_VEC, False
        if self.kind == kernels.IN_DEQUANT:
            self.rs_slot = plan._slot(step.inputs[p])
            self.ch = const(plan, step.inputs[p + 1], (self.k,))
            self.has_bias = len(step.inputs) == p + 3
            self.bias = const(plan, step.inputs[p + 2], (self.k,)) if self.has_bias else self.ch

    @staticmethod
    def matches(plan, step: Step) -> tuple[int, int] | None:
        """(M, K) when `step` reads a many-row segment output into a host [M, K] fp32 tensor."""
        if len(step.outputs) != 1 or not step.inputs or not step.inputs[0]:
            return None
        kind = "fp16" if step.op == "Cast" else "int32"
        bt = _gemm_operand(plan, step.inputs[0], kind)
        if bt is None:
            return None
        m, k = bt.shape
        if m < LANES or not host(plan, step.outputs[0]) or not _rows(plan, step.outputs[0], m, k):
            return None
        if step.op == "Cast" and len(step.inputs) == 1 and DType(step.attrs["to"]).numpy == F32:
            return m, k
        p = _partials(step)
        if step.op != "DequantizeRows" or not p or int(step.attrs.get("terms", 1)) != 1:
            return None
        if p == 2:
            second = _gemm_operand(plan, step.inputs[1], "int32")
            if second is None or second.shape != bt.shape or second.atoms.shape != bt.atoms.shape:
                return None
        rs = plan.model.tensors.get(step.inputs[p]) if len(step.inputs) > p else None
        if (len(step.inputs) in (p + 2, p + 3) and host(plan, step.inputs[p]) and rs is not None
                and list(rs.shape) == [m] and rs.dtype == "fp32"
                and all(const(plan, n, (k,)) is not None for n in step.inputs[p + 1:])):
            return m, k
        return None

    def row_scale(self, slots, label: str) -> np.ndarray:
        if self.rs_slot is None:
            return _NONE_VEC
        rs = slots[self.rs_slot]
        if rs.shape != (self.m,) or rs.dtype != F32:
            raise_shape(label, "row scale", rs)
        return rs


def _partials(step: Step) -> int:
    """A DequantizeRows' K partials the fused in edge adds (1 or 2), else 0."""
    p = int(step.attrs.get("partials", 1)) if step.op == "DequantizeRows" else 1
    return p if p in (1, 2) else 0


class _OutEdge:
    """The next segment's [M, K] input: fp16 narrowed, or int8 (rotated) with a scale per row."""

    def __init__(self, plan, step: Step) -> None:
        bt = plan._bo_tensor(step.outputs[0])
        self.bo, atoms = plan.model.bos[bt.info.region], bt.atoms
        m, k = bt.shape
        self.signs, self.block, self.hnorm, self.mix = _NONE_VEC, 1, F32(1.0), None
        self.scale_slot, self.scale = None, _NONE_VEC
        self.rotated = _NONE_F32
        if step.op == "Cast":
            self.kind, self.dst = kernels.OUT_HALF, atoms.view(np.uint16)
            return
        self.dst = atoms
        self.scale_slot, self.scale = plan._slot(step.outputs[1]), np.empty(m, F32)
        form = compiled_form(step_rotation(plan, step), k)  # (matches: one)
        self.signs, self.block, self.hnorm = form.signs, form.block, form.norm
        if form.factor is None:
            self.kind = kernels.OUT_QUANT
            return
        blocks = k // form.block  # by blocks [K / block, M x block]: the factor's product is one GEMM
        self.kind, self.rotated = kernels.OUT_ROTATED, np.empty((blocks, m * form.block), F32)
        self.mix = factor_operands(form.factor)  # chosen once: the plan's factor is fixed
        self.mixed = np.empty_like(self.rotated)

    @staticmethod
    def matches(plan, step: Step, src: str, m: int, k: int) -> bool:
        if not step.inputs or step.inputs[0] != src or not step.outputs:
            return False
        if step.op == "Cast":
            bt = _gemm_operand(plan, step.outputs[0], "fp16")
            return bt is not None and bt.shape == (m, k) and len(step.inputs) == 1 and len(step.outputs) == 1
        if step.op != "QuantizeRows" or len(step.outputs) != 2 or int(step.attrs.get("terms", 1)) != 1:
            return False
        bt = _gemm_operand(plan, step.outputs[0], "int8")
        if bt is None or bt.shape != (m, k) or not host(plan, step.outputs[1]):
            return False
        if not all(is_const(plan, n) for n in step.inputs[1:]):
            return False
        return compiled_form(step_rotation(plan, step), k) is not None

    def finish(self, slots, threads: int = THREADS) -> None:
        """After the tiles: a factor's product and the codes into the atoms
        (prefill_fused.mix_into_atoms, one compiled call a range of rows on
        `threads` threads); the scales into their slot."""
        if self.mix is not None:
            args = (self.rotated, self.mixed, *self.mix, self.block, self.dst, self.scale)
            over_ranges(lambda lo, hi: kernels.mix_into_atoms(*args, lo, hi), self.rotated.shape[1] // self.block,
                        threads)
        if self.scale_slot is not None:
            slots[self.scale_slot] = self.scale


def mix_then_quantize(mix: Callable[[np.ndarray, np.ndarray, int, int], None], rotated: np.ndarray,
                      mixed: np.ndarray, block: int, quantize: Callable[[int, int], None],
                      threads: int = THREADS) -> None:
    """A rotation's block-mixing factor (its product `mix`, block_mix's)
    over rows given by blocks (rotated, mixed [K / block, M x block], C
    order), then quantize(lo, hi) of those rows: each of the pool's row
    ranges takes its columns' product, then their codes, _SLAB rows at a
    time (a slab's mixed rows are quantized while in cache). For a
    quantizer other than the int8 codes (the int4 nibbles'); the int8 out
    edges take prefill_fused.mix_into_atoms, one compiled call a range."""

    def part(lo: int, hi: int) -> None:
        for s in range(lo, hi, _SLAB):
            e = min(hi, s + _SLAB)
            mix(rotated, mixed, s * block, e * block)
            quantize(s, e)
    over_ranges(part, rotated.shape[1] // block, threads)


_FACTORS: dict = {}  # a factor's bytes -> its operands (a few factors a model)
_NO_SPLIT = (np.zeros((0, 0), F32), np.zeros((0, 0), F32), np.zeros((0, 0), np.int64), np.zeros((0, 0), np.int64))


def factor_operands(factor: np.ndarray) -> tuple:
    """prefill_rows.factor_mix's operands for a block-mixing factor: (factor,
    h1, h2, pin, pout), a Hartley factor of coprime composite order (Qwen2.5's
    C35 at K = 8960) in its prime-factor form (12 multiply-adds a value for
    35), any other (h1 empty) by its own product. Looked up once at load (the
    factor's ~5 KB hashed)."""
    key = (factor.shape, factor.tobytes())
    ops = _FACTORS.get(key)
    if ops is None:
        m, f = factor.shape[0], np.ascontiguousarray(factor, F32)
        split = hartley_split(m) if np.array_equal(factor, hartley_matrix(m).astype(F32)) else None
        if split is None:
            ops = (f, *_NO_SPLIT)
        else:
            m1, m2, pin, pout = split
            ops = (f, hartley_matrix(m1).astype(F32), hartley_matrix(m2).astype(F32), pin, pout)
        _FACTORS[key] = ops
    return ops


_NO_PEAK = np.zeros(0, np.uint32)


def block_mix(factor: np.ndarray) -> Callable[[np.ndarray, np.ndarray, int, int], None]:
    """mix(x, out, lo, hi): out[:, lo:hi] = factor @ x[:, lo:hi]
    (prefill_rows.factor_mix with factor_operands', no peaks)."""
    ops = factor_operands(factor)

    def mix(x: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
        prefill_rows.factor_mix(x, out, *ops, lo, hi, 1, 0, _NO_PEAK)
    return mix


def _read_elsewhere(plan, steps: Sequence[Step]) -> set:
    """Names the stretch makes that a step outside it reads."""
    inside = {id(s) for s in steps}
    return {n for s in plan.program.steps if id(s) not in inside for n in s.inputs if n}


def _residual_stretch(plan, steps: Sequence[Step], outputs: set, in_edge, out_edge, min_rows: int,
                      bodies: tuple = RESIDUAL_BODIES, kept_order: Callable[[Step, Step], str] | None = None):
    """A residual stretch (one of `bodies`: [RMSNorm], Add, [ScaleBy],
    [RMSNorm] between an `in_edge` of at least `min_rows` rows and an
    `out_edge`), as (in step, out step, m, k, residual's name, first_norm,
    (w1, e1), (w2, e2), keep, bufs, stores, body), else None: `keep` says
    which of x, n1, total (scaled, with a ScaleBy), n2 are read elsewhere,
    `bufs` their [m, k] stores (column-major: a tile's lanes are one
    contiguous run per channel, for this store and for the next stretch's
    read of the residual; or kept_order(first, last)'s), `body` the matched
    ResidualBody."""
    shape = residual_shape(steps, outputs, bodies)
    if shape is None:
        return None
    first, body, last = shape
    mk = in_edge.matches(plan, first)
    if mk is None or mk[0] < min_rows:
        return None
    m, k = mk
    matched = residual_body(plan, body, first.outputs[0], k, lambda name: _rows(plan, name, m, k))
    if matched is None or not out_edge.matches(plan, last, matched.out, m, k):
        return None
    wanted = _read_elsewhere(plan, steps)
    outs = [s.outputs[0] for s in body]  # [n1], total, [scaled], [n2]
    first_norm, scaled, last_norm = matched.first is not None, matched.scale is not None, matched.last is not None
    total = outs[int(first_norm)]
    if scaled and total in wanted:  # the tiles keep the scaled sum only
        return None
    names = [first.outputs[0], outs[0] if first_norm else None, outs[int(first_norm) + int(scaled)],
             outs[-1] if last_norm else None]  # x, n1, total (scaled), n2
    keep = [n is not None and n in wanted for n in names]
    order = kept_order(first, last) if kept_order is not None else "F"
    bufs = [np.empty((m, k), F32, order=order) if kept else _NONE_F32 for kept in keep]
    stores = [(plan._slot(n), b) for n, b, kept in zip(names, bufs, keep) if kept]
    w2e2 = matched.last or (_NONE_VEC, F32(0.0))
    return (first, last, m, k, matched.residual, first_norm, matched.first or w2e2, w2e2,
            keep, bufs, stores, matched)


def _kept_order(plan, first: Step, last: Step) -> str:
    """The kept values' order: C where the kernel goes row by row
    (prefill_fused.residual_by_rows; the next stretch reads the sum as its
    residual, rows contiguous), else F (the tiles' lanes contiguous)."""
    edge_in, edge_out = _InEdge(plan, first), _OutEdge(plan, last)  # (its buffers: np.empty, never touched)
    return "C" if kernels.residual_by_rows(edge_in.kind, edge_in.src, edge_out.kind, edge_out.block) else "F"


def residual_rows(plan, steps: Sequence[Step], bind, outputs: set, state=None) -> list[Callable[[], None]] | None:
    """A many-row residual stretch's calls (one, bracketed), else None; Gemma
    4's bodies too (the FFN's sum with no second norm, the per-layer
    projection's sum scaled by the layer output scale)."""
    found = _residual_stretch(plan, steps, outputs, _InEdge, _OutEdge, min_rows=1, bodies=ONE_ROW_BODIES,
                              kept_order=lambda first, last: _kept_order(plan, first, last))
    if found is None:
        return None
    first, last, m, k, residual, first_norm, (w1, e1), (w2, e2), keep, bufs, stores, matched = found
    has_scale, last_norm = matched.scale is not None, matched.last is not None
    body_scale = F32(matched.scale[0]) if has_scale else F32(1.0)
    edge_in, edge_out = _InEdge(plan, first), _OutEdge(plan, last)
    slots, label = plan.slots, f"residual stretch of rows ({first.op}, {last.op})"

    def args_of(res: np.ndarray) -> tuple:
        return (edge_in.kind, edge_in.src, edge_in.extra, edge_in.row_scale(slots, label), edge_in.ch,
                edge_in.bias, edge_in.has_bias, first_norm, w1, e1, res, body_scale, has_scale, last_norm,
                w2, e2, *keep, *bufs, edge_out.kind, edge_out.dst, edge_out.signs, edge_out.block,
                edge_out.hnorm, edge_out.scale, edge_out.rotated)
    return _residual_call(plan, steps, label, kernels.residual_tiles, args_of, edge_in, edge_out, residual, m, k,
                          stores, state)


def _residual_call(plan, steps: Sequence[Step], label: str, run, args_of, edge_in, edge_out, residual: str,
                   m: int, k: int, stores, state=None) -> list[Callable[[], None]]:
    """A residual stretch's one bracketed call: `run(*args_of(residual), lo, hi)`
    over tiles of rows on the pool (the real tokens' tiles, `live_tiles`, given
    the generation state), then the out edge's finish and the stored values."""
    o_res, slots = plan._slot(residual), plan.slots

    def call():
        res = slots[o_res]
        if res.shape != (m, k) or res.dtype != F32:
            raise_shape(label, "residual", res)
        args = args_of(res)
        over_ranges(lambda lo, hi: run(*args, lo, hi), live_tiles(state, m))
        edge_out.finish(slots)
        for o, b in stores:
            slots[o] = b
    call.label, call.ops = label, tuple(s.op for s in steps)
    return plan._bracketed([*edge_in.bos, edge_out.bo], [call])


_ACTIVATIONS = {"SiLU": ACT_SILU, "GeluTanh": ACT_GELU_TANH}


def _ffn_shape(plan, steps: Sequence[Step], outputs: set, in_edge, out_edge, min_rows: int):
    """(gate, up, act, out edge, m, k) when `steps` are a gated FFN stretch:
    gate and up in edges of `in_edge`'s kind and one shape (at least
    `min_rows` rows), act(gate), Mul by up, an `out_edge` of the product, no
    program output and no value but the out edge's read elsewhere; else None."""
    if len(steps) != 5 or any(n in outputs for s in steps for n in s.outputs):
        return None
    e1, e2, act, mul, last = steps
    mk = in_edge.matches(plan, e1)
    if mk is None or mk[0] < min_rows or in_edge.matches(plan, e2) != mk or act.op not in _ACTIVATIONS:
        return None
    m, k = mk
    if len(act.inputs) != 1 or act.inputs[0] not in (e1.outputs[0], e2.outputs[0]) or mul.op != "Mul":
        return None
    gate, up = (e1, e2) if act.inputs[0] == e1.outputs[0] else (e2, e1)
    if sorted(mul.inputs) != sorted([act.outputs[0], up.outputs[0]]) or len(mul.outputs) != 1:
        return None
    if not all(host(plan, s.outputs[0]) and _rows(plan, s.outputs[0], m, k) for s in (act, mul)):
        return None
    if not out_edge.matches(plan, last, mul.outputs[0], m, k):
        return None
    if set(_read_elsewhere(plan, steps)) & {s.outputs[0] for s in (e1, e2, act, mul)}:
        return None
    return gate, up, act, last, m, k


def ffn_rows(plan, steps: Sequence[Step], bind, outputs: set, state=None) -> list[Callable[[], None]] | None:
    """A many-row gated FFN stretch's calls (one, bracketed), else None: gate
    and up in edges (of one kind), act(gate), Mul by up, the out edge; no
    value but the out edge's read elsewhere (nothing else is stored)."""
    shape = _ffn_shape(plan, steps, outputs, _InEdge, _OutEdge, min_rows=1)
    if shape is None:
        return None
    gate, up, act, last, m, k = shape
    if gate.op != up.op:
        return None
    edge_g, edge_u, edge_out = _InEdge(plan, gate), _InEdge(plan, up), _OutEdge(plan, last)
    run, act_kind, slots = kernels.ffn_tiles, _ACTIVATIONS[act.op], plan.slots
    label = f"ffn stretch of rows ({gate.op}, {act.op}, {last.op})"

    def call():
        args = (edge_g.kind, edge_g.src, edge_g.extra, edge_g.row_scale(slots, label), edge_g.ch, edge_g.bias,
                edge_g.has_bias, edge_u.src, edge_u.extra, edge_u.row_scale(slots, label), edge_u.ch, edge_u.bias,
                edge_u.has_bias, act_kind, m, k, edge_out.kind, edge_out.dst, edge_out.signs, edge_out.block,
                edge_out.hnorm, edge_out.scale, edge_out.rotated)
        over_ranges(lambda lo, hi: run(*args, lo, hi), live_tiles(state, m))
        edge_out.finish(slots)
    call.label, call.ops = label, tuple(s.op for s in steps)
    return plan._bracketed([*edge_g.bos, *edge_u.bos, edge_out.bo], [call])


# -- the edges of a stretch no fuser took whole (attention's: q, k, v in; its output out) -------------------

def _in_edge_call(plan, step: Step, outputs: set, state=None):
    """A many-row DequantizeRows or fp16 Cast of an NPU output (_InEdge; a
    lone Cast is attention's values) as one compiled call over the real
    tokens' tiles shared among the threads, into a column-major buffer made
    once (a fresh one when it is a program output), else None. A Cast
    widened here (widen_value, vectorised) rather than by the plan's reader
    (widen_bits over every row: NaN payloads kept, scalar): Gemma 3 270M's
    128 x 256 values 24-40 against 40-51 us."""
    mk = _InEdge.matches(plan, step)
    if mk is None:
        return None
    m, k = mk
    edge, o, fresh, slots = _InEdge(plan, step), plan._slot(step.outputs[0]), step.outputs[0] in outputs, plan.slots
    buf, run = np.empty((m, k), F32, order="F"), kernels.in_edge_tiles
    label = f"{step.op} edge of rows"

    threads = threads_for(m * k)

    def call():  # column-major rows, as the per-step path reads an NPU output (RoPE's tokens-inner loops)
        out = np.empty((m, k), F32, order="F") if fresh else buf
        args = (edge.kind, edge.src, edge.extra, edge.row_scale(slots, label), edge.ch, edge.bias, edge.has_bias, out.T)
        over_ranges(lambda lo, hi: run(*args, lo, hi), live_tiles(state, m), threads)
        slots[o] = out
    call.bos, call.label = edge.bos, label
    return call


def _out_edge_call(plan, step: Step, state=None):
    """A many-row QuantizeRows of host rows into an int8 NPU operand
    (_OutEdge), or a Cast of host rows into an fp16 one (attention's
    output), as one compiled call over the real tokens' tiles (`live_tiles`:
    a pad row's atoms are left as the last run left them, as the fused
    stretches leave theirs), else None. C-order rows go into fp16 atoms by
    prefill_fused.half_rows_into_atoms (a row's contiguous narrowing; the
    plan's bit-exact writer, a scalar select per value, cost 1.5-2x), and
    into int8 ones row by row (out_edge_tiles), the codes straight into the
    atoms: without a factor 0.85-0.9x the per-step path's rotation and codes
    plus the plan's copy into the atoms (Gemma 4 E2B's 128 x 2048 attention
    output, h51f's note); other rows by out_edge_tiles' transposing load."""
    kind = {"Cast": "fp16", "QuantizeRows": "int8"}.get(step.op)
    if kind is None or not step.inputs or not step.outputs:
        return None
    bt = _gemm_operand(plan, step.outputs[0], kind)
    if bt is None or bt.shape[0] < LANES:
        return None
    m, k = bt.shape
    src = step.inputs[0]
    if not host(plan, src) or not _rows(plan, src, m, k) or not _OutEdge.matches(plan, step, src, m, k):
        return None
    edge, i, slots = _OutEdge(plan, step), plan._slot(src), plan.slots
    label, threads = f"{step.op} edge of rows", threads_for(m * k)

    def call():
        x = slots[i]  # in its own memory order: a column-major one (the per-step kernels' for
        if x.shape != (m, k) or x.dtype != F32:  # an NPU output's rows) is the tiles' contiguous load
            x = np.asarray(x, F32)
            if x.shape != (m, k):
                raise_shape(label, "input", x)
        if edge.kind == kernels.OUT_HALF and x.flags.c_contiguous:
            def run(lo: int, hi: int) -> None:
                kernels.half_rows_into_atoms(x, edge.dst, lo, hi)
        else:
            args = (x, edge.kind, edge.dst, edge.signs, edge.block, edge.hnorm, edge.scale, edge.rotated)

            def run(lo: int, hi: int) -> None:
                kernels.out_edge_tiles(*args, lo, hi)
        over_ranges(run, live_tiles(state, m), threads)
        edge.finish(slots, threads)
    call.bos, call.label = [edge.bo], label
    return call


def _heads_chain(plan, steps: Sequence[Step], first: int, outputs: set, state) -> tuple[Callable, list[int]] | None:
    """A q or k in edge with what follows it per head: DequantizeRows or Cast
    of an NPU output (_InEdge), Reshape to [M, heads, hd], then RMSNorm (a constant
    [hd] weight) and/or RoPE at the chunk's positions, each reading only the
    one before, as two compiled calls: the lone in edge's (prefill_fused.in_edge_tiles,
    over tiles) into column-major rows, then prefill_channels.norm_rope in
    place (over heads), the per-step kernels' arithmetic and layout. Returns (the
    call, the indices of the steps it runs), or None."""
    step = steps[first]
    if step.op not in ("DequantizeRows", "Cast") or state is None:
        return None
    mk = _InEdge.matches(plan, step)
    if mk is None:
        return None
    m, k = mk
    readers: dict = {}
    for i, s in enumerate(steps):
        for n in s.inputs:
            if n:
                readers.setdefault(n, []).append(i)
    elsewhere = _read_elsewhere(plan, steps)

    def only_reader(name: str) -> int | None:
        """The one step of the stretch that reads `name` (as its first input), when nothing else does."""
        at = readers.get(name, [])
        if len(at) != 1 or name in elsewhere or name in outputs or steps[at[0]].inputs[0] != name:
            return None
        return at[0]

    chain, name = [first], step.outputs[0]
    i = only_reader(name)
    if i is None or steps[i].op != "Reshape" or len(steps[i].outputs) != 1:
        return None
    shape = plan.model.tensors.get(steps[i].outputs[0])
    if shape is None or shape.dtype != "fp32" or len(shape.shape) != 3 or list(shape.shape[:1]) != [m]:
        return None
    hd = int(shape.shape[2])
    if hd * int(shape.shape[1]) != k or not host(plan, steps[i].outputs[0]):
        return None
    chain.append(i)
    name, norm, rope = steps[i].outputs[0], None, None
    i = only_reader(name)
    if i is not None and steps[i].op == "RMSNorm" and len(steps[i].inputs) == 2 and len(steps[i].outputs) == 1:
        w = const(plan, steps[i].inputs[1], (hd,))
        if w is not None:
            norm, name = (w, F32(steps[i].attrs["epsilon"])), steps[i].outputs[0]
            chain.append(i)
            i = only_reader(name)
    if i is not None and steps[i].op == "RoPE" and len(steps[i].inputs) == 2 and len(steps[i].outputs) == 1:
        pos_info = plan.model.tensors.get(steps[i].inputs[1])
        dims = int(steps[i].attrs["dims"])
        if (pos_info is not None and list(pos_info.shape) == [m] and host(plan, steps[i].inputs[1])
                and 0 < dims <= hd and dims % 2 == 0):
            rope = (rope_tables(steps[i], [None, None], state), dims, steps[i].attrs["mode"] == "neox",
                    plan._slot(steps[i].inputs[1]))
            name = steps[i].outputs[0]
            chain.append(i)
    if norm is None and rope is None:
        return None
    out_info = plan.model.tensors.get(name)
    if out_info is None or list(out_info.shape) != [m, k // hd, hd] or out_info.dtype != "fp32" or not host(plan, name):
        return None
    edge, o, fresh, slots = _InEdge(plan, step), plan._slot(name), name in outputs, plan.slots
    w, eps = norm if norm is not None else (_NONE_VEC, F32(0.0))
    tables, dims, neox, pos_slot = rope if rope is not None else (None, 0, False, None)
    buf, load, apply = np.empty((k, m), F32), kernels.in_edge_tiles, channels.norm_rope
    heads, label, threads = k // hd, f"{step.op} edge of heads (compiled)", threads_for(m * k)

    def call():
        out_t = np.empty((k, m), F32) if fresh else buf
        if tables is not None:
            cos_t, sin_t = tables.at_transposed(np.asarray(slots[pos_slot]))
        else:
            cos_t = sin_t = _NONE_F32
        args = (edge.kind, edge.src, edge.extra, edge.row_scale(slots, label), edge.ch, edge.bias, edge.has_bias, out_t)
        tiles = live_tiles(state, m)
        over_ranges(lambda lo, hi: load(*args, lo, hi), tiles, threads)
        x, tokens = out_t.reshape(heads, hd, m), min(m, tiles * LANES)
        over_ranges(lambda lo, hi: apply(x, norm is not None, w, eps, tables is not None, cos_t, sin_t, dims, neox,
                                         lo, hi, tokens), heads, threads)
        slots[o] = x.transpose(2, 0, 1)  # [M, heads, hd], tokens innermost
    call.bos, call.label = edge.bos, label
    return call, chain


def edge_rows(plan, steps: Sequence[Step], bind, outputs: set, state=None) -> list[Callable[[], None]] | None:
    """A stretch no other fuser took whole (attention's, between the q/k/v
    product and the output projection): its many-row edges compiled
    (_heads_chain: q and k with their norms and rotary in one pass, given the
    generation state's RoPE tables; prefill_per_layer: Gemma 4's per-layer
    inputs; _in_edge_call, _out_edge_call: the fused
    stretches' float32 edges, threaded over tiles, straight from and into the
    BOs' atoms), every other step its own call as the plan makes it; None
    when it has no such edge."""
    edges: list = [None] * len(steps)
    taken: set = set()
    elsewhere = _read_elsewhere(plan, steps)
    for i in range(len(steps)):
        chain = (_heads_chain(plan, steps, i, outputs, state)
                 or per_layer_chain(plan, steps, i, outputs, state, elsewhere))
        if chain is not None:
            edges[i] = chain[0]
            taken.update(chain[1][1:])
    for i, s in enumerate(steps):
        if edges[i] is None and i not in taken:
            edges[i] = _in_edge_call(plan, s, outputs, state) or _out_edge_call(plan, s, state)
    return _with_edges(plan, steps, edges, bind, outputs, taken)


def _with_edges(plan, steps: Sequence[Step], edges: list, bind, outputs: set,
                taken: frozenset | set = frozenset()) -> list[Callable[[], None]] | None:
    """The stretch's calls: each step's compiled edge where `edges` has one
    (its BOs in .bos, its label set), none for the steps in `taken` (an edge
    runs them), else the step's own call as the plan makes it; None when no
    step has an edge."""
    if not any(edges):
        return None
    calls, bos = [], []
    for i, (step, edge) in enumerate(zip(steps, edges)):
        if i in taken:
            continue
        if edge is None:
            edge = plan._cpu_call(step, bind, outputs, bos)
            edge.label = step.op
        else:
            bos.extend(edge.bos)
            edge.ops = (step.op,)
        calls.append(edge)
    return plan._bracketed(bos, calls)


def fusers(state=None) -> list:
    """The many-row fusers of runtime/plan.py's hook (the edge fusers last:
    what the others leave); `state`, the generation state, shares its RoPE
    tables with the edges that apply them."""
    def edges(plan, steps: Sequence[Step], bind, outputs: set):
        return edge_rows(plan, steps, bind, outputs, state)
    from rkc.runtime.llm import fused_int4_rows as int4  # (it imports this module's matchers)

    def residual(plan, steps: Sequence[Step], bind, outputs: set):
        return residual_rows(plan, steps, bind, outputs, state)

    def ffn(plan, steps: Sequence[Step], bind, outputs: set):
        return ffn_rows(plan, steps, bind, outputs, state)

    def gate(plan, steps: Sequence[Step], bind, outputs: set):
        return gate_rows(plan, steps, bind, outputs, state)
    return [residual, ffn, gate, int4.int4_residual_rows, int4.int4_ffn_rows, int4.int4_edges, edges]
