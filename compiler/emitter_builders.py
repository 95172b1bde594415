"""The builders of emitter operations (compiler/npu/api.py) from graph ops: a
convolution (a squeeze-excite gate's among them), a transposed convolution, a
GEMM, a lookup-table activation, an element-wise op or channel gate, a pool, an
upsample; BUILDERS maps each emitter operation an OpSpec names to its builder
(compiler/emitter_ops.py calls them; the LRN's and a run-time B product's live
in emitter_norm.py and emitter_matmul.py)."""

from __future__ import annotations

import numpy as np

from rkc.compiler import emitter_norm
from rkc.compiler.emitter_graph import (lowering, lut_function, vector_map, npu_layout, npu_name, dense_name,
                                        device_dtype, Refused, act_quant, weight_scales, per_channel_quant,
                                        npu_feature, zero_padded_input, position_view, MIN_ROWS, Tail, per_channel,
                                        dpu_epilogue, channel_gate)
from rkc.compiler.emitter_matmul import run_time_b_matmul
from rkc.compiler.npu import api
from rkc.compiler.npu.formats import KERNEL_SIZE_MAX as KERNEL_MAX
from rkc.ir.graph import Graph
from rkc.ir.npu.geometry import GEMM_ROW_ALIGN, pads_for
from rkc.ir.types import PerAxisQuant


# -- anchors -------------------------------------------------------------------------------------
def _conv(graph: Graph, i: int, tail: Tail, precision: str, program: str) -> tuple[api.Conv2D, dict[str, str]]:
    op = graph.ops[i]
    dtype = device_dtype(precision)
    x = graph.tensors[op.inputs[0]].type
    w = graph.const_value(op.inputs[1])
    bias = graph.const_value(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] else None
    groups = int(op.attrs.get("group", 1))
    depthwise = groups > 1
    kernel = list(w.shape[2:])
    strides = [int(s) for s in op.attrs.get("strides", [1, 1])]
    dil = [int(d) for d in op.attrs.get("dilations", [1, 1])]
    begin, end = pads_for(op.attrs.get("auto_pad", "NOTSET"), x.shape[2:], kernel, strides, dil, op.attrs.get("pads"))
    w_scales = None
    if dtype == "int8":
        w_scales = weight_scales(graph, op.inputs[1], w.shape[0])
        wq = np.clip(np.rint(w / w_scales.reshape(-1, 1, 1, 1)), -128, 127).astype(np.int8)
        weight_quant = per_channel_quant(w_scales)
    else:
        wq, weight_quant = w.astype(np.float16), None
    weights = wq[:, 0].transpose(1, 2, 0) if depthwise else wq.transpose(0, 2, 3, 1)
    if bias is not None:
        bias = bias.astype(np.float64)
        if tail.bias is not None:
            bias = bias + tail.bias
    else:
        bias = tail.bias
    in_scale = act_quant(graph, op.inputs[0], precision).scale if dtype == "int8" else 1.0
    pointwise = kernel == [1, 1] and strides == [1, 1] and not any(begin) and not any(end)
    layout = npu_layout(graph, op.inputs[0])
    view = None
    if layout == "native-gemm":
        if not pointwise:
            raise Refused("a convolution with a window over a 1x1 map (padding only) is not lowered")
        if npu_layout(graph, tail.output) == "native":
            return _gate_conv(graph, op, tail, weights, depthwise, bias, weight_quant, in_scale, w_scales, precision,
                              program, i)
        if not depthwise:  # [1, C] x [C, O]: the GEMM it is
            epi = dpu_epilogue(graph, tail, bias, dtype, precision, program, layout, in_scale, w_scales)
            gemm = api.Gemm(npu_feature(graph, op.inputs[0], layout, dtype, precision, program),
                            np.ascontiguousarray(weights[:, 0, 0, :].T),
                            npu_feature(graph, tail.output, layout, dtype, precision, program), 1,
                            b_quant=weight_quant, epilogue=epi, name=f"npu{i}")
            return gemm, {t: layout for t in (op.inputs[0], tail.residual) if t}
    elif pointwise:
        # a pointwise convolution treats every position alike: a map of fewer rows
        # than a task must read is read as a taller grid of the same positions
        view = position_view(x.shape, lambda r, w: r >= MIN_ROWS)
    epi = dpu_epilogue(graph, tail, bias, dtype, precision, program, layout, in_scale, w_scales, view)
    src = npu_feature(graph, op.inputs[0], layout, dtype, precision, program, view)
    padding = (begin[0], end[0], begin[1], end[1])
    if view is None and src.row_padded:
        src, padding = zero_padded_input(src, padding, f"npu{i}")
    out_layout, stride = layout, (strides[0], strides[1])
    if layout == "native" and npu_layout(graph, tail.output) == "native-gemm":
        # one window over the whole map (a fully connected layer on a flattened map,
        # compiler/passes/flat_head.py): the 1x1 result is a GEMM row of 4 stored rows
        # (vector_map), as a one-window pool's: the window slides row by row 3 rows
        # further into bottom padding, which makes those rows (never read)
        if x.shape[2] + begin[0] + end[0] != kernel[0] or tail.residual is not None:
            raise Refused("a convolution's 1x1 result is a GEMM row: written from one window of rows, "
                          "without a residual")
        pt, pb, pl, pr = padding
        out_layout, padding, stride = "native-gemm", (pt, pb + GEMM_ROW_ALIGN - 1, pl, pr), (1, strides[1])
    conv = api.Conv2D(src, np.ascontiguousarray(weights),
                      npu_feature(graph, tail.output, out_layout, dtype, precision, program, view),
                      stride=stride,
                      padding=padding, depthwise=depthwise,
                      weight_quant=weight_quant, epilogue=epi, name=f"npu{i}")
    return conv, {t: layout for t in (op.inputs[0], tail.residual) if t}


def _gate_conv(graph: Graph, op, tail: Tail, weights, depthwise: bool, bias, weight_quant, in_scale, w_scales,
               precision: str, program: str, i: int) -> tuple[api.Conv2D, dict[str, str]]:
    """A 1x1 convolution of a [1, C, 1, 1] vector whose result is a channel gate (the
    excite convolution of a squeeze-excite block, or the hard-sigmoid's scale after it):
    the input's GEMM row is a native map of 4 rows and one column (api.Feature.gemm),
    which a 1x1 convolution at row stride 4 reads row 0 of, writing the one-position
    native map the gate's product reads as its depthwise weights. The gate never leaves
    the NPU."""
    dtype = device_dtype(precision)
    src = npu_feature(graph, op.inputs[0], "native-gemm", dtype, precision, program)
    if tail.residual is not None:
        raise Refused("a residual Add is not fused into a channel gate's convolution")
    epi = dpu_epilogue(graph, tail, bias, dtype, precision, program, "native", in_scale, w_scales)
    gate = npu_feature(graph, tail.output, "native", dtype, precision, program)
    conv = api.Conv2D(src, np.ascontiguousarray(weights), gate, stride=(src.height, 1), depthwise=depthwise,
                      weight_quant=weight_quant, epilogue=epi, name=f"npu{i}")
    return conv, {op.inputs[0]: "native-gemm"}


def _conv_transpose(graph: Graph, i: int, tail: Tail, precision: str, program: str):
    op = graph.ops[i]
    dtype = device_dtype(precision)
    w = graph.const_value(op.inputs[1])  # [I, O, k, k]
    bias = graph.const_value(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] else None
    bias = tail.bias if bias is None else bias.astype(np.float64) + (0 if tail.bias is None else tail.bias)
    if tail.residual is not None:
        raise Refused("a residual Add is not fused into a transposed convolution")
    w_scales = None
    if dtype == "int8":
        q = graph.tensors[op.inputs[1]].type.quant
        if isinstance(q, PerAxisQuant) and q.axis != 1:
            raise Refused(f"int8 ConvTranspose weights {op.inputs[1]!r} are scaled along axis {q.axis}, "
                           "not per output channel (axis 1)")
        w_scales = weight_scales(graph, op.inputs[1], w.shape[1])
        wq = np.clip(np.rint(w / w_scales.reshape(1, -1, 1, 1)), -128, 127).astype(np.int8)
        weight_quant = per_channel_quant(w_scales)
    else:
        wq, weight_quant = w.astype(np.float16), None
    in_scale = act_quant(graph, op.inputs[0], precision).scale if dtype == "int8" else 1.0
    epi = dpu_epilogue(graph, tail, bias, dtype, precision, program, "native", in_scale, w_scales)
    ct = api.ConvTranspose2D(npu_feature(graph, op.inputs[0], "native", dtype, precision, program),
                             np.ascontiguousarray(wq.transpose(1, 2, 3, 0)),
                             npu_feature(graph, tail.output, "native", dtype, precision, program),
                             weight_quant, epi, name=f"npu{i}")
    return ct, {op.inputs[0]: "native"}


def _gemm(graph: Graph, i: int, tail: Tail, precision: str, program: str) -> tuple[api.Gemm, dict[str, str]]:
    op = graph.ops[i]
    dtype = device_dtype(precision)
    a_shape = graph.tensors[op.inputs[0]].type.shape
    if op.type == "MatMul" and graph.const_value(op.inputs[1]) is None:
        return run_time_b_matmul(graph, i, tail, precision, program)
    b = graph.const_value(op.inputs[1]).astype(np.float64)
    bias = None
    if op.type == "Gemm":
        if op.attrs.get("transB", 0):
            b = b.T
        b = b * float(op.attrs.get("alpha", 1.0))
        if len(op.inputs) > 2 and op.inputs[2]:
            c = graph.const_value(op.inputs[2])
            vec = None if c is None else per_channel(c, b.shape[1], 2, True)
            if vec is None:
                raise Refused("Gemm's C must be a constant per-column bias")
            bias = vec * float(op.attrs.get("beta", 1.0))
    if tail.bias is not None:
        bias = tail.bias if bias is None else bias + tail.bias
    w_scales = None
    if dtype == "int8":
        w_scales = weight_scales(graph, op.inputs[1], b.shape[1])
        bq = np.clip(np.rint(b / w_scales.reshape(1, -1)), -128, 127).astype(np.int8)
        b_quant = per_channel_quant(w_scales)
    else:
        bq, b_quant = b.astype(np.float16), None
    m = int(a_shape[-2])
    in_scale = act_quant(graph, op.inputs[0], precision).scale if dtype == "int8" else 1.0
    epi = dpu_epilogue(graph, tail, bias, dtype, precision, program, "native-gemm", in_scale, w_scales)
    gemm = api.Gemm(npu_feature(graph, op.inputs[0], "native-gemm", dtype, precision, program), np.ascontiguousarray(bq),
                    npu_feature(graph, tail.output, "native-gemm", dtype, precision, program), m, b_quant=b_quant,
                    epilogue=epi, name=f"npu{i}")
    reads = {op.inputs[0]: "native-gemm"}
    if tail.residual:
        reads[tail.residual] = "native-gemm"
    return gemm, reads


def _activation(graph: Graph, i: int, tail: Tail, precision: str, program: str):
    op = graph.ops[i]
    function = lut_function(op)
    if function is None:
        raise Refused(f"{op.type} with these attributes has no DPU lookup table")
    if precision != "fp16":
        raise Refused("standalone lookup-table activations run in fp16")
    layout = npu_layout(graph, op.inputs[0])
    if npu_layout(graph, op.outputs[0]) != layout:
        raise Refused("a lookup-table activation keeps its input's layout (its result is a channel gate)")
    act = api.Activation(npu_feature(graph, op.inputs[0], layout, "fp16", precision, program),
                         npu_feature(graph, op.outputs[0], layout, "fp16", precision, program), function, name=f"npu{i}")
    return act, {op.inputs[0]: layout}


def _eltwise(graph: Graph, i: int, tail: Tail, precision: str, program: str):
    op = graph.ops[i]
    if len(op.inputs) != 2 or any(graph.const_value(t) is not None for t in op.inputs):
        raise Refused("the NPU combines two tensors element by element (constants fold into a convolution)")
    shapes = {tuple(graph.tensors[t].type.shape) for t in (*op.inputs, op.outputs[0])}
    if len(shapes) != 1:
        gate = channel_gate(graph, op)
        if gate is None:
            raise Refused("the NPU's element-wise operands have the output's shape (no broadcasting), or a "
                           "Mul of a map by a run-time [1, C, 1, 1] vector (fp16)")
        if precision != "fp16":
            raise Refused("a map times a run-time per-channel vector runs in fp16 (the vector as depthwise "
                           "weights)")
        if tail.ops:
            raise Refused("a channel gate's product takes no activation of its own")
        x, s = gate
        shape = graph.tensors[x].type.shape
        # x * s as a 1x1 depthwise convolution whose weights are s, which the host writes
        # as a native [C, 1, 1] map: byte for byte the 1x1 depthwise weight layout; it
        # treats every position alike, so a map of few rows is read as a taller grid
        view = position_view(shape, lambda r, w: r >= MIN_ROWS)
        conv = api.Conv2D(npu_feature(graph, x, "native", "fp16", precision, program, view),
                          np.zeros((1, 1, int(shape[1])), np.float16),
                          npu_feature(graph, op.outputs[0], "native", "fp16", precision, program, view), depthwise=True,
                          name=f"npu{i}", weights_buffer=_gate_buffer(graph, s, program))
        return conv, {x: "native", s: "native"}
    dtype = device_dtype(precision)
    layout = npu_layout(graph, tail.output)
    a, b = (npu_feature(graph, t, layout, dtype, precision, program) for t in op.inputs)
    ew = api.Elementwise(a, b, npu_feature(graph, tail.output, layout, dtype, precision, program),
                         lowering(op).function, name=f"npu{i}", activation=tail.activation, clip=tail.clip)
    return ew, {t: layout for t in op.inputs}


def _gate_buffer(graph: Graph, s: str, program: str) -> str:
    """The NPU buffer holding gate `s` as a native map: its own (its producer writes it so,
    `_gate_conv`), or the copy the host writes beside its GEMM row (`dense_name`)."""
    return npu_name(s, "fp16", program) if npu_layout(graph, s) == "native" else dense_name(s, "fp16", program)


def _pool(graph: Graph, i: int, tail: Tail, precision: str, program: str):
    op = graph.ops[i]
    x = graph.tensors[op.inputs[0]].type
    dtype = device_dtype(precision)
    view = None
    if vector_map(x.shape):
        raise Refused("pooling a 1x1 map is the identity")
    if vector_map(graph.tensors[op.outputs[0]].type.shape) and npu_layout(graph, op.outputs[0]) != "native-gemm":
        raise Refused("a pool's 1x1 result is written as a GEMM row, not as a channel gate's weights")
    if op.type == "GlobalAveragePool":
        # the mean of every position: any grid of them will do, so take one whose
        # window fits the kernel fields and gives a task its minimum rows
        view = position_view(x.shape, lambda r, w: MIN_ROWS <= r <= KERNEL_MAX and w <= KERNEL_MAX)
        rows, width = view or x.shape[2:]
        # the result is a GEMM row of 4 stored rows (vector_map): the window slides
        # 3 rows further into bottom padding, which makes those rows (never read)
        kernel, stride, padding = (int(rows), int(width)), (1, 1), (0, GEMM_ROW_ALIGN - 1, 0, 0)
        if rows < GEMM_ROW_ALIGN:
            raise Refused(f"a global pool over {x.shape[2]}x{x.shape[3]} positions has no grid of "
                           f"{GEMM_ROW_ALIGN}+ rows")
    else:
        kernel = tuple(int(k) for k in op.attrs["kernel_shape"])
        stride = tuple(int(s) for s in op.attrs.get("strides", [1, 1]))
        begin, end = pads_for(op.attrs.get("auto_pad", "NOTSET"), x.shape[2:], kernel, stride, [1, 1],
                              op.attrs.get("pads"))
        padding = (begin[0], end[0], begin[1], end[1])
        if op.attrs.get("ceil_mode", 0) and op.type == "MaxPool":
            # the last window overhangs the map: more bottom / right padding, at the minimum
            # (a ceil-mode average widens its own in compiler/npu/pool.py, where its counts are made)
            oh, ow = graph.tensors[op.outputs[0]].type.shape[2:]
            pt, pb, pl, pr = padding
            padding = (pt, max(pb, (oh - 1) * stride[0] + kernel[0] - x.shape[2] - pt),
                       pl, max(pr, (ow - 1) * stride[1] + kernel[1] - x.shape[3] - pl))
        if vector_map(graph.tensors[op.outputs[0]].type.shape):
            # one window (a 7x7 pool of a 7x7 map): the result is a GEMM row of 4 stored
            # rows, as a global pool's; the stride never applies, so the window slides
            # row by row 3 rows further into bottom padding, which makes those rows
            if op.attrs.get("ceil_mode", 0) or (any(padding) and not op.attrs.get("count_include_pad", 0)):
                raise Refused("one window over part of a map that excludes padding or overhangs it (ceil mode) "
                               "is not lowered")
            pt, pb, pl, pr = padding
            padding, stride = (pt, pb + GEMM_ROW_ALIGN - 1, pl, pr), (1, 1)
    pool = api.Pool(npu_feature(graph, op.inputs[0], "native", dtype, precision, program, view),
                    npu_feature(graph, op.outputs[0], npu_layout(graph, op.outputs[0]), dtype, precision, program),
                    lowering(op).function, kernel, stride, padding, name=f"npu{i}",
                    count_padding=op.type != "AveragePool" or bool(op.attrs.get("count_include_pad", 0)))
    return pool, {op.inputs[0]: "native"}


def _upsample(graph: Graph, i: int, tail: Tail, precision: str, program: str):
    op = graph.ops[i]
    dtype = device_dtype(precision)
    x = npu_feature(graph, op.inputs[0], "native", dtype, precision, program)
    y = npu_feature(graph, op.outputs[0], npu_layout(graph, op.outputs[0]), dtype, precision, program)
    up = api.Upsample(x, y, name=f"npu{i}", factor=y.height // x.height)
    return up, {op.inputs[0]: "native"}


# emitter operation an op's NpuLowering names -> the builder making it from the
# graph op; tests/npu/test_op_declarations.py checks every operation the OpSpecs
# name has one, and every builder serves some OpSpec
BUILDERS = {api.Conv2D: _conv, api.Gemm: _gemm, api.Elementwise: _eltwise, api.Activation: _activation,
            api.Pool: _pool, api.Upsample: _upsample, api.ConvTranspose2D: _conv_transpose,
            api.LocalResponseNorm: emitter_norm.build_lrn}
