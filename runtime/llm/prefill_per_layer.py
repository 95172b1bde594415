"""Gemma 4's per-layer input steps in a prefill chunk (docs/llm.md, Gemma 4),
each run as one compiled call threaded over the chunk:

* the per-layer inputs: the embedding's projection Scale, Reshape [T, L, P],
  RMSNorm per layer, Add of the per-layer token rows and Scale by 1/sqrt(2),
  matched in a many-row stretch (fused_rows.edge_rows; prefill_channels.
  per_layer_inputs). Step by step the Add alone read the projection across
  its NPU layout (tokens innermost) against the rows' C order: 5.5 of the
  ~8 ms the four steps cost an E2B 128-chunk;
* each layer's gate stretch: act(gate) * its Pick of the per-layer inputs,
  between the gate's NPU output and the projection's input, as the gated
  FFN stretch (prefill_fused.ffn_tiles) with a host up row read in place
  (`gate_tiles`): five calls, ~0.3 ms a layer, before.

Float32 arithmetic in its own order (issue 37), bounded against float64
in tests/llm/test_prefill_channels.py and tests/llm/test_prefill_gate.py;
figures in docs/notes/2026-12-06-gemma-int8-prompt-e2b-prefill.md (Stop 45)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from numba import njit

from rkc.ir.program import Step
from rkc.runtime.llm import prefill_channels as channels
from rkc.runtime.llm import prefill_fused as kernels
from rkc.runtime.llm.fused import raise_shape
from rkc.runtime.llm.prefill_kernels import _F32_JIT, LANES, live_rows
from rkc.runtime.llm.stretch_match import const, host
from rkc.runtime.llm.threads import over_ranges, threads_for

F32 = np.float32
LABEL = "per-layer inputs (Scale, RMSNorm, Add, Scale)"


def per_layer_chain(plan, steps: Sequence[Step], first: int, outputs: set, state,
                    elsewhere: set) -> tuple[Callable[[], None], list[int]] | None:
    """At steps[first], Scale of a host [T, L * P] row block, then Reshape to
    [T, L, P], RMSNorm by a constant [P] weight, Add of a host [T, L, P]
    tensor and Scale, each the only reader of the one before (and nothing
    outside the stretch, `elsewhere`, reading them), at least a tile's rows:
    (the call, the indices of the steps it runs), else None."""
    tensors = plan.model.tensors

    def fp32(name: str, shape: list) -> bool:
        info = tensors.get(name)
        return info is not None and info.dtype == "fp32" and list(info.shape) == shape and host(plan, name)

    def only_reader(name: str) -> int | None:
        at = [i for i, s in enumerate(steps) if name in s.inputs]
        if len(at) != 1 or name in elsewhere or name in outputs or len(steps[at[0]].outputs) != 1:
            return None
        return at[0]

    scale = steps[first]
    if scale.op != "Scale" or len(scale.inputs) != 1 or len(scale.outputs) != 1:
        return None
    src = tensors.get(scale.inputs[0])
    if src is None or len(src.shape) != 2 or not fp32(scale.inputs[0], list(src.shape)):
        return None
    m, lp = (int(d) for d in src.shape)
    if m < LANES:  # a tile's rows at least, as the int4 stretches (fewer: the per-step kernels' bits)
        return None
    reshape = only_reader(scale.outputs[0])
    if reshape is None or steps[reshape].op != "Reshape":
        return None
    shaped = tensors.get(steps[reshape].outputs[0])
    if shaped is None or len(shaped.shape) != 3 or int(shaped.shape[0]) != m:
        return None
    layers, p = int(shaped.shape[1]), int(shaped.shape[2])
    shape = [m, layers, p]
    if layers * p != lp or not fp32(steps[reshape].outputs[0], shape):
        return None
    norm = only_reader(steps[reshape].outputs[0])
    if norm is None or steps[norm].op != "RMSNorm" or len(steps[norm].inputs) != 2 \
            or steps[norm].inputs[0] != steps[reshape].outputs[0]:
        return None
    w = const(plan, steps[norm].inputs[1], (p,))
    if w is None or not fp32(steps[norm].outputs[0], shape):
        return None
    add = only_reader(steps[norm].outputs[0])
    if add is None or steps[add].op != "Add" or len(steps[add].inputs) != 2:
        return None
    rows = [n for n in steps[add].inputs if n != steps[norm].outputs[0]]
    if len(rows) != 1 or not fp32(rows[0], shape) or not fp32(steps[add].outputs[0], shape):
        return None
    mix = only_reader(steps[add].outputs[0])
    if mix is None or steps[mix].op != "Scale" or len(steps[mix].inputs) != 1:
        return None
    out_name = steps[mix].outputs[0]
    if not fp32(out_name, shape):
        return None
    slots, o_src, o_rows, o_out = plan.slots, plan._slot(scale.inputs[0]), plan._slot(rows[0]), plan._slot(out_name)
    a, eps, c = F32(scale.attrs["factor"]), F32(steps[norm].attrs["epsilon"]), F32(steps[mix].attrs["factor"])
    fresh, buf, run = out_name in outputs, np.empty(shape, F32), channels.per_layer_inputs

    def call():
        x, r = slots[o_src], slots[o_rows]
        if getattr(x, "shape", None) != (m, lp) or x.dtype != F32:
            raise_shape(LABEL, "projection", x)
        if getattr(r, "shape", None) != (m, layers, p) or r.dtype != F32:
            raise_shape(LABEL, "token rows", r)
        # [L, P, T] over x's memory whatever its layout (the NPU's: tokens innermost, contiguous)
        xv = np.lib.stride_tricks.as_strided(x, (layers, p, m), (p * x.strides[1], x.strides[1], x.strides[0]))
        r = np.ascontiguousarray(r)
        out = np.empty(shape, F32) if fresh else buf
        tokens = live_rows(state, m)
        over_ranges(lambda lo, hi: run(xv, a, w, eps, r, c, out, lo, hi, tokens), layers)
        slots[o_out] = out
    call.bos, call.label = [], LABEL
    return call, [first, reshape, norm, add, mix]


@njit(**_F32_JIT)
def gate_tiles(in_kind, gate_src, gate_extra, gate_rs, gate_ch, gate_bias, gate_has_bias, up, act, rows, k,
               out_kind, dst, signs, block, hnorm, scale, rotated, tile_lo, tile_hi):
    """ffn_tiles' stretch with its up row a host float32 [rows, K] (any
    strides: a Pick of the per-layer inputs read in place): act(gate) * up
    into the next segment's atoms (fp16, or int8 rotated and quantized with
    no factor), tiles of LANES rows tile_lo..tile_hi-1, whole rows at once
    (K is the per-layer width, 256 for E2B: 16 KB a buffer)."""
    tiles = (rows + LANES - 1) // LANES
    g = np.empty((k, LANES), np.float32)
    u = np.empty((k, LANES), np.float32)
    amax = np.empty(LANES, np.float32)
    signed = out_kind != kernels.OUT_HALF
    for tile in range(tile_lo, tile_hi):
        m0 = tile * LANES
        r = min(LANES, rows - m0)
        kernels._load_in(in_kind, gate_src, gate_extra, gate_rs, gate_ch, gate_bias, gate_has_bias, m0, r, k, g)
        for lane in range(r):
            src = up[m0 + lane]
            for i in range(k):
                u[i, lane] = src[i]
        kernels._act_mul(g, u, act, signs, signed)
        for i in range(k):  # lanes past the rows: zeros (never stored)
            for lane in range(r, LANES):
                g[i, lane] = np.float32(0.0)
        kernels._out_edge(g, g.view(np.uint32), m0, r, k, out_kind, dst, signs, signed, block, hnorm, scale,
                          rotated, amax)
    if tile_hi == tiles:
        kernels.zero_rows(dst, rows)


def gate_rows(plan, steps: Sequence[Step], bind, outputs: set, state=None) -> list[Callable[[], None]] | None:
    """A Gemma 4 layer's gate stretch of many rows, whole: the gate's in edge
    (DequantizeRows or Cast of its NPU output), act(gate), Pick of the
    per-layer inputs [T, L, P], their Mul, an out edge with no factor; no
    value but the out edge's read elsewhere; at least a tile's rows. Its
    calls (one, bracketed), else None."""
    from rkc.runtime.llm import fused_rows as rows_  # (it imports this module's per_layer_chain)

    if len(steps) != 5 or any(n in outputs for s in steps for n in s.outputs):
        return None
    by_op: dict = {}
    for s in steps:
        by_op.setdefault(s.op, []).append(s)
    picks, muls = by_op.get("Pick", []), by_op.get("Mul", [])
    acts = [s for s in steps if s.op in rows_._ACTIVATIONS]
    if len(picks) != 1 or len(muls) != 1 or len(acts) != 1 or steps[0].op not in ("DequantizeRows", "Cast"):
        return None
    edge_in, pick, mul, act, last = steps[0], picks[0], muls[0], acts[0], steps[-1]
    mk = rows_._InEdge.matches(plan, edge_in)
    if mk is None or mk[0] < LANES or act.inputs != [edge_in.outputs[0]] or len(pick.inputs) != 1:
        return None
    m, k = mk
    pl = plan.model.tensors.get(pick.inputs[0])
    if pl is None or pl.dtype != "fp32" or len(pl.shape) != 3 or list(pl.shape[::2]) != [m, k] \
            or not host(plan, pick.inputs[0]):
        return None
    index, layers = int(pick.attrs["index"]), int(pl.shape[1])
    if not 0 <= index < layers or sorted(mul.inputs) != sorted([act.outputs[0], pick.outputs[0]]):
        return None
    if not all(host(plan, s.outputs[0]) and rows_._rows(plan, s.outputs[0], m, k) for s in (act, pick, mul)):
        return None
    if not rows_._OutEdge.matches(plan, last, mul.outputs[0], m, k):
        return None
    if set(rows_._read_elsewhere(plan, steps)) & {s.outputs[0] for s in (edge_in, act, pick, mul)}:
        return None
    edge_g, edge_out = rows_._InEdge(plan, edge_in), rows_._OutEdge(plan, last)
    if edge_out.kind == kernels.OUT_ROTATED:  # a factor's product: the per-step path
        return None
    run, act_kind, slots, o_pl = gate_tiles, rows_._ACTIVATIONS[act.op], plan.slots, plan._slot(pick.inputs[0])
    label = f"per-layer gate stretch of rows ({edge_in.op}, {act.op}, Pick, {last.op})"
    threads = threads_for(m * k)  # E2B's 128 x 256: the pool's hand-off costs what a second core saves

    def call():
        pl_in = slots[o_pl]
        if getattr(pl_in, "shape", None) != (m, layers, k) or pl_in.dtype != F32:
            raise_shape(label, "per-layer inputs", pl_in)
        args = (edge_g.kind, edge_g.src, edge_g.extra, edge_g.row_scale(slots, label), edge_g.ch, edge_g.bias,
                edge_g.has_bias, pl_in[:, index], act_kind, m, k, edge_out.kind, edge_out.dst, edge_out.signs,
                edge_out.block, edge_out.hnorm, edge_out.scale, edge_out.rotated)
        over_ranges(lambda lo, hi: run(*args, lo, hi), rows_.live_tiles(state, m), threads)
        edge_out.finish(slots)
    call.label, call.ops = label, tuple(s.op for s in steps)
    return plan._bracketed([*edge_g.bos, edge_out.bo], [call])
