"""GEMM as a 1x1 convolution: tiling over M, N and K, cores, K accumulation.

C[M, N] = A[M, K] x B[K, N]: A is the feature C=K, H=gemm_rows(M), W=1; B the N
kernels of 1x1xK (packed once here); C the feature C=N, H=gemm_rows(M), W=1.

Tiling (docs/npu-emitters.md "GEMM tiling"):
* K above `k_tile_max` splits into near-equal tiles (multiples of 32 channels, a
  weight row); fp16 partials accumulate on the NPU through the DPU element-wise
  add (conv-main + ERDMA operand, fp32 partials, rocket-userspace's HW-validated
  K-accumulation) when a partial's surface clears the EW stride floor (M tile >= 12
  rows); int8 partials (whose on-chip int32 accumulation is unmeasured) and small-M
  fp16 partials are summed by a CpuStep.
* M tiles hold as many rows as fit the data banks (int8 keeps a slack bank) after
  one weight bank; rows are multiples of 4.
* N tiles are at most `n_tile_max` output channels and are cut further so that
  every core gets work; each core runs a contiguous range of N tiles as one job.
  Within a job tasks run N-major, M-minor: consecutive M tiles reuse the weights
  left in CBUF (WEIGHT_REUSE) when they fit the weight banks; with a single M
  tile consecutive N tiles reuse the feature (DATA_REUSE).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api, epilogue, formats, schedule
from rkc.compiler.npu.conv_core import ConvTile, cbuf_row_bytes, kernel_group, tile_task
from rkc.compiler.npu.schedule import Work, pad_constants
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import hw, layout

WEIGHT_ROW = layout.CHANNEL_GROUP  # K tiles start on a 32-channel weight row
KACC_MIN_ROWS = formats.EW_STRIDE_MIN  # the EW operand stride floor, in rows of a W=1 map


def _check(op: api.Gemm) -> str:
    a, c = op.a, op.c
    dtype = a.dtype
    if dtype not in ("int8", "fp16"):
        raise UnsupportedError(f"{op.name}: GEMM inputs are int8 or fp16, not {dtype}")
    if op.b.ndim != 2:
        raise UnsupportedError(f"{op.name}: B must be [K, N], got shape {op.b.shape}")
    k, n = op.b.shape
    rows = api.gemm_rows(op.m)
    if (a.channels, a.height, a.width) != (k, rows, 1):
        raise UnsupportedError(f"{op.name}: A must be Feature.gemm(rows={op.m}, cols={k}): got {a.shape}")
    if (c.channels, c.height, c.width) != (n, rows, 1):
        raise UnsupportedError(f"{op.name}: C must be Feature.gemm(rows={op.m}, cols={n}): got {c.shape}")
    want = np.int8 if dtype == "int8" else np.float16
    if op.b.dtype != want:
        raise UnsupportedError(f"{op.name}: B is {op.b.dtype}, expected {np.dtype(want)} for {dtype} A")
    if op.b_buffer is not None and dtype != "fp16":
        raise UnsupportedError(f"{op.name}: a run-time B operand is fp16 (int8 needs its column sums at compile time)")
    return dtype


def _tiling(op: api.Gemm, dtype: str, options: api.EmitOptions):
    """(N tiles, their lanes (None: by the default rule), K tiles, M tiles, weight
    banks, K partials accumulated on the NPU)."""
    n = op.b.shape[1]
    kg = kernel_group(dtype)
    if op.placement is not None:
        # the segment's placement (placement.py): each range at most n_tile_max per task
        _check_placement(op, kg, options)
        placed = [((r0 + p0, size), lane) for r0, rn, lane in sorted(op.placement)
                  for p0, size in schedule.split_evenly(rn, -(-rn // options.n_tile_max), kg)]
        n_tiles, lanes = [t for t, _ in placed], [lane for _, lane in placed]
    else:
        # N: at most n_tile_max per task, and cut so that every core gets a range
        n_parts = max(-(-n // options.n_tile_max), min(options.cores, -(-n // kg)))
        n_tiles, lanes = schedule.split_evenly(n, n_parts, kg), None
    nt_max = max(size for _, size in n_tiles)
    k_tiles, m_tiles, w_banks = _k_and_m_tiles(op, dtype, kg, api.gemm_rows(op.m), nt_max, options)
    on_chip = len(k_tiles) > 1 and dtype == "fp16" and min(s for _, s in m_tiles) >= KACC_MIN_ROWS
    return n_tiles, lanes, k_tiles, m_tiles, w_banks, on_chip


def _check_placement(op: api.Gemm, kg: int, options: api.EmitOptions) -> None:
    """A placement covers N once, in ranges starting on kernel groups, on real lanes."""
    pos = 0
    for start, size, lane in sorted(op.placement):
        if start != pos or size <= 0 or start % kg or not 0 <= lane < options.cores:
            break
        pos = start + size
    else:
        if pos == op.n:
            return
    raise UnsupportedError(f"{op.name}: internal: placement {list(op.placement)} does not cover N={op.n} "
                           f"in ranges of whole kernel groups on {options.cores} core(s)")


def single_tile_row(op: api.Gemm, options: api.EmitOptions) -> bool:
    """Whether the even split gives the GEMM one M tile and one K tile (its tasks
    differ only in their output channels: a segment placement may cut them anew)."""
    _, _, k_tiles, m_tiles, _, _ = _tiling(op, _check(op), options)
    return len(k_tiles) == 1 and len(m_tiles) == 1


def k_ranges(m: int, k: int, n: int, dtype: str, options: api.EmitOptions) -> list[tuple[int, int]]:
    """The K tiles (start, size) the emitter would cut a [m, k] x [k, n] GEMM
    into: a caller that runs one GEMM per range and adds their int32 / fp32
    outputs computes the product exactly, whether or not the NPU could have
    accumulated the partials itself. One range: no split."""
    probe = api.Gemm(api.Feature.gemm("A", 0, m, k, dtype), np.broadcast_to(api.NUMPY[dtype](0), (k, n)),
                     api.Feature.gemm("C", 0, m, n, "int32" if dtype == "int8" else "fp16"), m)
    return _tiling(probe, dtype, options)[2]


def lower_gemm(op: api.Gemm, options: api.EmitOptions) -> api.EmitResult:
    dtype = _check(op)
    k, n = op.b.shape
    item = api.ITEMSIZE[dtype]
    kg = kernel_group(dtype)
    rows = api.gemm_rows(op.m)
    notes = []
    n_tiles, placed_lanes, k_tiles, m_tiles, w_banks, on_chip_kacc = _tiling(op, dtype, options)
    kt_max = max(size for _, size in k_tiles)
    kt_bytes = layout.align(kt_max, op.a.c2) * item
    mt_max = max(size for _, size in m_tiles)
    nk = len(k_tiles)

    # the M tile's banks (+ the int8 slack bank), every other bank to the weights
    d_banks = schedule.data_banks(mt_max * cbuf_row_bytes(1, kt_bytes // layout.ATOM_BYTES),
                                  options.slack_banks(dtype))
    if d_banks > hw.CBUF_BANKS - w_banks:
        raise UnsupportedError(f"{op.name}: internal: M tile of {mt_max} rows overflows the data banks")
    w_banks = hw.CBUF_BANKS - d_banks
    key = (op.name, tuple(k_tiles), kg, op.b.shape, str(op.b.dtype))
    wq = op.b_quant
    zp_w = wq.zero_point if wq is not None else 0
    if op.b_buffer is not None:
        # B is written at run time in the layout of one K tile (layout.pack_weights of B^T)
        if nk > 1:
            raise UnsupportedError(f"{op.name}: a run-time B of K={k} would need {nk} K tiles; at most "
                                   f"{options.k_tile_max} channels")
        packed, k_offsets, weight_sums = b"", [0], np.zeros(n)
    elif options.pack_cache is not None and key in options.pack_cache:
        packed, k_offsets, weight_sums = options.pack_cache[key]
    else:
        packed, k_offsets = _pack_b(op, k_tiles, kg)
        # sum over K of (w - zp), without an int64 copy of B (1.9 GB for a 151936 x 1536 head)
        weight_sums = op.b.sum(axis=0, dtype=np.int64) - zp_w * k if dtype == "int8" else np.zeros(n)
        if options.pack_cache is not None:
            options.pack_cache[key] = packed, k_offsets, weight_sums
    consts = [api.ConstBuffer(op.weights_buffer, packed)] if op.b_buffer is None else []

    full = epilogue.plan(epilogue.DpuRequest(dtype, op.c, n, op.a.quant, wq, weight_sums, op.epilogue,
                                             integer_fp16_out=options.integer_fp16_out))
    partials: list[api.Feature] = []
    scratch: list[api.Scratch] = []
    if nk > 1 and not on_chip_kacc:
        if not options.allow_cpu_finish:
            raise UnsupportedError(f"{op.name}: K={k} needs {nk} partial sums the NPU cannot accumulate")
        partial_dtype = "int32" if dtype == "int8" else "fp32"
        partials = [api.Feature(f"{op.name}.partial{i}", 0, n, rows, 1, partial_dtype) for i in range(nk)]
        scratch += [api.Scratch(p.buffer, p.nbytes) for p in partials]
        notes.append(f"K split {nk} ways, partials summed on the CPU")
    elif on_chip_kacc:
        if op.epilogue.residual is not None or op.epilogue.lut is not None:
            raise UnsupportedError(f"{op.name}: a K-split fp16 GEMM uses the EW stage to accumulate; "
                                   f"it cannot also apply a residual or LUT")
        ping = [api.Feature(f"{op.name}.acc{i}", 0, n, rows, 1, "fp32") for i in range(min(2, nk - 1))]
        scratch += [api.Scratch(p.buffer, p.nbytes) for p in ping]
        notes.append(f"K split {nk} ways, accumulated on the NPU (fp32 partials)")
    if full.bs_data is not None and not partials:
        consts.append(api.ConstBuffer(f"{op.name}.bs", full.bs_bytes()))
    if full.lut is not None:
        notes.append(f"LUT {full.lut.name} fused")

    def dest(ki: int) -> api.Feature:
        if partials:
            return partials[ki]
        if ki == nk - 1:
            return op.c
        return ping[ki % 2]

    lanes_by_n = len(n_tiles) >= options.cores or len(n_tiles) >= len(m_tiles)
    works = []
    for ni, (n0, nt) in enumerate(n_tiles):
        for mi, (m0, mt) in enumerate(m_tiles):
            lane = placed_lanes[ni] if placed_lanes is not None else \
                schedule.lane_of(ni if lanes_by_n else mi, len(n_tiles) if lanes_by_n else len(m_tiles),
                                 options.cores)
            for ki, (k0, kt) in enumerate(k_tiles):
                works.append(_work(op, dtype, full, bool(partials), dest, nk, on_chip_kacc, (n0, nt, ni), (m0, mt, mi),
                                   (k0, kt, ki), k_offsets[ki], lane, d_banks, w_banks, weight_sums))
    tasks, jobs = schedule.schedule(works)
    consts = pad_constants(consts, tasks)
    cpu = []
    if partials:
        cpu.append(api.CpuStep("sum_partials", tuple(partials), op.c, op.epilogue, params={"plan": full},
                               after=tuple(range(len(jobs))),
                               reason=f"K={k} split into {nk} tiles; {'int32' if dtype == 'int8' else 'small-M fp16'}"
                                      f" partials are summed on the CPU"))
    notes.insert(0, f"GEMM M={op.m} K={k} N={n}: {len(m_tiles)} M x {len(n_tiles)} N x {nk} K tiles on "
                    f"{len(jobs)} core(s); CBUF {d_banks} data + {w_banks} weight banks")
    return api.EmitResult(op, tasks, jobs, consts, scratch, cpu, notes)


RESIDENT_MIN_ROWS = 64  # keep weights resident if that still leaves this many rows per M tile


def _k_and_m_tiles(op: api.Gemm, dtype: str, kg: int, rows: int, nt_max: int, options: api.EmitOptions):
    """(K tiles, M tiles, weight banks). K tiles are at most k_tile_max; the weight
    banks hold a whole N tile's weights (resident: consecutive M tiles on a core
    reuse them) when that leaves at least RESIDENT_MIN_ROWS rows (or all rows) for
    the feature, else one streamed kernel group; M tiles take the rows that fit the
    rest. For a K-split fp16 GEMM, smaller K tiles are tried when they let every M
    tile reach the 12 rows the on-chip accumulation needs."""
    k, item, slack = op.k, api.ITEMSIZE[dtype], options.slack_banks(dtype)
    choice = None
    limit = options.k_tile_max
    while True:
        k_tiles = schedule.split_evenly(k, -(-k // limit), WEIGHT_ROW)
        kt_bytes = layout.align(max(s for _, s in k_tiles), op.a.c2) * item
        row_bytes = cbuf_row_bytes(1, kt_bytes // layout.ATOM_BYTES)
        resident = schedule.banks_for(layout.align(nt_max, kg) * kt_bytes)
        streamed = schedule.banks_for(kg * kt_bytes)  # one kernel group at a time

        def cap(weight_banks: int) -> int:
            c = (hw.CBUF_BANKS - weight_banks - slack) * hw.CBUF_BANK_BYTES // row_bytes
            return max(0, min(c, 2044) // api.GEMM_ROW_ALIGN * api.GEMM_ROW_ALIGN)  # DATAIN_HEIGHT: 11 bits

        w_banks = resident if cap(resident) >= min(rows, RESIDENT_MIN_ROWS) else streamed
        rows_cap = cap(w_banks)
        if rows_cap >= api.GEMM_ROW_ALIGN:
            m_tiles = schedule.split_evenly(rows, -(-rows // rows_cap), api.GEMM_ROW_ALIGN)
            choice = choice or (k_tiles, m_tiles, w_banks)
            enough = len(k_tiles) == 1 or min(s for _, s in m_tiles) >= KACC_MIN_ROWS
            if dtype != "fp16" or enough:
                return k_tiles, m_tiles, w_banks
            if rows < KACC_MIN_ROWS:
                break
        if limit <= 1024:
            break
        limit //= 2
    if choice is None:
        raise UnsupportedError(f"{op.name}: no K tile of B[{k}, {op.n}] fits CBUF")
    return choice


_PACK_KERNELS = 16384  # kernels (output channels) packed at a time


def _pack_b(op: api.Gemm, k_tiles, kg: int) -> tuple[bytes, list[int]]:
    """B in the native 1x1 weight layout, one block per K tile; kernels padded to
    whole groups with zeros (the weight zero point for asymmetric int8)."""
    k, n = op.b.shape
    n_hw = layout.align(n, kg)
    pad_w = op.b_quant.zero_point if op.b_quant is not None else 0
    # whole kernel groups at a time: the layout is group-major, so the packed
    # chunks are consecutive bytes of the whole, and the packer's temporaries
    # stay a chunk's size (a 262144-kernel output head would need ~5 copies)
    step = max(kg, _PACK_KERNELS // kg * kg)
    parts, offsets, pos = [], [], 0
    for k0, kt in k_tiles:
        offsets.append(pos)
        for n0 in range(0, n_hw, step):
            n1 = min(n_hw, n0 + step)
            block = np.full((n1 - n0, kt), pad_w, op.b.dtype)  # padding kernels: (w - zp) = 0
            block[:max(0, min(n, n1) - n0)] = op.b[k0:k0 + kt, n0:min(n, n1)].T
            parts.append(layout.pack_weights(block[:, None, None, :], pad_value=pad_w).tobytes())
            pos += len(parts[-1])
    return b"".join(parts), offsets


def _work(op, dtype, full, cpu: bool, dest, nk, kacc, ntile, mtile, ktile, k_offset, lane, d_banks, w_banks,
          weight_sums) -> Work:
    (n0, nt, ni), (m0, mt, mi), (k0, kt, ki) = ntile, mtile, ktile
    kg = kernel_group(dtype)
    item = api.ITEMSIZE[dtype]
    last = ki == nk - 1
    out_full = dest(ki)
    a_tile = op.a.view(channel0=k0, channels=kt, row0=m0, rows=mt)
    o_tile = out_full.view(channel0=n0, channels=nt, row0=m0, rows=mt)
    kernels = layout.align(nt, kg)
    w_bytes = kernels * layout.align(kt, op.a.c2) * item
    wq = op.b_quant
    if cpu:
        plan = epilogue.plan(epilogue.DpuRequest(dtype, out_full, op.n, op.a.quant, wq, weight_sums,
                                                 op.epilogue, partial=True))
    elif nk > 1:
        # fp16 K-accumulation: partial k adds partial k-1 (EW, fp32 operand); the last
        # task also applies bias and activation and writes the requested dtype
        ep = op.epilogue if last else api.NO_EPILOGUE
        res = api.Residual(dest(ki - 1), "add") if ki > 0 else None
        plan = epilogue.plan(epilogue.DpuRequest(dtype, out_full, op.n, None, None, weight_sums,
                                                 replace(ep, residual=res)))
    else:
        plan = full
    residual = plan.residual.tensor.view(channel0=n0, channels=nt, row0=m0, rows=mt) if plan.residual else None
    cbuf = api.CbufPlan(d_banks, w_banks, data_bytes=mt * layout.align(kt, op.a.c2) * item, weight_bytes=w_bytes,
                        weights_resident=w_bytes <= w_banks * hw.CBUF_BANK_BYTES)
    tile = ConvTile(input=a_tile, output=o_tile, weights_buffer=op.weights_buffer,
                    weights_offset=k_offset + n0 * layout.align(kt, op.a.c2) * item, kernels=kernels,
                    out_channels_hw=kernels, kernel=(1, 1), stride=(1, 1), pad=(0, 0),
                    pad_value=(op.a.quant.zero_point if op.a.quant else 0), depthwise=False, dpu=plan, cbuf=cbuf,
                    channel0=n0, bs_buffer=f"{op.name}.bs", residual=residual,
                    residual_rows=plan.residual.tensor.height if plan.residual else 0,
                    label=f"{op.name} m{mi} n{ni} k{ki}")
    reads = [op.a.buffer, op.weights_buffer] + ([residual.buffer] if residual is not None else [])
    return Work(lane, ("A", mi, ki), ("B", ni, ki), cbuf, lambda cb, t=tile: tile_task(_with(t, cb)),
                tuple(reads), (out_full.buffer,))


def _with(tile: ConvTile, cbuf: api.CbufPlan) -> ConvTile:
    tile.cbuf = cbuf
    return tile
