"""Direct and depthwise 2-D convolution on NC1HWC2 features (rkc's own mode).

Tiling (docs/npu-emitters.md "Convolution tiling"):
* output channels in tiles of at most `n_tile_max` (whole kernel groups; a
  depthwise tile is a multiple of the 64-byte weight channel group);
* output rows in tiles whose input rows (halo included) fit the data banks; the
  weights stay resident in the remaining banks when they fit (then consecutive
  row tiles on a core set WEIGHT_REUSE), else they stream through them;
* when that leaves fewer tiles than cores, rows are cut further so every core
  has work; each core runs a contiguous range of tiles as one job.
Padding: top/left go to CNA_PAD_CON0 of the first row / every tile; bottom and
right follow from the output size (the CNA pads with PAD_VALUE past the edge).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api, epilogue, formats, schedule
from rkc.compiler.npu.conv_core import ConvTile, cbuf_row_bytes, kernel_group, tile_task
from rkc.compiler.npu.schedule import Work, pad_constants
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import hw, layout

DW_GROUP_BYTES = layout.DEPTHWISE_GROUP_BYTES
# fp16 depthwise tasks run whole 32-channel groups: the only domain validated on
# hardware (rocket-userspace gen_conv2d_dw_fp16); other counts are padded to it
FP16_DW_CHANNELS = 32


def _pad_fp16_depthwise(op: api.Conv2D) -> api.Conv2D:
    """An fp16 depthwise convolution over channels padded to whole 32-channel groups:
    zero weights and bias for the padding channels, which the task reads past the
    tensor's last surface (don't-care values; channels never mix in a depthwise
    convolution) and writes past the output's (the buffers grow by `extents`).
    Only whole tensors can grow that way (dense, or in their own taller surfaces); a
    strided view is refused."""
    c = op.input.channels
    n = layout.align(c, FP16_DW_CHANNELS)
    if n == c or op.input.dtype != "fp16" or not op.depthwise:
        return op
    ep = op.epilogue
    views = [op.input, op.output] + ([ep.residual.tensor] if ep.residual is not None else [])
    if any(f.surface_stride is not None and not f.row_padded for f in views):
        raise UnsupportedError(f"{op.name}: fp16 depthwise needs channels in multiples of {FP16_DW_CHANNELS} "
                               f"(got {c}); a strided view cannot be padded")
    weights = np.zeros((*op.weights.shape[:2], n), op.weights.dtype)
    weights[..., :c] = op.weights
    bias = None
    if ep.bias is not None:
        bias = np.zeros(n, np.asarray(ep.bias).dtype)
        bias[:c] = ep.bias
    residual = None if ep.residual is None else replace(ep.residual, tensor=replace(ep.residual.tensor, channels=n))
    return replace(op, input=replace(op.input, channels=n), output=replace(op.output, channels=n), weights=weights,
                   epilogue=replace(ep, bias=bias, residual=residual))


def _check(op: api.Conv2D, min_rows: int) -> str:
    f, o = op.input, op.output
    dtype = f.dtype
    if dtype not in ("int8", "fp16"):
        raise UnsupportedError(f"{op.name}: convolution inputs are int8 or fp16, not {dtype}")
    want = np.int8 if dtype == "int8" else np.float16
    if op.weights.dtype != want:
        raise UnsupportedError(f"{op.name}: weights are {op.weights.dtype}, expected {np.dtype(want)}")
    if op.weights_buffer is not None and (dtype != "fp16" or not op.depthwise):
        raise UnsupportedError(f"{op.name}: run-time weights are fp16 depthwise only")
    if op.depthwise:
        if op.weights.ndim != 3 or op.weights.shape[2] != f.channels:
            raise UnsupportedError(f"{op.name}: depthwise weights must be [KH, KW, {f.channels}]")
        if o.channels != f.channels:
            raise UnsupportedError(f"{op.name}: depthwise keeps the channel count ({f.channels} -> {o.channels})")
    elif op.weights.ndim != 4 or op.weights.shape[3] != f.channels or op.weights.shape[0] != o.channels:
        raise UnsupportedError(f"{op.name}: weights must be [{o.channels}, KH, KW, {f.channels}], "
                               f"got {list(op.weights.shape)}")
    oh, ow = op.output_hw()
    if (o.height, o.width) != (oh, ow) or oh < 1 or ow < 1:
        raise UnsupportedError(f"{op.name}: output is {o.height}x{o.width}, the convolution gives {oh}x{ow}")
    if min(op.stride) < 1 or min(op.padding) < 0:
        raise UnsupportedError(f"{op.name}: bad stride {op.stride} or padding {op.padding}")
    formats.check(max(op.kernel), formats.KERNEL_SIZE_MAX, f"{op.name}: kernel size")
    (kh, kw), (pt, pb, pl, pr) = op.kernel, op.padding
    formats.check(max(op.padding), formats.PAD_MAX, f"{op.name}: padding")
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        raise UnsupportedError(f"{op.name}: padding {op.padding} reaches a whole kernel ({kh}x{kw}) past the "
                               f"map; the CNA pads less than a kernel (pad the tensor instead)")
    formats.check(max(op.stride), formats.STRIDE_MAX, f"{op.name}: stride")
    if f.height < min_rows:
        raise UnsupportedError(f"{op.name}: the input has {f.height} rows; the NPU needs at least "
                               f"{min_rows} (maps of fewer rows compute wrongly on hardware)")
    return dtype


def lower_conv(op: api.Conv2D, options: api.EmitOptions) -> api.EmitResult:
    works, consts, note = conv_works(op, options)
    tasks, jobs = schedule.schedule(works)
    consts = pad_constants(consts, tasks)
    note += f" on {len(jobs)} core(s)"
    return api.EmitResult(op, tasks, jobs, consts, notes=[note])


def conv_works(op: api.Conv2D, options: api.EmitOptions) -> tuple[list[Work], list[api.ConstBuffer], str]:
    """The convolution's tasks to be (one `Work` per tile, in lane order), its constants
    and a note on the tiling: what `lower_conv` schedules, or a caller interleaving the
    works of several convolutions over one input (compiler/npu/pool.py's max taps)."""
    min_rows = options.min_input_rows
    dtype = _check(op, min_rows)
    op = _pad_fp16_depthwise(op)
    f, o = op.input, op.output
    item = api.ITEMSIZE[dtype]
    kh, kw = op.kernel
    sy, sx = op.stride
    pt, pb, pl, pr = op.padding
    formats.check(pl, formats.PAD_MAX, f"{op.name}: left padding")
    formats.check(pt, formats.PAD_MAX, f"{op.name}: top padding")
    c_hw = layout.align(f.channels, f.c2)
    kg = kernel_group(dtype)
    dw = op.depthwise
    per_kernel = kh * kw * c_hw * item
    if not dw and per_kernel > hw.CBUF_BANK_BYTES:
        raise UnsupportedError(f"{op.name}: a {kh}x{kw}x{f.channels} kernel is {per_kernel} bytes, more than a "
                               f"CBUF bank; lower it as K-split GEMMs")

    wq = op.weight_quant
    zp_w = wq.zero_point if wq is not None else 0
    w64 = op.weights.astype(np.int64) - zp_w if dtype == "int8" else None
    if dw:
        weight_sums = w64.sum(axis=(0, 1)) if w64 is not None else np.zeros(f.channels)
    else:
        weight_sums = w64.sum(axis=(1, 2, 3)) if w64 is not None else np.zeros(o.channels)
    plan = epilogue.plan(epilogue.DpuRequest(dtype, o, o.channels, f.quant, wq, weight_sums, op.epilogue,
                                             depthwise=dw, integer_lut=options.integer_lut))
    packed = _pack(op, dtype, kg, zp_w)
    consts = [api.ConstBuffer(op.weights_source, packed)] if op.weights_buffer is None else []
    if plan.bs_data is not None:
        consts.append(api.ConstBuffer(f"{op.name}.bs", plan.bs_bytes()))

    # channel tiles: at most n_tile_max, and one range per core when the weights
    # outweigh the input (each core then streams only its share of the weights and
    # re-reads the smaller input, instead of every core streaming all weights)
    group = DW_GROUP_BYTES // item if dw else kg
    parts = -(-o.channels // options.n_tile_max)
    weight_total = len(packed)
    input_total = f.surfaces * f.dense_surface_bytes
    if weight_total > input_total and not _row_bands_pay(op, dtype, weight_total, options):
        parts = max(parts, min(options.cores, -(-o.channels // group)))
    if dw and dtype in api.CHAINED_DTYPES and not _row_bands_fit(op, options):
        # a map too short for a row band per core: split the channels, which a channel
        # split of the layer before hands on core by core in one chained kick
        parts = max(parts, min(options.cores, -(-o.channels // group)))
    if dw:
        # a depthwise task's kernel spans its channels: keep it within one CBUF bank
        groups_per_bank = hw.CBUF_BANK_BYTES // (kh * kw * group * item)
        if groups_per_bank < 1:
            raise UnsupportedError(f"{op.name}: a {kh}x{kw} depthwise kernel of {group} channels is more than "
                                   f"a CBUF bank")
        parts = max(parts, -(-o.channels // (groups_per_bank * group)))
    c_tiles = schedule.split_evenly(o.channels, parts, group)
    tile_weight_bytes = max(_tile_weight_bytes(op, dtype, kg, ct) for _, ct in c_tiles)
    slack = options.slack_banks(dtype)

    def row_bytes(c_count: int) -> int:
        return cbuf_row_bytes(f.width, -(-c_count // f.c2))

    max_c = max(ct for _, ct in c_tiles) if dw else f.channels
    rb = row_bytes(max_c)
    full_in = f.height * rb
    w_banks_needed = schedule.banks_for(tile_weight_bytes)
    resident_data_banks = hw.CBUF_BANKS - w_banks_needed
    if schedule.banks_for(full_in) + slack <= resident_data_banks:
        d_banks = schedule.banks_for(full_in) + slack
    elif resident_data_banks - slack >= 1 and (resident_data_banks - slack) * hw.CBUF_BANK_BYTES >= \
            (kh + sy) * rb:
        d_banks = resident_data_banks  # weights resident, rows split
    else:
        # weights stream through the weight banks one kernel group at a time
        streamed_kernels = 1 if dw else kg
        d_banks = hw.CBUF_BANKS - schedule.banks_for(streamed_kernels * per_kernel)
    w_banks = hw.CBUF_BANKS - d_banks
    data_cap = (d_banks - slack) * hw.CBUF_BANK_BYTES
    max_in_rows = min(data_cap // rb, formats.CNA_SIZE_MAX)
    if max_in_rows < min(kh, f.height):  # a whole map shorter than the kernel: the rest is padding
        raise UnsupportedError(f"{op.name}: {kh} input rows of {rb} bytes do not fit CBUF")
    # a tile reads at most the whole map: rows past its edges are the CNA's padding, not
    # data (a global average's dummy GEMM rows, a padded conv of a map that fits)
    rows_per_tile = o.height if f.height <= max_in_rows else min(o.height, (max_in_rows - kh) // sy + 1)
    n_row_tiles = -(-o.height // rows_per_tile)
    if n_row_tiles * len(c_tiles) < options.cores and o.height >= 2 * options.cores:
        n_row_tiles = options.cores
    elif dtype in api.CHAINED_DTYPES and len(c_tiles) == 1 and n_row_tiles > options.cores:
        # chained: as many row tiles on every core (one kick a core whatever their number)
        n_row_tiles = layout.align(n_row_tiles, options.cores)
    r_tiles = schedule.split_evenly(o.height, n_row_tiles, 1)
    while len(r_tiles) > 1 and min(_input_rows(op, r0, rt, min_rows)[2] for r0, rt in r_tiles) < min_rows:
        r_tiles = schedule.split_evenly(o.height, len(r_tiles) - 1, 1)
    if max(_input_rows(op, r0, rt, min_rows)[2] for r0, rt in r_tiles) > max_in_rows:
        raise UnsupportedError(f"{op.name}: no row split keeps {min_rows}+ input rows per task in CBUF")

    works = []
    total = len(c_tiles) * len(r_tiles)
    idx = 0
    by_channels = len(c_tiles) >= options.cores or len(r_tiles) == 1
    for ci, (c0, ct) in enumerate(c_tiles):
        for ri, (r0, rt) in enumerate(r_tiles):
            lane = schedule.lane_of(ci if by_channels else idx, len(c_tiles) if by_channels else total,
                                    options.cores)
            idx += 1
            works.append(_work(op, dtype, plan, (c0, ct, ci), (r0, rt, ri), lane, d_banks, w_banks, kg,
                               min_rows))
    note = (f"conv {kh}x{kw}/{sy}x{sx} {f.shape}->{o.shape} {dtype}: {len(r_tiles)} row x {len(c_tiles)} "
            f"channel tiles; CBUF {d_banks} data + {w_banks} weight banks, weights "
            f"{'resident' if tile_weight_bytes <= w_banks * hw.CBUF_BANK_BYTES else 'streamed'}")
    return works, consts, note


def _row_bands_pay(op: api.Conv2D, dtype: str, weight_total: int, options: api.EmitOptions) -> bool:
    """Whether the output rows, one band per core, beat a channel split when the weights
    outweigh the input: in a chained segment the next layer reading the same rows
    then joins each core's kick (compiler/npu/assemble.py), which pays while the weights
    each core reads in full take less of its DMA time than the kick saved."""
    if dtype not in api.CHAINED_DTYPES or not _row_bands_fit(op, options):
        return False
    extra = weight_total * (options.cores - 1) / options.cores  # read again by each core
    return extra / (hw.DRAM_BYTES_PER_S_SUSTAINED * hw.CORE_DMA_SHARE) < hw.KICK_OVERHEAD_S


def _row_bands_fit(op: api.Conv2D, options: api.EmitOptions) -> bool:
    """Whether the output rows split into one band per core, each reading its
    `min_input_rows` (Q2)."""
    if options.cores < 2 or op.output.height < options.cores:
        return False
    bands = schedule.split_evenly(op.output.height, options.cores, 1)
    return len(bands) == options.cores and \
        min(_input_rows(op, r0, rt, options.min_input_rows)[2] for r0, rt in bands) >= options.min_input_rows


def _tile_weight_bytes(op, dtype, kg, ct) -> int:
    kh, kw = op.kernel
    item = api.ITEMSIZE[dtype]
    if op.depthwise:
        return kh * kw * layout.align(ct, op.input.c2) * item
    return layout.align(ct, kg) * kh * kw * layout.align(op.input.channels, op.input.c2) * item


def _pack(op: api.Conv2D, dtype: str, kg: int, zp_w: int) -> bytes:
    if op.depthwise:
        return layout.pack_depthwise_weights(op.weights, pad_value=zp_w).tobytes()
    o, kh, kw, c = op.weights.shape
    grid = np.full((layout.align(o, kg), kh, kw, c), zp_w, op.weights.dtype)
    grid[:o] = op.weights
    return layout.pack_weights(grid, pad_value=zp_w).tobytes()


def _work(op: api.Conv2D, dtype, plan, ctile, rtile, lane, d_banks, w_banks, kg, min_rows: int) -> Work:
    (c0, ct, ci), (r0, rt, ri) = ctile, rtile
    f, o = op.input, op.output
    kh, kw = op.kernel
    sy, sx = op.stride
    pt, pb, pl, pr = op.padding
    item = api.ITEMSIZE[dtype]
    pad_top, a, rows = _input_rows(op, r0, rt, min_rows)
    if rows < min_rows:
        raise UnsupportedError(f"{op.name}: output rows {r0}..{r0 + rt - 1} read {rows} input rows, fewer than "
                               f"{min_rows}")
    b = a + rows - 1
    dw = op.depthwise
    in_view = f.view(channel0=c0 if dw else 0, channels=ct if dw else f.channels, row0=a, rows=b - a + 1)
    out_view = o.view(channel0=c0, channels=ct, row0=r0, rows=rt)
    c_hw = layout.align(f.channels, f.c2)
    if dw:
        kernels = 1
        group = DW_GROUP_BYTES // item
        w_offset = c0 // group * kh * kw * group * item
        out_hw = _dw_channels(dtype, ct)
        w_bytes = kh * kw * layout.align(ct, f.c2) * item
    else:
        kernels = layout.align(ct, kg)
        w_offset = c0 * kh * kw * c_hw * item
        out_hw = kernels
        w_bytes = kernels * kh * kw * c_hw * item
    residual = None
    if plan.residual is not None:
        residual = plan.residual.tensor.view(channel0=c0, channels=ct, row0=r0, rows=rt)
    cbuf = api.CbufPlan(d_banks, w_banks, data_bytes=in_view.surfaces * in_view.dense_surface_bytes,
                        weight_bytes=w_bytes, weights_resident=w_bytes <= w_banks * hw.CBUF_BANK_BYTES)
    if op.pad_value is not None:
        pad_value = int(op.pad_value) if dtype == "int8" else epilogue.f16_bits(op.pad_value)
    else:
        pad_value = f.quant.zero_point if (f.quant is not None and dtype == "int8") else 0
    tile = ConvTile(input=in_view, output=out_view, weights_buffer=op.weights_source, weights_offset=w_offset,
                    kernels=kernels, out_channels_hw=out_hw, kernel=(kh, kw), stride=(sy, sx), pad=(pad_top, pl),
                    pad_value=pad_value, depthwise=dw, dpu=plan, cbuf=cbuf, channel0=c0,
                    bs_buffer=f"{op.name}.bs", residual=residual,
                    residual_rows=plan.residual.tensor.height if plan.residual is not None else 0,
                    label=f"{op.name} rows{r0}+{rt} ch{c0}+{ct}", min_input_rows=min_rows)
    reads = [f.buffer, op.weights_source] + ([residual.buffer] if residual is not None else [])
    data_key = ("in", ri, ci if dw else 0)
    return Work(lane, data_key, ("w", ci), cbuf, lambda cb, t=tile: tile_task(_with(t, cb)), tuple(reads),
                (o.buffer,))


def _input_rows(op: api.Conv2D, r0: int, rt: int, min_rows: int) -> tuple[int, int, int]:
    """(pad_top, first input row, input rows) of output rows [r0, r0+rt): the rows the
    windows touch, extended downwards to at least `min_rows` where the map allows
    (the extra rows are read, not used)."""
    kh, sy, pt = op.kernel[0], op.stride[0], op.padding[0]
    first = r0 * sy - pt
    last = min(op.input.height - 1, (r0 + rt - 1) * sy - pt + kh - 1)
    a = max(0, first)
    last = max(last, min(op.input.height - 1, a + min_rows - 1))
    return max(0, -first), a, last - a + 1


def _dw_channels(dtype: str, c: int) -> int:
    """CORE/DPU channel count of a depthwise task: Mesa's rule for int8 (align 32,
    doubled up to 32 channels, align 64: rkt_task.c), the channel count itself for
    fp16 (rocket-userspace gen_conv2d_dw_fp16, channels a multiple of 32)."""
    if dtype == "fp16":
        return c
    n = layout.align(max(c, 32), 32)
    if c <= 32:
        n *= 2
    return layout.align(n, 64)


def _with(tile: ConvTile, cbuf: api.CbufPlan) -> ConvTile:
    tile.cbuf = cbuf
    return tile
