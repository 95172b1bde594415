"""Nearest upsampling by an integer factor k as convolutions of ones (no
deconvolution: DECONV has no documented semantics, hardware question Q24).

1. Rows. A 1x1 window of one copies the map k times into a scratch map
   [C, kH, W], each copy's rows one line apart: the destination's line pitch is k
   lines, the gaps after every row written by the other copies (the DPU's NOTCH:
   a line is width + NOTCH atoms, docs/hardware-questions.md Q4).
2. Columns. A surface holds the map's positions row-major, so that map read as
   kH*W one-pixel rows [C, kH*W, 1] is the same bytes. A 1 x k window of ones
   padded by k - 1 columns on each side gives k output columns, each seeing the
   pixel once and padded positions otherwise (zero in fp16, the zero point in int8,
   which the bias term cancels): [C, kH*W, k], whose bytes are the output
   [C, kH, kW].

Rows first: the copies read the small input k times and the window reads the
scratch once and writes the output once (columns first, the copies would read the
k-times wider scratch k times: k^2 + 1 input sizes read instead of 2k).
Both are exact: fp16 multiplies by 1 and adds zeros; int8 requantizes by
exactly 1 (input and output share the scale: a Resize only selects values).

Where the channels fill the depthwise writer's groups both steps are depthwise.
Otherwise both are direct convolutions of the identity (the copies write whole
kernel groups into the scratch), and the window tasks writing the output stay
inside its channels, which may be a Concat's slice: a direct task writes whole
kernel groups (fp16 N % 16, int8 N % 32, hw-matmul.md), so C channels that are
not a whole number of groups are written as channels [0, C - C % g) and
[C - g, C), two tasks writing the channels between twice with the same values.

The map is cut into one band of rows per core (4+ rows each, Q2) and each band
runs its steps on its own core as one job: a band's rows read only its own
rows, so the job needs nothing from another core (one chained kick per core
where the program chains).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api, schedule
from rkc.compiler.npu.conv import DW_GROUP_BYTES, lower_conv
from rkc.compiler.npu.conv_core import kernel_group
from rkc.compiler.npu.formats import PAD_MAX
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout


def copy_ranges(channels: int, group: int) -> list[tuple[int, int]]:
    """(first channel, count) of the direct copies writing exactly `channels`:
    whole groups, the last one overlapping its predecessor where C % group != 0."""
    whole = channels - channels % group
    ranges = [(0, whole)] if whole else []
    if channels % group:
        ranges.append((max(0, channels - group), min(channels, group)))
    return ranges


def _identity(rows: range, channels: int, kw: int, unit) -> np.ndarray:
    """[len(rows), 1, kw, channels] weights: output r takes input channel rows[r] under every tap."""
    w = np.zeros((len(rows), 1, kw, channels), unit)
    w[np.arange(len(rows)), :, :, np.asarray(rows)] = 1
    return w


def lower_upsample(op: api.Upsample, options: api.EmitOptions) -> api.EmitResult:
    f, o, k = op.input, op.output, op.factor
    c, h, w = f.shape
    if k < 2 or o.shape != (c, k * h, k * w) or o.dtype != f.dtype:
        raise UnsupportedError(f"{op.name}: nearest x{k} of {f.shape} {f.dtype} is {(c, k * h, k * w)} "
                               f"{f.dtype}, not {o.shape} {o.dtype}")
    if f.dtype not in ("int8", "fp16"):
        raise UnsupportedError(f"{op.name}: upsampling runs on int8 or fp16 maps, not {f.dtype}")
    if k - 1 > PAD_MAX:
        raise UnsupportedError(f"{op.name}: x{k} needs {k - 1} columns of padding, over the CNA's {PAD_MAX}")
    if f.line_stride is not None or o.line_stride is not None:
        raise UnsupportedError(f"{op.name}: upsampling reads and writes maps with dense rows")
    if f.dtype == "int8" and (f.quant is None or o.quant != f.quant):
        raise UnsupportedError(f"{op.name}: int8 upsampling copies values: input and output need one quantization")
    weight_quant = api.Quant(1.0) if f.dtype == "int8" else None
    unit = np.int8 if f.dtype == "int8" else np.float16
    depthwise = c % (DW_GROUP_BYTES // api.ITEMSIZE[f.dtype]) == 0
    group = kernel_group(f.dtype)
    if not depthwise and c < group:
        # one direct task writes a whole kernel group: the channels past C would land
        # in the next tensor (a concatenation's neighbour)
        raise UnsupportedError(f"{op.name}: {f.dtype} upsampling needs {group}+ channels, got {c}")
    copy = np.ones((1, 1, c), unit) if depthwise else _identity(range(c), c, 1, unit)
    if depthwise:
        windows = [(0, c, np.ones((1, k, c), unit))]
    else:
        windows = [(c0, n, _identity(range(c0, c0 + n), c, k, unit)) for c0, n in copy_ranges(c, group)]
    repeated = api.Feature(f"{op.name}.rows", 0, c, k * h, w, f.dtype, f.quant)
    one_core = replace(options, cores=1)
    bands = schedule.split_evenly(h, max(1, min(options.cores, h // options.min_input_rows)), 1)
    tasks, jobs, constants, notes = [], [], [], []
    for lane, (y0, rows) in enumerate(bands):
        band = f"{op.name}.b{lane}"
        src, mid = f.view(row0=y0, rows=rows), repeated.view(row0=k * y0, rows=k * rows)
        parts = []
        for line in range(k):
            dst = replace(mid, offset=mid.offset + line * repeated.line_bytes, height=rows,
                          line_stride=k * repeated.line_bytes)
            parts.append(lower_conv(api.Conv2D(src, copy, dst, depthwise=depthwise, weight_quant=weight_quant,
                                               name=f"{band}.rows{line}"), one_core))
        out = o.view(row0=k * y0, rows=k * rows)
        for c0, n, window in windows:
            parts.append(lower_conv(api.Conv2D(replace(mid, height=k * rows * w, width=1), window,
                                               replace(out, height=k * rows * w, width=k).view(channel0=c0, channels=n),
                                               padding=(0, 0, k - 1, k - 1), depthwise=depthwise,
                                               weight_quant=weight_quant, name=f"{band}.columns.c{c0}"), one_core))
        first = len(tasks)
        own = [b for part in parts for b in part.constants]
        tasks += [t for part in parts for t in part.tasks]
        constants += own
        jobs.append(api.JobPlan(list(range(first, len(tasks))), lane, [f.buffer] + [b.name for b in own],
                                [o.buffer, repeated.buffer]))
        notes += parts[-1].notes[-1:]
    how = "depthwise ones" if depthwise else f"identity windows over {len(windows)} channel range(s)"
    notes.insert(0, f"nearest x{k} {f.shape}->{o.shape} {f.dtype}: {len(bands)} band(s) of rows, one job each: "
                    f"rows as {k} copies a line apart (DPU notch), columns as a 1x{k} window over the one-pixel "
                    f"rows, {how}")
    # a direct copy writes whole kernel groups into the scratch
    written = repeated.nbytes if depthwise else replace(repeated, channels=layout.align(c, group)).nbytes
    return api.EmitResult(op, tasks, jobs, constants, [api.Scratch(repeated.buffer, written)], notes=notes)
