"""A transposed convolution whose stride is its k x k kernel, as convolutions
(no deconvolution: DECONV has no documented semantics, hardware question Q24).

Each input pixel writes its own k x k block of the output, so the operation is a
1x1 convolution of O*k*k outputs rearranged depth to space. The rearrangement
is done by the addressing, as nearest upsampling does it (compiler/npu/upsample.py):

1. Columns, for each row tap i of the kernel. A surface holds the map's positions
   row-major, so the input read as H*W one-pixel rows [I, H*W, 1] is the same
   bytes. A 1 x k window padded by k - 1 columns on each side gives k output
   columns; column j sees the pixel only under the window's tap k - 1 - j (the
   others fall on the padding, zero in fp16, the zero point in int8, which the
   bias term cancels), so with the kernel's row i reversed as the window, column j
   is sum_c w[o, i, j, c] x[c] (+ bias, activation): [O, H*W, k], whose bytes are
   the map [O, H, kW] of output rows k*y + i.
2. Rows. A 1x1 copy (depthwise ones where the channels fill the depthwise
   writer's groups, else the identity matrix) writes that map into the output
   with a line pitch of k lines, starting at line i: the gaps are the other row
   taps' lines (the DPU's NOTCH, docs/hardware-questions.md Q4).

The copies are exact (fp16 multiplies by 1 and adds zeros; int8 requantizes by
exactly 1, input and output at the output's scale), so the epilogue runs once,
in step 1.

As for upsampling, the map is cut into one band of input rows per core (4+ rows
each, Q2) and each band runs its 2k tasks on its own core as one job.
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


def lower_conv_transpose(op: api.ConvTranspose2D, options: api.EmitOptions) -> api.EmitResult:
    f, o, k = op.input, op.output, op.k
    c, h, w = f.shape
    n = op.weights.shape[0]
    if op.weights.shape != (n, k, k, c):
        raise UnsupportedError(f"{op.name}: weights {op.weights.shape} are not [O, k, k, {c}]")
    if o.shape != (n, k * h, k * w) or o.dtype != f.dtype:
        raise UnsupportedError(f"{op.name}: a {k}x{k}/{k} transposed convolution of {f.shape} is "
                               f"{(n, k * h, k * w)} {f.dtype}, not {o.shape} {o.dtype}")
    if f.dtype not in ("int8", "fp16"):
        raise UnsupportedError(f"{op.name}: transposed convolutions run on int8 or fp16 maps, not {f.dtype}")
    if k - 1 > PAD_MAX:
        raise UnsupportedError(f"{op.name}: a {k}x{k} kernel needs {k - 1} columns of padding, over the "
                               f"CNA's {PAD_MAX}")
    if f.line_stride is not None or o.line_stride is not None:
        raise UnsupportedError(f"{op.name}: transposed convolutions read and write maps with dense rows")
    if op.epilogue.residual is not None:
        raise UnsupportedError(f"{op.name}: a residual operand is not fused into a transposed convolution")
    if f.dtype == "int8" and (f.quant is None or o.quant is None):
        raise UnsupportedError(f"{op.name}: int8 transposed convolution needs input and output quantization")
    copy_quant = api.Quant(1.0) if f.dtype == "int8" else None
    unit = np.int8 if f.dtype == "int8" else np.float16
    depthwise_copy = n % (DW_GROUP_BYTES // api.ITEMSIZE[f.dtype]) == 0
    copy = np.ones((1, 1, n), unit) if depthwise_copy else np.eye(n, dtype=unit).reshape(n, 1, 1, n)
    # one map of output rows per row tap, [O, H, kW] (the same bytes as [O, H*W, k])
    taps = [api.Feature(f"{op.name}.row{i}", 0, n, h, k * w, f.dtype, o.quant) for i in range(k)]
    one_core = replace(options, cores=1)
    bands = schedule.split_evenly(h, max(1, min(options.cores, h // options.min_input_rows)), 1)
    tasks, jobs, constants, notes = [], [], [], []
    for lane, (y0, rows) in enumerate(bands):
        band = f"{op.name}.b{lane}"
        src = f.view(row0=y0, rows=rows)
        out = o.view(row0=k * y0, rows=k * rows)
        parts = []
        for i, tap in enumerate(taps):
            mid = tap.view(row0=y0, rows=rows)
            window = np.ascontiguousarray(op.weights[:, i:i + 1, ::-1, :])  # [O, 1, k, I], reversed
            parts.append(lower_conv(api.Conv2D(replace(src, height=rows * w, width=1), window,
                                               replace(mid, height=rows * w, width=k), padding=(0, 0, k - 1, k - 1),
                                               weight_quant=op.weight_quant, epilogue=op.epilogue,
                                               name=f"{band}.columns{i}"), one_core))
            dst = replace(out, offset=out.offset + i * o.line_bytes, height=rows, line_stride=k * o.line_bytes)
            parts.append(lower_conv(api.Conv2D(mid, copy, dst, depthwise=depthwise_copy, weight_quant=copy_quant,
                                               name=f"{band}.rows{i}"), one_core))
        first = len(tasks)
        own = [kb for part in parts for kb in part.constants]
        tasks += [t for part in parts for t in part.tasks]
        constants += own
        jobs.append(api.JobPlan(list(range(first, len(tasks))), lane, [f.buffer] + [kb.name for kb in own],
                                [o.buffer] + [tap.buffer for tap in taps]))
        notes += parts[0].notes[-1:]
    notes.insert(0, f"transposed convolution {k}x{k}/{k} {f.shape}->{o.shape} {f.dtype}: {len(bands)} band(s) "
                    f"of rows, one job each: per row tap, a 1x{k} window over the one-pixel rows, then a copy "
                    f"{k} lines apart (DPU notch)")
    # a direct convolution writes whole kernel groups: the row maps hold the channels past O it writes
    written = replace(taps[0], channels=layout.align(n, kernel_group(f.dtype))).nbytes
    return api.EmitResult(op, tasks, jobs, constants, [api.Scratch(t.buffer, written) for t in taps], notes=notes)
