"""The one-row attention stretch of a decoder layer (runtime/llm/fused.py's
fusers): q, k and v read from their BOs (fused.py's in edges), their Reshape
views, the q/k norms (and Gemma 4's plain v norm), RoPE and the attention over
the layer's own KV cache, or q alone over an earlier layer's cache
(AttentionShared: Gemma 4's shared KV layers), the output written into the
next product's input BO (an out edge). The common forms run as one compiled
call (jit.attention_front, jit.query_front); the others step by step into
buffers made once. Same bits as the per-step kernels (tests/llm/test_plan.py,
tests/llm/test_gemma4.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkc.ir.program import Step
from rkc.runtime.llm import decode_attention, jit, prepared
from rkc.runtime.llm.fused import _bracket, _info, _InEdge, _OutEdge, in_edges_run, raise_shape
from rkc.runtime.llm.stretch_match import const, host, is_const

F32 = np.float32


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

    read_edges = in_edges_run(edges, label)

    def call():
        for c in side_calls:
            c()
        read_edges()
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
    k_shape, v_shape, front, both = (hkv, hd), (hkv, hdv), jit.attention_front, decode_attention.front_and_attend
    # Python floats for the compiled call (a numpy float32 argument costs more to dispatch)
    qeps_f, keps_f, veps_f = float(qeps), float(keps), float(veps)
    a_scale, a_window, a_acc, a_mx, a_total = attend.scale_value, attend.window, attend.acc, attend.mx, attend.total

    def run() -> bool:
        pos = slots[ip]
        if state.valid != 1 or pos.shape != (1,):
            return False
        cos, sin = tables.at(pos)
        cache = state.cache
        s, e = cache.half_row(layer, pos, k_shape, v_shape)
        k16, v16, kpos = cache.half_bits(layer)
        if attend.one_thread(e - s):  # the front and the attention as one compiled call
            scores, bits = work.buffers(heads * (e - s), e - s)
            both(q2, k2, v2, qw, qeps_f, kw, keps_f, vw, veps_f, norms, v_norm, qn, kn, vn, qx, kx, cos, sin, dims,
                 neox, qr, kr, kr_bits, v_bits, k16, v16, kpos, s, e, int(pos[0]), a_scale, a_window,
                 attend.blocks(e - s), scores, bits, a_acc, a_mx, a_total, attend.dst)
            out = attend.full
        else:
            front(q2, k2, v2, qw, qeps, kw, keps, vw, veps, norms, v_norm, qn, kn, vn, qx, kx, cos, sin, dims, neox,
                  qr, kr, kr_bits, v_bits, k16, v16, e - 1)
            out = attend(qr, k16[s:e], v16[s:e], kpos[s:e], int(pos[0]))
        for i, x in made:
            slots[i] = x
        slots[o] = out
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
