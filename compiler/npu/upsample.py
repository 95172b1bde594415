"""Nearest x2 upsampling as two depthwise convolutions of ones (no deconvolution:
DECONV has no documented semantics, hardware question Q24).

1. Columns. A surface holds the map's positions row-major, so the map read as
   H*W one-pixel rows [C, H*W, 1] is the same bytes. A 1x2 window of ones padded
   by one column on each side gives two output columns, each seeing the pixel
   and one padded position (zero in fp16, the zero point in int8, which the
   bias term cancels): [C, H*W, 2], whose bytes are the column-doubled map
   [C, H, 2W].
2. Rows. A 1x1 window of one copies that map twice into the output, each copy's
   rows one output line apart: the destination's line pitch is two lines, the
   gap after every row written by the other copy (the DPU's NOTCH: a line is
   width + NOTCH atoms, docs/hardware-questions.md Q4).

Both are exact: fp16 multiplies by 1 and adds zeros; int8 requantizes by
exactly 1 (input and output share the scale: a Resize only selects values).

The map is cut into one band of rows per core (4+ rows each, Q2) and each band
runs both steps on its own core as one job: a band's rows read only its own
rows, so the job needs nothing from another core (one chained kick per core
where the program chains).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rkc.compiler.npu import api, schedule
from rkc.compiler.npu.conv import DW_GROUP_BYTES, lower_conv
from rkc.ir.errors import UnsupportedError


def lower_upsample(op: api.Upsample, options: api.EmitOptions) -> api.EmitResult:
    f, o = op.input, op.output
    c, h, w = f.shape
    if o.shape != (c, 2 * h, 2 * w) or o.dtype != f.dtype:
        raise UnsupportedError(f"{op.name}: nearest x2 of {f.shape} {f.dtype} is {(c, 2 * h, 2 * w)} "
                               f"{f.dtype}, not {o.shape} {o.dtype}")
    if f.dtype not in ("int8", "fp16"):
        raise UnsupportedError(f"{op.name}: upsampling runs on int8 or fp16 maps, not {f.dtype}")
    group = DW_GROUP_BYTES // api.ITEMSIZE[f.dtype]
    if c % group:
        # a depthwise task writes whole groups: the channels past C would land in
        # the next tensor (a concatenation's neighbour)
        raise UnsupportedError(f"{op.name}: {f.dtype} upsampling needs channels in multiples of {group}, got {c}")
    if f.line_stride is not None or o.line_stride is not None:
        raise UnsupportedError(f"{op.name}: upsampling reads and writes maps with dense rows")
    if f.dtype == "int8" and (f.quant is None or o.quant != f.quant):
        raise UnsupportedError(f"{op.name}: int8 upsampling copies values: input and output need one quantization")
    weight_quant = api.Quant(1.0) if f.dtype == "int8" else None
    ones = np.int8 if f.dtype == "int8" else np.float16
    doubled = api.Feature(f"{op.name}.columns", 0, c, h, 2 * w, f.dtype, f.quant)
    one_core = replace(options, cores=1)
    bands = schedule.split_evenly(h, max(1, min(options.cores, h // options.min_input_rows)), 1)
    tasks, jobs, constants, notes = [], [], [], []
    for lane, (y0, rows) in enumerate(bands):
        band = f"{op.name}.b{lane}"
        src, mid = f.view(row0=y0, rows=rows), doubled.view(row0=y0, rows=rows)
        parts = [lower_conv(api.Conv2D(replace(src, height=rows * w, width=1), np.ones((1, 2, c), ones),
                                       replace(mid, height=rows * w, width=2), padding=(0, 0, 1, 1), depthwise=True,
                                       weight_quant=weight_quant, name=f"{band}.columns"), one_core)]
        out = o.view(row0=2 * y0, rows=2 * rows)
        for copy in range(2):
            dst = replace(out, offset=out.offset + copy * o.line_bytes, height=rows, line_stride=2 * o.line_bytes)
            parts.append(lower_conv(api.Conv2D(mid, np.ones((1, 1, c), ones), dst, depthwise=True,
                                               weight_quant=weight_quant, name=f"{band}.rows{copy}"), one_core))
        first = len(tasks)
        own = [k for part in parts for k in part.constants]
        tasks += [t for part in parts for t in part.tasks]
        constants += own
        jobs.append(api.JobPlan(list(range(first, len(tasks))), lane, [f.buffer] + [k.name for k in own],
                                [o.buffer, doubled.buffer]))
        notes += parts[0].notes[-1:]
    notes.insert(0, f"nearest x2 {f.shape}->{o.shape} {f.dtype}: {len(bands)} band(s) of rows, one job each: "
                    f"columns as a 1x2 window over the one-pixel rows, rows as two copies a line apart (DPU notch)")
    return api.EmitResult(op, tasks, jobs, constants, [api.Scratch(doubled.buffer, doubled.nbytes)], notes=notes)
