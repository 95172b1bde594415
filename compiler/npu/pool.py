"""Max / average pooling on the PPU (the NVDLA PDP analogue), fp16.

rocket-userspace's HW-validated gen_pool_fp16 program (src/npu_regcmd.c
@ e0677862; rockchip-npu-notes encodings/ppu-pooling.md): PPU_RDMA reads the
NC1HWC2 input, the PPU reduces each window per channel and writes the output;
geometry fields hold value - 1, pads are counts, strides are bytes; an average
multiplies the window sum by fp16(65536 / k) per axis (so it divides by kh * kw,
padding included); a padded max fills with fp16 -inf. Windows and strides are
at most 16, pads at most 7 (4- and 3-bit fields). A global pooling larger than
16 x 16 runs as successive poolings whose windows tile the map exactly.

Stock rocket completes a task only on the DPU interrupt (rocket_job.c), which a
PPU-only task never raises; unless `EmitOptions.ppu_completes` says the kernel
handles it, average pooling is lowered as a depthwise convolution with every
weight 1 (the DPU divides: fp16 multiplies by 1/(kh*kw), int8 requantizes by
in_scale/(kh*kw*out_scale)), and max pooling is one-hot depthwise convolutions
keeping the DPU's element-wise max (`_max_as_taps`; int8 pools always: the PPU
pools fp16 only, Q14). A global average whose window one convolution cannot take
(over 31 positions a side, or a kernel over a CBUF bank) is two: means of a x b
windows at stride (a, b), then their mean. An average whose divisor varies by
position (ONNX count_include_pad 0 with padding, ceil-mode overhang) is the window
sum times a constant map of 1 / count, the depthwise convolution's element-wise
operand (`_avg_rescaled`), on every kernel.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api, formats, schedule
from rkc.compiler.npu.regfile import PPU_BLOCKS, PPU_ORDER, S_POINTER_FIELDS, RegisterFile, build
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout

WINDOW_MAX = 16  # 4-bit (value - 1) kernel and stride fields
PAD_MAX = 7  # 3-bit pad counts
METHOD = {"avg": 0, "max": 1}  # PPU_OPERATION_MODE_CFG.POOLING_METHOD
NEG_INF_FP16 = 0xFC00
PPU_BURST_LEN = 3
# what a max pool's taps pad with: the smallest int8 code, the smallest finite fp16
# (-inf would make the one-hot kernel's zero weights produce NaN)
TAP_PAD = {"int8": -128, "fp16": -65504.0}


def _factors(n: int) -> list[int]:
    """n as a product of factors <= WINDOW_MAX (largest first), or raise."""
    out = []
    while n > WINDOW_MAX:
        f = next((d for d in range(WINDOW_MAX, 1, -1) if n % d == 0), None)
        if f is None:
            raise UnsupportedError(f"global pooling over {n} rows/columns: no exact split into windows of "
                                   f"at most {WINDOW_MAX}")
        out.append(f)
        n //= f
    return out + [n]


def recip_fp16(k: int) -> int:
    if k < 2:
        return 0  # 65536 overflows fp16; a 1-wide window needs no division on this axis
    return int(np.array(65536.0 / k, np.float16).view(np.uint16))


def _stages(op: api.Pool) -> list[tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]]:
    f = op.input
    if op.kernel is None:
        hs, ws = _factors(f.height), _factors(f.width)
        n = max(len(hs), len(ws))
        hs += [1] * (n - len(hs))
        ws += [1] * (n - len(ws))
        return [((kh, kw), (kh, kw), (0, 0, 0, 0)) for kh, kw in zip(hs, ws)]
    return [(op.kernel, op.stride, op.padding)]


def window_counts(size: int, kernel: int, stride: int, begin: int, end: int, out: int,
                  count_padding: bool) -> np.ndarray:
    """Along one axis: how many of each output's `kernel` window positions an
    average divides by: those inside the map, or inside the padded map when
    padding counts; never a ceil-mode overhang past the end padding."""
    start = np.arange(out) * stride - begin
    lo, hi = (-begin, size + end) if count_padding else (0, size)
    return np.minimum(start + kernel, hi) - np.maximum(start, lo)


def divisors(op: api.Pool) -> np.ndarray | None:
    """Per output position [H, W], the count an average pool divides by, or None
    where it is the whole window everywhere (the plain average's divisor)."""
    if op.method != "avg" or op.kernel is None:
        return None
    f, o = op.input, op.output
    (kh, kw), (sy, sx), (pt, pb, pl, pr) = op.kernel, op.stride, op.padding
    counts = np.outer(window_counts(f.height, kh, sy, pt, pb, o.height, op.count_padding),
                      window_counts(f.width, kw, sx, pl, pr, o.width, op.count_padding))
    if counts.min() < 1:
        raise UnsupportedError(f"{op.name}: a window holds no position of the map")
    return None if (counts == kh * kw).all() else counts


def lower_pool(op: api.Pool, options: api.EmitOptions) -> api.EmitResult:
    f, o = op.input, op.output
    if op.method not in METHOD:
        raise UnsupportedError(f"{op.name}: pooling method {op.method!r} (max or avg)")
    counts = divisors(op)
    if counts is not None:
        return _avg_rescaled(op, counts, options)
    if not options.ppu_completes and op.method == "avg":
        return _avg_as_depthwise(op, options)
    if op.method == "max" and (not options.ppu_completes or f.dtype != "fp16"):
        # stock rocket never completes a PPU task; the PPU pools fp16 only (Q14)
        return _max_as_taps(op, options)
    if f.dtype != "fp16" or o.dtype != "fp16":
        raise UnsupportedError(f"{op.name}: the PPU pools fp16 only (int8 reads back wrongly, Q14)")
    stages = _stages(op)
    tasks, scratch, cur = [], [], f
    for i, (kernel, stride, pad) in enumerate(stages):
        (kh, kw), (sy, sx), (pt, pb, pl, pr) = kernel, stride, pad
        for v, lim, what in ((kh, WINDOW_MAX, "window"), (kw, WINDOW_MAX, "window"), (sy, WINDOW_MAX, "stride"),
                             (sx, WINDOW_MAX, "stride"), (max(pad), PAD_MAX, "padding")):
            formats.check(v, lim, f"{op.name}: pooling {what}")
        oh, ow = (cur.height + pt + pb - kh) // sy + 1, (cur.width + pl + pr - kw) // sx + 1
        if i == len(stages) - 1:
            dst = o
            if (o.channels, o.height, o.width) != (cur.channels, oh, ow):
                raise UnsupportedError(f"{op.name}: output {o.shape}, pooling gives {(cur.channels, oh, ow)}")
        else:
            dst = api.Feature(f"{op.name}.stage{i}", 0, cur.channels, oh, ow, "fp16")
            scratch.append(api.Scratch(dst.buffer, dst.nbytes))
        for n, lim in ((cur.width, formats.CUBE_MAX), (cur.height, formats.CUBE_MAX), (cur.channels, formats.CUBE_MAX)):
            formats.check(n - 1, lim - 1, f"{op.name}: pooling cube size")
        tasks.append(_task(op, cur, dst, kernel, stride, pad, i))
        cur = dst
    jobs = [api.JobPlan(list(range(len(tasks))), 0, [f.buffer], [o.buffer] + [s.name for s in scratch])]
    notes = [f"{op.method} pool {f.shape}->{o.shape}: {len(tasks)} PPU task(s)"]
    return api.EmitResult(op, tasks, jobs, scratch=scratch, notes=notes)


def _task(op, f: api.Feature, o: api.Feature, kernel, stride, pad, i) -> api.Task:
    (kh, kw), (sy, sx), (pt, pb, pl, pr) = kernel, stride, pad
    r = RegisterFile()
    r.set("PPU_S_POINTER", **S_POINTER_FIELDS)
    r.set("PPU_RDMA_RDMA_S_POINTER", **S_POINTER_FIELDS)
    r.set("PPU_DATA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=f.width - 1)
    r.set("PPU_DATA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=f.height - 1)
    r.set("PPU_DATA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=f.channels - 1)
    r.set("PPU_DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=o.width - 1)
    r.set("PPU_DATA_CUBE_OUT_HEIGHT", CUBE_OUT_HEIGHT=o.height - 1)
    r.set("PPU_DATA_CUBE_OUT_CHANNEL", CUBE_OUT_CHANNEL=o.channels - 1)
    r.set("PPU_OPERATION_MODE_CFG", FLYING_MODE=1, POOLING_METHOD=METHOD[op.method])
    r.set("PPU_POOLING_KERNEL_CFG", KERNEL_WIDTH=kw - 1, KERNEL_HEIGHT=kh - 1, KERNEL_STRIDE_WIDTH=sx - 1,
          KERNEL_STRIDE_HEIGHT=sy - 1)
    if op.method == "avg":
        r.set("PPU_RECIP_KERNEL_WIDTH", RECIP_KERNEL_WIDTH=recip_fp16(kw))
        r.set("PPU_RECIP_KERNEL_HEIGHT", RECIP_KERNEL_HEIGHT=recip_fp16(kh))
    r.set("PPU_POOLING_PADDING_CFG", PAD_LEFT=pl, PAD_TOP=pt, PAD_RIGHT=pr, PAD_BOTTOM=pb)
    if op.method == "max" and any(pad):
        r.set("PPU_PADDING_VALUE_1_CFG", PAD_VALUE_0=NEG_INF_FP16)
    r.address("PPU_DST_BASE_ADDR", o.buffer, o.offset)
    r.set("PPU_DST_SURF_STRIDE", DST_SURF_STRIDE=o.surface_bytes // 16)
    r.set("PPU_DATA_FORMAT", INDEX_ADD=o.surface_bytes // 16, PROC_PRECISION=formats.PRECISION["fp16"])
    r.set("PPU_MISC_CTRL", BURST_LEN=PPU_BURST_LEN)
    r.set("PPU_RDMA_RDMA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=f.width - 1)
    r.set("PPU_RDMA_RDMA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=f.height - 1)
    r.set("PPU_RDMA_RDMA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=f.channels - 1)
    r.address("PPU_RDMA_RDMA_SRC_BASE_ADDR", f.buffer, f.offset)
    r.set("PPU_RDMA_RDMA_SRC_LINE_STRIDE", SRC_LINE_STRIDE=f.line_bytes // 16)
    r.set("PPU_RDMA_RDMA_SRC_SURF_STRIDE", SRC_SURF_STRIDE=f.surface_bytes // 16)
    r.set("PPU_RDMA_RDMA_DATA_FORMAT", IN_PRECISION=formats.PRECISION["fp16"])
    b = build(r, PPU_ORDER, PPU_BLOCKS)
    window_ops = f.surfaces * f.c2 * o.height * o.width * kh * kw  # the PPU's work, counted like MACs
    counters = api.Counters(window_ops, {"ppu_rdma": f.surfaces * f.dense_surface_bytes},
                            {"ppu_wdma": o.surfaces * o.dense_surface_bytes}, "fp16")
    touches = [(f.buffer, f.offset, f.offset + f.nbytes), (o.buffer, o.offset, o.offset + o.nbytes)]
    return api.Task(b.array(), [api.Reloc(e, buf, off) for e, buf, off in b.relocations], None, counters,
                    f"{op.name} stage {i}", touches)


def _tap_conv(op: api.Pool, src: api.Feature, dst: api.Feature, kernel, stride, padding, tap: int,
              name: str, operand: api.Feature | None) -> api.Conv2D:
    """The depthwise convolution copying window position `tap` of every window of src
    (a one-hot kernel, the padding at the dtype's minimum) into dst, the EW stage keeping
    the larger of it and `operand` (ALU max: the running result in dst, or src itself)."""
    kh, kw = kernel
    dtype = src.dtype
    if dtype not in TAP_PAD:
        raise UnsupportedError(f"{op.name}: max pooling of {dtype}")
    if dtype == "int8" and (src.quant is None or dst.quant is None):
        raise UnsupportedError(f"{op.name}: int8 max pooling needs input and output quantization")
    weights = np.zeros((kh * kw, src.channels), api.NUMPY[dtype])
    weights[tap] = 1
    ep = api.NO_EPILOGUE if operand is None else api.Epilogue(residual=api.Residual(operand, "max"))
    return api.Conv2D(src, weights.reshape(kh, kw, src.channels), dst, stride, padding, True,
                      api.Quant(1.0) if dtype == "int8" else None, ep, name, pad_value=TAP_PAD[dtype])


def _tap_stages(op: api.Pool) -> list[tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]]:
    """A k x k max as a max along W then one along H (kw + kh taps, not kw * kh): each
    stage's (kernel, stride, padding); a stage that would copy its input is left out."""
    (kh, kw), (sy, sx), (pt, pb, pl, pr) = op.kernel, op.stride, op.padding
    stages = [((1, kw), (1, sx), (0, 0, pl, pr)), ((kh, 1), (sy, 1), (pt, pb, 0, 0))]
    kept = [s for s in stages if s[0] != (1, 1) or s[1] != (1, 1) or any(s[2])]
    return kept or stages[:1]


def _max_as_taps(op: api.Pool, options: api.EmitOptions) -> api.EmitResult:
    """Max pooling without the PPU: per stage of `_tap_stages`, one one-hot depthwise
    convolution per window position, each but the first keeping the element-wise max
    with the previous result in its EW stage (hw-matmul.md 5: EW ALU algo 0 = max, the
    operand from ERDMA). Exact in int8 (weight 1, scale 1: the accumulator is the
    input code, the operand is brought to its unit by a multiplier of 1) and in fp16.
    Channels are independent: each core takes a band of whole depthwise channel
    groups through both stages as one job. Within a stage the taps run tile by tile
    (a tile's taps one after the other), so each tile's input stays in CBUF for its
    taps (DATA_REUSE): the input is read once per stage, the running max once per tap."""
    from rkc.compiler.npu.conv import DW_GROUP_BYTES, conv_works

    if op.kernel is None:
        raise UnsupportedError(f"{op.name}: global max pooling is not lowered")
    f, o = op.input, op.output
    stages = _tap_stages(op)
    one_core = replace(options, cores=1)
    group = DW_GROUP_BYTES // api.ITEMSIZE[f.dtype]
    # int8 bands may end in a partial group; an fp16 depthwise task pads its channels to
    # whole groups, which a strided view cannot
    bands = schedule.split_evenly(f.channels, options.cores if f.channels % group == 0 or f.dtype == "int8" else 1,
                                  group)
    maps = [f]
    for i, (kernel, stride, pad) in enumerate(stages):
        (kh, kw), (sy, sx), (pt, pb, pl, pr) = kernel, stride, pad
        src = maps[-1]
        oh, ow = (src.height + pt + pb - kh) // sy + 1, (src.width + pl + pr - kw) // sx + 1
        if i < len(stages) - 1:
            maps.append(api.Feature(f"{op.name}.rows", 0, f.channels, oh, ow, f.dtype, o.quant))
        elif (o.channels, o.height, o.width) != (f.channels, oh, ow):
            raise UnsupportedError(f"{op.name}: output {o.shape}, pooling gives {(f.channels, oh, ow)}")
        else:
            maps.append(o)
    works, constants, convs = [], [], 0
    for lane, (c0, cs) in enumerate(bands):
        views = [m if cs == m.channels else m.view(channel0=c0, channels=cs) for m in maps]
        for i, (kernel, stride, pad) in enumerate(stages):
            per_tap = []
            src, dst = views[i], views[i + 1]
            # a stride-1 stage that keeps the map's size has a tap that copies it: its input
            # is that tap's result, the first task's operand, and the tap no task of its own;
            # not where the EW operand read (every DPU channel: whole groups of 64 in int8)
            # would run past the input's channels
            same = (src.height, src.width) == (dst.height, dst.width) and stride == (1, 1) and \
                kernel != (1, 1) and (src.dtype == "fp16" or cs % group == 0)
            identity = pad[0] * kernel[1] + pad[2] if same else None
            taps = [t for t in range(kernel[0] * kernel[1]) if t != identity]
            for n, tap in enumerate(taps):
                name = f"{op.name}.b{lane}.s{i}.t{tap}"
                operand = dst if n else (src if identity is not None else None)
                tap_works, consts, _ = conv_works(_tap_conv(op, src, dst, kernel, stride, pad, tap, name, operand),
                                                  one_core)
                constants += consts
                per_tap.append([replace(w, lane=lane, data_key=(lane, i, k), weight_key=(name, k))
                                for k, w in enumerate(tap_works)])
            works += [w for tile in zip(*per_tap) for w in tile]
            convs += len(per_tap) if lane == 0 else 0
    tasks, jobs = schedule.schedule(works)
    constants = schedule.pad_constants(constants, tasks)
    result = api.EmitResult(op, tasks, jobs, constants)
    if len(maps) > 2:
        mid = maps[1]
        result.scratch = [api.Scratch(mid.buffer, max(mid.nbytes, result.extents().get(mid.buffer, 0)))]
    result.notes = [f"max pool {op.kernel[0]}x{op.kernel[1]}/{op.stride[0]}x{op.stride[1]} {f.shape}->{o.shape} "
                    f"{f.dtype}: {convs} one-hot depthwise convolutions keeping the EW max ({len(stages)} stage(s), "
                    f"{len(bands)} band(s) of channels, one job each)"]
    return result


def _avg_conv(op: api.Pool, f: api.Feature, o: api.Feature, kernel, stride, padding, name: str) -> api.Conv2D:
    """The depthwise convolution averaging `kernel` windows of f into o."""
    kh, kw = kernel
    n = kh * kw
    if f.dtype == "fp16":
        # 1/n in fp16 (exact for powers of two; else within fp16 rounding, as the
        # PPU's own fp16 reciprocal is)
        weights = np.full((kh, kw, f.channels), 1.0 / n, np.float16)
        return api.Conv2D(f, weights, o, stride, padding, True, None, api.NO_EPILOGUE, name)
    if f.dtype == "int8":
        if f.quant is None or o.quant is None:
            raise UnsupportedError(f"{op.name}: int8 average pooling needs input and output quantization")
        # every weight 1 with scale 1/n: the requantization divides the window sum
        return api.Conv2D(f, np.ones((kh, kw, f.channels), np.int8), o, stride, padding, True,
                          api.Quant(1.0 / n), api.NO_EPILOGUE, name)
    raise UnsupportedError(f"{op.name}: pooling of {f.dtype}")


def _avg_as_depthwise(op: api.Pool, options: api.EmitOptions) -> api.EmitResult:
    from rkc.compiler.npu.conv import lower_conv

    f, o = op.input, op.output
    kh, kw = op.kernel if op.kernel is not None else (f.height, f.width)
    try:
        result = lower_conv(_avg_conv(op, f, o, (kh, kw), op.stride, op.padding, op.name), options)
    except UnsupportedError as refused:
        if (kh, kw) != (f.height, f.width) or op.padding[0] or op.padding[2] or op.padding[3]:
            raise
        return _global_avg_in_two(op, options, refused)
    result.op = op
    result.notes.insert(0, f"avg pool {kh}x{kw} as a depthwise convolution (completes on the DPU interrupt)")
    return result


def _avg_rescaled(op: api.Pool, counts: np.ndarray, options: api.EmitOptions) -> api.EmitResult:
    """An average whose divisor varies by position (padding excluded, ceil-mode
    overhang) exactly: the depthwise convolution sums each window (every weight
    1; the padding adds zero), and the EW stage multiplies the sum by a constant
    map of 1 / count that the program places beside the weights (the conv's
    element-wise operand, read by the ERDMA like a residual; one copy per channel:
    the operand has the output's shape). fp16: the map holds fp16(1 / count).
    int8: it holds L / count for L the counts' least common multiple at scale
    1 / L, so the product is exact and OUT_CVT requantizes it once, as an int8
    average's division by the window size; L must fit int8 (127)."""
    from rkc.compiler.npu.conv import lower_conv

    f, o = op.input, op.output
    (kh, kw), (sy, sx), (pt, pb, pl, pr) = op.kernel, op.stride, op.padding
    if f.dtype not in ("fp16", "int8"):
        raise UnsupportedError(f"{op.name}: pooling of {f.dtype}")
    if f.dtype == "fp16":
        per_position, quant, weight_quant = (1.0 / counts).astype(np.float16), None, None
    else:
        if f.quant is None or o.quant is None:
            raise UnsupportedError(f"{op.name}: int8 average pooling needs input and output quantization")
        common = int(np.lcm.reduce(np.unique(counts)))
        if common > np.iinfo(np.int8).max:
            raise UnsupportedError(f"{op.name}: the window counts {sorted(set(counts.flat))} have no exact common "
                                   f"int8 scale (their multiple {common} is over 127)")
        per_position, quant, weight_quant = (common // counts).astype(np.int8), api.Quant(1.0 / common), api.Quant(1.0)
    name = f"{op.name}.divisors"
    rescale = api.Feature(name, 0, o.channels, o.height, o.width, f.dtype, quant)
    map_bytes = layout.pack_feature(np.broadcast_to(per_position, (o.channels, *per_position.shape))).tobytes()
    # the end padding a ceil-mode output's last window reaches (zeros, never counted)
    padding = (pt, max(pb, (o.height - 1) * sy + kh - f.height - pt), pl, max(pr, (o.width - 1) * sx + kw - f.width - pl))
    ones = np.ones((kh, kw, f.channels), api.NUMPY[f.dtype])
    conv = api.Conv2D(f, ones, o, op.stride, padding, True, weight_quant,
                      api.Epilogue(residual=api.Residual(rescale, "mul")), op.name)
    result = lower_conv(conv, options)
    result.op = op
    result.constants += schedule.pad_constants([api.ConstBuffer(name, map_bytes)], result.tasks)
    result.notes.insert(0, f"avg pool {kh}x{kw} over {counts.min()}..{counts.max()} positions: window sums as a "
                           f"depthwise convolution times a constant map of 1/count (EW multiply)")
    return result


def _global_avg_in_two(op: api.Pool, options: api.EmitOptions, refused: UnsupportedError) -> api.EmitResult:
    """A window over the whole map that one convolution cannot take (a kernel over the
    CNA's 31, or bigger than a CBUF bank) as two averages: a by b windows at stride
    (a, b) into a map of (H/a, W/b), then that whole map (with the op's bottom padding:
    a global pool's GEMM rows). The mean of equal-sized means is the mean. Each core
    takes a band of whole depthwise channel groups through both."""
    from rkc.compiler.npu.conv import DW_GROUP_BYTES, lower_conv

    f, o = op.input, op.output
    h, w = f.height, f.width
    one_core = replace(options, cores=1)
    group = DW_GROUP_BYTES // api.ITEMSIZE[f.dtype]
    # bands of whole groups; one band when the channels leave a partial group (an fp16
    # depthwise task pads its channels to whole groups, which a strided view cannot)
    bands = schedule.split_evenly(f.channels, options.cores if f.channels % group == 0 else 1, group)
    pairs = sorted(((a, b) for a in range(1, h + 1) if h % a == 0 for b in range(1, w + 1) if w % b == 0
                    and a * b > 1), key=lambda ab: (ab[0] * ab[1], abs(ab[0] - ab[1])))
    for a, b in pairs:
        mid = api.Feature(f"{op.name}.means", 0, f.channels, h // a, w // b, f.dtype, f.quant)
        try:
            tasks, jobs, constants = [], [], []
            for lane, (c0, cs) in enumerate(bands):
                src, part, dst = (t if cs == t.channels else t.view(channel0=c0, channels=cs) for t in (f, mid, o))
                parts = [lower_conv(_avg_conv(op, src, part, (a, b), (a, b), (0, 0, 0, 0), f"{op.name}.b{lane}.s0"),
                                    one_core),
                         lower_conv(_avg_conv(op, part, dst, (h // a, w // b), (1, 1), op.padding,
                                              f"{op.name}.b{lane}.s1"), one_core)]
                first = len(tasks)
                own = [k for r in parts for k in r.constants]
                tasks += [t for r in parts for t in r.tasks]
                constants += own
                jobs.append(api.JobPlan(list(range(first, len(tasks))), lane, [f.buffer] + [k.name for k in own],
                                        [o.buffer, mid.buffer]))
        except UnsupportedError:
            continue
        # the depthwise writer fills whole channel groups: the means map holds what it writes
        written = replace(mid, channels=-(-f.channels // group) * group).nbytes
        notes = [f"avg pool {h}x{w} as two depthwise convolutions: {a}x{b} means at stride {a}x{b}, then their "
                 f"{h // a}x{w // b} mean ({len(bands)} band(s) of channels, one job each)"]
        return api.EmitResult(op, tasks, jobs, constants, [api.Scratch(mid.buffer, written)], notes=notes)
    raise refused
