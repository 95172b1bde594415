"""Relayout steps between native fp16 NPU buffers (issue 38): each result element's
place and its source's, made once at load into strided runs or element lists
(`prepare_relayout`), then moved on every run by runtime/kernels/gather_jit."""

from __future__ import annotations

import numpy as np

from rkc.ir.npu import geometry
from rkc.ir.program import Step, TensorInfo
from rkc.ir.types import DType
from rkc.runtime import native_maps


def _native_positions(info: TensorInfo) -> np.ndarray:
    """For each logical element of `info` (row-major), its element's place in the
    tensor's native bytes (2-byte elements)."""
    return geometry.native_positions(info.shape, info.layout, info.nbytes)


def _relayout_plan(run, step: Step) -> tuple:
    """Per result of the step, (result, its padding positions, [(source, blocks, runs, result
    positions, source positions)], scale), or () for the interpreter's path: per source its moves
    as blocks and runs or as element lists (`_moves`). The step's inputs are its sources, then one index map per
    result (the kernel's: runtime/kernels/shape.relayout)."""
    tensors = run.model.tensors
    scale = step.attrs.get("scale", 1.0)
    scales = scale if isinstance(scale, list) else [scale]
    if len(scales) != len(step.outputs) or len(step.inputs) <= len(scales):
        return ()
    names, index_names = step.inputs[:-len(scales)], step.inputs[-len(scales):]
    infos = [tensors.get(n) for n in (*names, *step.outputs)]
    if any(i is None or i.region not in run.model.bos or i.dtype != DType.FP16 or not i.layout.startswith("native")
           for i in infos):
        return ()
    sources, results = infos[:len(names)], infos[len(names):]
    sizes = [int(np.prod(i.shape, dtype=np.int64)) for i in sources]
    starts = np.cumsum([0, *sizes])
    plans = []
    for dst, index_name, factor in zip(results, index_names, scales):
        index = np.asarray(run.read(index_name), np.int64).reshape(-1)
        if index.size != int(np.prod(dst.shape, dtype=np.int64)) or index.min(initial=0) < 0 \
                or index.max(initial=-1) >= starts[-1]:
            return ()
        into = _native_positions(dst)
        moves = []
        for k, info in enumerate(sources):
            mine = (index >= starts[k]) & (index < starts[k + 1])
            if mine.any():  # in the result's order: the writes run through it once
                order = np.argsort(into[mine], kind="stable")
                moves.append((info, *_moves(into[mine][order], _native_positions(info)[index[mine] - starts[k]][order],
                                            float(factor) == 1.0)))
        padding = np.setdiff1d(np.arange(dst.nbytes // 2, dtype=np.int64), into, assume_unique=True)
        plans.append((dst, padding, moves, np.float32(factor)))
    return plans


RUN_ELEMENTS = 4  # a source's moves kept as runs when they average at least this many elements a run


def _moves(into: np.ndarray, frm: np.ndarray, unscaled: bool) -> tuple:
    """(blocks, runs, None, None) of gather_jit.strided_runs where the moves form long enough runs
    (YOLO11n's: 8 to 51,200 elements a run; each run's loop over contiguous or evenly strided
    memory, 4 integers a run against 2 an element), unscaled eight-lane transposes among them as
    gather_jit.eight_lane_blocks (else blocks None), else (None, None, into, frm) as int32
    element lists."""
    from rkc.runtime.kernels import gather_jit

    runs = gather_jit.strided_runs(into.astype(np.int64), frm.astype(np.int64))
    if len(runs) * RUN_ELEMENTS > len(into):
        return None, None, into.astype(np.int32), frm.astype(np.int32)
    if unscaled:
        blocks, rest = gather_jit.eight_lane_blocks(runs)
        if len(blocks):
            return blocks, rest, None, None
    return None, runs, None, None


def prepare_relayout(run, step: Step) -> tuple:
    """The Relayout step's moves (`_relayout_plan`), made once for the program (at load:
    runtime/execute.py's prepare_program; they depend only on the program and its constants)."""
    plans = run.schedule.native_plans
    plan = plans.get(id(step))
    if plan is None:
        plan = plans[id(step)] = _relayout_plan(run, step)
    return plan


def relayout(run, step: Step) -> bool:
    """A Relayout step between fp16 NPU buffers by its prepared moves; False where it has none.
    Worked out at its first run into a closure that runtime/execute.py calls from then on
    (the BOs to hold, each buffer's bytes, no padding store where there is none): the lookups
    and dispatch around YOLO11n's gathers (~4-8 us of moves each, hot) cost ~5-10 us a step."""
    plans = prepare_relayout(run, step)
    if not plans:
        return False
    bos = run.model.bos
    hold = native_maps.Hold(run.model.device, [bos[info.region] for dst, _, moves, _ in plans
                                               for info in (dst, *(move[0] for move in moves))])
    results = [((bos[dst.region], dst.offset, dst.offset + dst.nbytes), padding if padding.size else None, scale,
                [(bos[info.region], info.offset, info.offset + info.nbytes, blocks, runs, into, frm)
                 for info, blocks, runs, into, frm in moves])
               for dst, padding, moves, scale in plans]
    from rkc.runtime.kernels import gather_jit  # numba: loaded by programs that relay NPU buffers

    def moved(run) -> bool:
        with hold:  # (the views only while the BOs are held)
            for (bo, lo, hi), padding, scale, sources in results:
                out = bo.host[lo:hi].view(np.uint16)
                if padding is not None:
                    out[padding] = 0
                for bo, lo, hi, blocks, runs, into, frm in sources:
                    src = bo.host[lo:hi].view(np.uint16)
                    if blocks is not None:
                        gather_jit.move_blocks(src, blocks, out)
                    if runs is not None:
                        gather_jit.move_runs(src, runs, out, scale)
                    else:
                        gather_jit.move_elements(src, frm, out, into, scale)
        return True

    run.schedule.native_plans[native_maps.prepared_key(run, step)] = moved
    return moved(run)
