"""Element-wise add / mul / max / min of two tensors, then ReLU / ReLU-X.

The DPU's EW stage combines its main data with an operand read by the ERDMA.
Without a convolution feeding the DPU (a "flying" task) that operand read wrote
zeros on hardware (rockchip-npu-notes dpu-lut-activation.md "Two-operand EW";
the simulator rejects it, its Q13), so rkc feeds the main data through an
identity 1x1 convolution, as rocket-userspace's shipping element-wise ops do.

The three tensors are dense and of one shape, so any common reinterpretation of
their bytes pairs the same elements: the flat atom sequence is cut into chunks,
each seen as a feature of one kernel group of channels (32 int8 / 16 fp16: two
atoms per position) and 4 x w positions; the identity convolution costs one
kernel group of MACs per element, far below the DMA time.
"""

from __future__ import annotations

import math

import numpy as np

from rkc.compiler.npu import api, epilogue, formats, schedule
from rkc.compiler.npu.conv_core import ConvTile, cbuf_row_bytes, kernel_group, tile_task
from rkc.compiler.npu.schedule import Work, pad_constants
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import hw, layout

# int8: the identity weight is 64, not 1, so the accumulator counts 1/64 steps of
# `a` and the EW stage brings `b` to that unit, not to a's whole steps: rounding
# b there would add up to half a step before the output's own rounding (a second
# rounding that put a fifth of the sums one step off).
INT8_GAIN = 64
# what the EW stage applies after the combination (ReLU / ReLU-X); a lookup table
# shares that stage with the operand, and LeakyReLU's BN stage comes before it
EW_ACTIVATIONS = ("relu", "relu6", "clip")
CHUNK_ROWS = 4  # rows of every chunk (the minimum a task may read)
CHUNK_WIDTH_MAX = 1024  # positions per row (13-bit DPU cube width, 11-bit CNA width)


def _check(op: api.Elementwise) -> str:
    a, b, o = op.a, op.b, op.out
    if op.op not in api.ELEMENTWISE_OPS:
        raise UnsupportedError(f"{op.name}: element-wise {op.op!r} is not one of {', '.join(api.ELEMENTWISE_OPS)}")
    if not (a.shape == b.shape == o.shape):
        raise UnsupportedError(f"{op.name}: operands {a.shape}, {b.shape} and output {o.shape} differ")
    if not (a.dtype == b.dtype == o.dtype) or a.dtype not in ("int8", "fp16"):
        raise UnsupportedError(f"{op.name}: element-wise ops take int8 or fp16 tensors of one dtype")
    for f in (a, b, o):
        if f.line_bytes != f.width * layout.ATOM_BYTES or f.surface_bytes != a.surface_bytes:
            raise UnsupportedError(f"{op.name}: {f.buffer} is not dense (nor in surfaces of its operands' pitch)")
    if op.activation not in (None, *EW_ACTIVATIONS):
        raise UnsupportedError(f"{op.name}: after an element-wise op the EW stage applies "
                               f"{', '.join(EW_ACTIVATIONS)} only, not {op.activation!r}")
    if a.dtype == "int8" and (a.quant is None or b.quant is None or o.quant is None):
        raise UnsupportedError(f"{op.name}: int8 element-wise ops need the quantization of all three tensors")
    return a.dtype


def flat_chunks(atoms: int, overlap_ok: bool = True) -> list[tuple[int, int, int]]:
    """(first atom, rows, width) of each chunk: two atoms per position; full chunks
    of CHUNK_ROWS x CHUNK_WIDTH_MAX positions, the rest as one or two smaller ones.
    Every chunk has at least 4 rows and 12 positions (the EW operand stride floor).
    An odd atom count gets a last chunk overlapping the one before (computing a few
    elements twice is harmless unless the op works in place: `overlap_ok`)."""
    if atoms % 2:
        if not overlap_ok or atoms < 2 * formats.EW_STRIDE_MIN + 1:
            raise UnsupportedError(f"an in-place or tiny element-wise op over {atoms} atoms (odd) cannot pair "
                                   f"them into positions")
        last = 2 * formats.EW_STRIDE_MIN
        return flat_chunks(atoms - 1) + [(atoms - last, formats.EW_STRIDE_MIN, 1)]
    positions = atoms // 2
    full = CHUNK_ROWS * CHUNK_WIDTH_MAX
    if positions < formats.EW_STRIDE_MIN:
        raise UnsupportedError(f"a tensor of {atoms} atoms is too small for the NPU's element-wise path")
    sizes = [full] * (positions // full)
    rest = positions % full
    if rest and rest < formats.EW_STRIDE_MIN and sizes:
        rest += sizes.pop()
    tail = []
    if rest:
        # a 4-row block plus a single column of the remainder (12..15 rows)
        column = rest % CHUNK_ROWS + (formats.EW_STRIDE_MIN if rest % CHUNK_ROWS or rest > 2000 else 0)
        block = rest - column
        if block:
            tail.append((CHUNK_ROWS, block // CHUNK_ROWS))
        if column:
            tail.append((column, 1))
    out, pos = [], 0
    for rows, width in [(CHUNK_ROWS, CHUNK_WIDTH_MAX)] * len(sizes) + tail:
        out.append((2 * pos, rows, width))
        pos += rows * width
    return out


def lower_eltwise(op: api.Elementwise, options: api.EmitOptions) -> api.EmitResult:
    dtype = _check(op)
    a, b, o = op.a, op.b, op.out
    kg = kernel_group(dtype)
    npdt = api.NUMPY[dtype]
    in_place = any(o.buffer == f.buffer and o.offset == f.offset for f in (a, b))
    if a.surface_bytes == a.dense_surface_bytes:
        chunks = flat_chunks(a.surfaces * a.height * a.width, overlap_ok=not in_place)
    else:  # maps in taller surfaces (few rows over zero rows): each surface's positions, not its zero rows
        pitch = a.surface_bytes // layout.ATOM_BYTES
        chunks = [(s * pitch + a0, h, w) for s in range(a.surfaces)
                  for a0, h, w in flat_chunks(a.height * a.width, overlap_ok=not in_place)]
    if op.scale != 1.0 and (dtype != "fp16" or not 2.0 ** -14 <= op.scale <= 2.0 ** 15
                            or math.frexp(op.scale)[0] != 0.5):
        raise UnsupportedError(f"{op.name}: a scale is an fp16 op's normal power of two, not {op.scale}")
    gain = INT8_GAIN if dtype == "int8" else op.scale
    identity = layout.pack_weights((np.eye(kg) * gain).astype(npdt)[:, None, None, :]).tobytes()
    consts = [api.ConstBuffer(f"{op.name}.identity", identity)]

    def chunk(f: api.Feature, a0: int, rows: int, width: int) -> api.Feature:
        return api.Feature(f.buffer, f.offset + a0 * layout.ATOM_BYTES, kg, rows, width, dtype, f.quant)

    sample = chunk(o, *chunks[0])
    wq = api.Quant(1.0 / gain) if dtype == "int8" else None
    plan = epilogue.plan(epilogue.DpuRequest(
        dtype, sample, kg, a.quant, wq, np.full(kg, gain, np.int64),
        api.Epilogue(residual=api.Residual(chunk(b, *chunks[0]), op.op), activation=op.activation, clip=op.clip)))
    if plan.bs_data is not None:
        consts.append(api.ConstBuffer(f"{op.name}.bs", plan.bs_bytes()))
    biggest = max(h * cbuf_row_bytes(w, 2) for _, h, w in chunks)
    d_banks = schedule.data_banks(biggest, options.slack_banks(dtype))
    w_banks = hw.CBUF_BANKS - d_banks
    works = []
    for i, (a0, h, w) in enumerate(chunks):
        x, y, r = chunk(a, a0, h, w), chunk(o, a0, h, w), chunk(b, a0, h, w)
        cbuf = api.CbufPlan(d_banks, w_banks, data_bytes=h * w * 2 * layout.ATOM_BYTES,
                            weight_bytes=len(identity), weights_resident=True)
        tile = ConvTile(input=x, output=y, weights_buffer=f"{op.name}.identity", weights_offset=0, kernels=kg,
                        out_channels_hw=kg, kernel=(1, 1), stride=(1, 1), pad=(0, 0), pad_value=0,
                        depthwise=False, dpu=plan, cbuf=cbuf, bs_buffer=f"{op.name}.bs", residual=r,
                        residual_rows=h, label=f"{op.name} chunk {i}")
        lane = schedule.lane_of(i, len(chunks), options.cores)
        works.append(Work(lane, ("x", i), ("identity",), cbuf, lambda cb, t=tile: _task(t, cb),
                          (a.buffer, b.buffer, f"{op.name}.identity"), (o.buffer,)))
    tasks, jobs = schedule.schedule(works)  # counters keep the identity convolution's MACs: the array runs them
    then = f" then {op.activation}" if op.activation else ""
    notes = [f"{op.op}{then} {a.shape} {dtype}: {len(chunks)} chunk(s) on {len(jobs)} core(s) through an identity "
             f"1x1 convolution (EW operand via ERDMA)"]
    return api.EmitResult(op, tasks, jobs, pad_constants(consts, tasks), notes=notes)


def _task(tile: ConvTile, cbuf: api.CbufPlan) -> api.Task:
    tile.cbuf = cbuf
    return tile_task(tile)
