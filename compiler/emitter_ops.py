"""NPU lowering: graph ops -> operations of the graph-free emitter API
(compiler/npu/api.py), and NPU segments -> one NPU program step each.

* `plan_groups` finds every op the NPU can run: an anchor (Conv, Gemm,
  MatMul) plus what folds into its DPU epilogue (a constant per-channel bias
  Add, a residual Add of a same-shaped tensor, ReLU / ReLU6 / Clip; an
  element-wise op takes a ReLU / Clip after it the same way), builds the
  emitter operation with symbolic buffers (one per tensor, "<tensor>@npu") and
  emits it once; the emitter's refusal is the reason the op stays on the CPU.
* `lower_segment` assembles the groups of one segment into one regcmd run
  (tails linked, consecutive single-job ops merged into one chained job) and
  records the program step. Tensor copies between host and NPU are made by
  compiler/program_steps.py at segment edges.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field, replace
from typing import Callable

import numpy as np

from rkc.compiler import cost, emitter_norm
from rkc.compiler.emitter_matmul import run_time_b_matmul
from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.formats import KERNEL_SIZE_MAX as KERNEL_MAX
from rkc.compiler.npu.assemble import assemble
from rkc.compiler.ops import OPS, NpuLowering
from rkc.compiler.quantize import MOVES_VALUES
from rkc.ir.errors import OptionError, UnsupportedError
from rkc.ir.graph import Graph
from rkc.ir.npu import geometry, hw
from rkc.ir.npu.layout import ATOM_BYTES
from rkc.ir.npu.geometry import GEMM_ROW_ALIGN, pads_for
from rkc.ir.npu.perf import PerfModel
from rkc.ir.program import Job, Step, TaskRef
from rkc.ir.types import DType, PerAxisQuant, PerTensorQuant

def lowering(op) -> NpuLowering | None:
    """How `op` reaches the NPU, as its OpSpec declares it (compiler/ops), or None."""
    spec = OPS.get(op.type)
    return spec.lower if spec is not None else None


def lut_function(op) -> str | None:
    """The DPU lookup-table function computing this ONNX op exactly as ONNX
    defines it (compiler/npu/lut.py), or None."""
    how = lowering(op)
    return how.activation(op) if how is not None and how.operation is api.Activation else None


def epilogue_activation(op) -> str | None:
    """The activation stage of a DPU epilogue computing `op` (ReLU, a lookup
    table), or None; Clip is read from its bound constants instead."""
    how = lowering(op)
    if how is None or how.operation not in (None, api.Activation) or how.function == "clip":
        return None
    return how.activation(op)


def _vector_map(shape) -> bool:
    """[1, C, 1, 1]: one value per channel (a global pool's result, a squeeze-excite
    branch). It is held as a GEMM row (ir/npu/geometry.py): a 1-row map is below the
    rows a task must read (Q2), the GEMM row's 4 stored rows are not."""
    return len(shape) == 4 and shape[0] == 1 and shape[2] == 1 and shape[3] == 1


def npu_layout(graph: Graph, tensor: str) -> str:
    """The layout an NPU group keeps `tensor` in. A [1, C, 1, 1] vector read only as a
    channel gate's run-time depthwise weights is a native map (its C values dense: the
    1x1 depthwise weight layout), which its producer writes as such (`_gate_conv`)."""
    shape = graph.tensors[tensor].type.shape
    if len(shape) == 4 and not _vector_map(shape):
        return "native"
    return "native" if _gate_only(graph, tensor) else "native-gemm"


def _gate_only(graph: Graph, tensor: str) -> bool:
    """`tensor` is a [1, C, 1, 1] vector whose every reader is a channel gate's Mul
    taking it as the vector (not a graph output)."""
    if not _vector_map(graph.tensors[tensor].type.shape) or tensor in graph.outputs:
        return False
    readers = [op for op in graph.ops if tensor in op.inputs]
    return bool(readers) and all((_channel_gate(graph, op) or (None, None))[1] == tensor for op in readers)


_layout = npu_layout
EMIT_OPTIONS = api.EmitOptions(allow_cpu_finish=False)  # K splits the NPU cannot sum stay on the CPU


def emit_options(cores: int, ppu_completes: bool = False) -> api.EmitOptions:
    """The compilers' emitter options for a program that uses `cores` NPU cores
    (`rkc compile --cores`): every task on lanes 0..cores-1; `ppu_completes`:
    the target kernel ends tasks on the PPU interrupt (`--kernel-ppu-irq`)."""
    if cores not in range(1, hw.CORES + 1):
        raise OptionError(f"--cores {cores}: the RK3588 NPU has cores 1 to {hw.CORES}")
    return replace(EMIT_OPTIONS, cores=cores, ppu_completes=ppu_completes)


# Whether a segment's jobs may run as hardware-chained kicks: integer tasks after
# the first of a chained kick are reported wrong on hardware (docs/hardware-questions.md
# Q1), so int8 segments kick every task on its own.
CHAINABLE = {"fp16": True, "int8": False, "int4": False}


def npu_name(tensor: str, dtype: str | None = None, precision: str | None = None) -> str:
    """The NPU copy of `tensor`: "<tensor>@npu" in the program's own dtype, with the
    dtype appended for the other one (an fp16 group of a mixed int8 program)."""
    base = f"{tensor}@npu"
    return base if dtype is None or dtype == device_dtype(precision or dtype) else f"{base}.{dtype}"


def dense_name(tensor: str, dtype: str | None = None, precision: str | None = None) -> str:
    """The NPU copy of a [1, C, 1, 1] tensor held as a native map (its channels dense:
    the 1x1 depthwise weight layout) beside the GEMM row its producer writes; the host
    writes it (compiler/program_steps.py)."""
    return f"{npu_name(tensor, dtype, precision)}.dense"


def weights_name(tensor: str, dtype: str | None = None, precision: str | None = None) -> str:
    """The NPU copy of a run-time GEMM B operand in the 1x1 weight layout
    ("native-weights"), which the host writes (compiler/program_steps.py)."""
    return f"{npu_name(tensor, dtype, precision)}.weights-layout"


def relaid_name(tensor: str, layout: str, dtype: str | None = None, precision: str | None = None) -> str:
    """The host-written NPU copy of `tensor` read in `layout`, not its producer's."""
    return (weights_name if layout == "native-weights" else dense_name)(tensor, dtype, precision)


def device_dtype(precision: str) -> str:
    return precision if precision in ("int8", "int4") else "fp16"


@dataclass
class NpuGroup:
    anchor: int
    ops: list[int]  # op indices: the anchor, then what its epilogue absorbed
    reads: dict[str, str]  # IR tensor -> NPU layout ("native" / "native-gemm") it is read in
    output: str
    output_layout: str
    result: api.EmitResult
    dtype: str  # what the group computes in: "int8" or "fp16" (mixed int8 programs have both)
    notes: list[str] = field(default_factory=list)
    # a tensor the group reads in another layout than its producer writes (a gate as
    # run-time depthwise weights): the host rewrites it, so the group starts a new segment
    relaid: tuple[str, ...] = ()

    @property
    def segment_kind(self) -> str:
        """Groups of one kind may share a segment (compiler/partition.py)."""
        return f"{self.dtype}, host-relaid reads" if self.relaid else self.dtype

    def npu_name(self, tensor: str, precision: str) -> str:
        """This group's NPU buffer of `tensor` in a program of `precision`."""
        return npu_name(tensor, self.dtype, precision)

    def read_name(self, tensor: str, precision: str) -> str:
        """The NPU buffer this group reads `tensor` from (its host-written copy where relaid)."""
        if tensor in self.relaid:
            return relaid_name(tensor, self.reads[tensor], self.dtype, precision)
        return self.npu_name(tensor, precision)


class _Refused(Exception):
    """This op cannot be lowered as asked (the message says why)."""


# -- reading the graph --------------------------------------------------------------------
def _act_quant(graph: Graph, name: str, precision: str) -> api.Quant | None:
    if precision != "int8":
        return None
    q = graph.tensors[name].type.quant
    if not isinstance(q, PerTensorQuant):
        raise _Refused(f"int8 needs a calibrated scale for {name!r} (give --calib)")
    return api.Quant(float(q.scale), int(q.zero_point))


def _weight_scales(graph: Graph, name: str, channels: int) -> np.ndarray:
    """One scale per output channel (a per-tensor scale repeated)."""
    q = graph.tensors[name].type.quant
    if isinstance(q, PerTensorQuant) and q.zero_point == 0:
        return np.full(channels, float(q.scale))
    if not isinstance(q, PerAxisQuant):
        raise _Refused(f"int8 weights {name!r} have no symmetric int8 scales")
    return graph.payloads[q.scale].astype(np.float64).reshape(-1)


def _weight_quant(scales: np.ndarray) -> api.Quant:
    """Per-channel scales; one scale when they are all equal (the per-tensor path)."""
    if np.all(scales == scales[0]):
        return api.Quant(float(scales[0]))
    return api.Quant(tuple(float(s) for s in scales))


def _feature(graph: Graph, tensor: str, layout: str, dtype: str, precision: str, program: str,
             view: tuple[int, int] | None = None) -> api.Feature:
    """The NPU feature of `tensor`; `view` = (rows, width) reads a native map's
    H*W positions as another grid of the same size (the same bytes: a surface holds
    the positions row-major), for ops that treat every position alike."""
    shape = graph.tensors[tensor].type.shape
    try:
        c, h, rows, w = geometry.feature_map(shape, layout)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    quant = _act_quant(graph, tensor, precision)
    name = npu_name(tensor, dtype, program)
    if layout == "native-gemm":
        return api.Feature.gemm(name, 0, h, c, dtype, quant)
    # a map of few rows lives in taller surfaces whose rows past h are zero: its
    # writers and position-wise readers address the h rows at that surface pitch
    surface = rows * w * ATOM_BYTES if rows > h else None
    if view is not None:
        assert view[0] * view[1] == h * w, (view, shape)
        h, w = view
    return api.Feature(name, 0, c, h, w, dtype, quant, surface_stride=surface, row_padded=surface is not None)


def _zero_padded_input(x: api.Feature, padding: tuple[int, int, int, int],
                       name: str) -> tuple[api.Feature, tuple[int, int, int, int]]:
    """A window over a map of few rows read as the 4 rows a task needs (Q2): the map
    with the zero rows stored below it, and the bottom padding smaller by as many rows
    (a zero row and a zero-padded row give the same sum, so the same output rows).
    Where the padding is smaller than the zero rows the task would compute more rows
    than the map has and write them into the output's zero rows: refused."""
    stored = x.surface_bytes // (x.width * ATOM_BYTES)
    top, bottom, left, right = padding
    extra = stored - x.height
    if x.quant is not None and x.quant.zero_point != 0:
        raise _Refused(f"{name}: the input has {x.height} rows; its zero rows, read as the {stored} rows a task "
                       f"needs (Q2), are not the int8 padding (zero point {x.quant.zero_point})")
    if bottom < extra:
        raise _Refused(f"{name}: the input has {x.height} rows and a bottom padding of {bottom}; read as the "
                       f"{stored} rows a task needs (Q2) it would give more output rows than the map")
    return replace(x, height=stored, surface_stride=None, row_padded=False), (top, bottom - extra, left, right)


def _position_view(shape, fits: Callable[[int, int], bool]) -> tuple[int, int] | None:
    """(rows, width) for the H*W positions of a [1, C, H, W] map: H x W itself
    when it `fits`, else the first grid of the same size (fewest rows first) that does."""
    h, w = int(shape[2]), int(shape[3])
    if fits(h, w):
        return None
    n = h * w
    return next(((r, n // r) for r in range(1, n + 1) if n % r == 0 and fits(r, n // r)), None)


MIN_ROWS = EMIT_OPTIONS.min_input_rows  # every convolution task reads this many input rows (Q2)


# -- epilogue fusion ------------------------------------------------------------------------
@dataclass
class _Tail:
    ops: list[int] = field(default_factory=list)
    bias: np.ndarray | None = None  # float, per output channel
    residual: str | None = None
    activation: str | None = None
    clip: tuple[float, float] | None = None
    slope: float | None = None  # LeakyReLU's
    output: str = ""


def _per_channel(value: np.ndarray, channels: int, rank: int, gemm: bool) -> np.ndarray | None:
    """A constant that adds one value per output channel, as a [channels] vector."""
    full = [1] * rank
    full[-1 if gemm else 1] = channels
    try:
        b = np.broadcast_to(value, full) if value.ndim <= rank else None
    except ValueError:
        return None
    if b is None or np.broadcast_shapes(value.shape, tuple(full)) != tuple(full):
        return None
    return np.ascontiguousarray(b).reshape(-1).astype(np.float64)


def _ready_before(graph: Graph, tensor: str, index: int) -> bool:
    """`tensor` exists before op `index` runs (a model input or an earlier op's output):
    a residual operand the anchor's group reads. One a later op makes stays an Add of
    its own, or fuses into that op's group (the Add commutes)."""
    for j, op in enumerate(graph.ops):
        if tensor in op.outputs:
            return j < index
    return True


def _tails(graph: Graph, anchor: int, users: dict[str, list[int]], candidate: Callable[[int], bool],
           channels: int, gemm: bool) -> list[_Tail]:
    """The epilogues the anchor could absorb, longest first (each a prefix of the
    next longer): when the emitter refuses one (an int8 path has no lookup-table
    activation), a shorter one still fuses what it can."""
    prefixes = [_Tail(output=graph.ops[anchor].outputs[0])]
    while True:
        tail = replace(prefixes[-1], ops=list(prefixes[-1].ops))
        out = tail.output
        nxt = users.get(out, [])
        if len(nxt) != 1 or out in graph.outputs or not candidate(nxt[0]):
            return prefixes[::-1]
        j = nxt[0]
        op = graph.ops[j]
        rank = len(graph.tensors[out].type.shape)
        if op.type == "Add" and tail.activation is None and tail.residual is None and len(op.inputs) == 2:
            other = op.inputs[1] if op.inputs[0] == out else op.inputs[0]
            value = graph.const_value(other)
            if value is not None and tail.bias is None:
                vec = _per_channel(value, channels, rank, gemm)
                if vec is None:
                    return prefixes[::-1]
                tail.bias = vec
            elif value is None and graph.tensors[other].type.shape == graph.tensors[out].type.shape \
                    and other != out and _ready_before(graph, other, anchor):
                tail.residual = other
            else:
                return prefixes[::-1]
        elif epilogue_activation(op) is not None and tail.activation is None:
            tail.activation = epilogue_activation(op)
            if tail.activation == "leaky_relu":
                tail.slope = float(op.attrs.get("alpha", 0.01))
        elif op.type == "Clip" and tail.activation is None:
            lo, hi = graph.const_value(op.inputs[1]) if len(op.inputs) > 1 else None, \
                graph.const_value(op.inputs[2]) if len(op.inputs) > 2 else None
            if (len(op.inputs) > 1 and op.inputs[1] and lo is None) or (len(op.inputs) > 2 and op.inputs[2] and hi is None):
                return prefixes[::-1]
            if any(v is not None and np.size(v) != 1 for v in (lo, hi)):
                return prefixes[::-1]
            lo_v = float(np.reshape(lo, -1)[0]) if lo is not None else float("-inf")
            hi_v = float(np.reshape(hi, -1)[0]) if hi is not None else float("inf")
            tail.activation, tail.clip = ("relu6", None) if (lo_v, hi_v) == (0.0, 6.0) else ("clip", (lo_v, hi_v))
        else:
            return prefixes[::-1]
        tail.ops.append(j)
        tail.output = op.outputs[0]
        prefixes.append(tail)


def _epilogue(graph: Graph, tail: _Tail, bias: np.ndarray | None, dtype: str, precision: str, program: str,
              layout: str, in_scale: float, w_scales: np.ndarray | None,
              view: tuple[int, int] | None = None) -> api.Epilogue:
    if bias is not None and dtype == "int8":
        bias = np.rint(bias / (in_scale * w_scales)).astype(np.int64)
        if np.abs(bias).max(initial=0) >= 2 ** 31:
            raise _Refused("the int8 bias does not fit 32 bits at these scales")
        bias = bias.astype(np.int32)
    elif bias is not None:
        bias = bias.astype(np.float32)
    residual = None
    if tail.residual is not None:
        residual = api.Residual(_feature(graph, tail.residual, layout, dtype, precision, program, view), "add")
    return api.Epilogue(bias=bias, activation=tail.activation, clip=tail.clip, residual=residual, slope=tail.slope)


# -- anchors -------------------------------------------------------------------------------------
def _conv(graph: Graph, i: int, tail: _Tail, precision: str, program: str) -> tuple[api.Conv2D, dict[str, str]]:
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
        w_scales = _weight_scales(graph, op.inputs[1], w.shape[0])
        wq = np.clip(np.rint(w / w_scales.reshape(-1, 1, 1, 1)), -128, 127).astype(np.int8)
        weight_quant = _weight_quant(w_scales)
    else:
        wq, weight_quant = w.astype(np.float16), None
    weights = wq[:, 0].transpose(1, 2, 0) if depthwise else wq.transpose(0, 2, 3, 1)
    if bias is not None:
        bias = bias.astype(np.float64)
        if tail.bias is not None:
            bias = bias + tail.bias
    else:
        bias = tail.bias
    in_scale = _act_quant(graph, op.inputs[0], precision).scale if dtype == "int8" else 1.0
    pointwise = kernel == [1, 1] and strides == [1, 1] and not any(begin) and not any(end)
    layout = _layout(graph, op.inputs[0])
    view = None
    if layout == "native-gemm":
        if not pointwise:
            raise _Refused("a convolution with a window over a 1x1 map (padding only) is not lowered")
        if _layout(graph, tail.output) == "native":
            return _gate_conv(graph, op, tail, weights, depthwise, bias, weight_quant, in_scale, w_scales, precision,
                              program, i)
        if not depthwise:  # [1, C] x [C, O]: the GEMM it is
            epi = _epilogue(graph, tail, bias, dtype, precision, program, layout, in_scale, w_scales)
            gemm = api.Gemm(_feature(graph, op.inputs[0], layout, dtype, precision, program),
                            np.ascontiguousarray(weights[:, 0, 0, :].T),
                            _feature(graph, tail.output, layout, dtype, precision, program), 1,
                            b_quant=weight_quant, epilogue=epi, name=f"npu{i}")
            return gemm, {t: layout for t in (op.inputs[0], tail.residual) if t}
    elif pointwise:
        # a pointwise convolution treats every position alike: a map of fewer rows
        # than a task must read is read as a taller grid of the same positions
        view = _position_view(x.shape, lambda r, w: r >= MIN_ROWS)
    epi = _epilogue(graph, tail, bias, dtype, precision, program, layout, in_scale, w_scales, view)
    src = _feature(graph, op.inputs[0], layout, dtype, precision, program, view)
    padding = (begin[0], end[0], begin[1], end[1])
    if view is None and src.row_padded:
        src, padding = _zero_padded_input(src, padding, f"npu{i}")
    conv = api.Conv2D(src, np.ascontiguousarray(weights),
                      _feature(graph, tail.output, layout, dtype, precision, program, view),
                      stride=(strides[0], strides[1]),
                      padding=padding, depthwise=depthwise,
                      weight_quant=weight_quant, epilogue=epi, name=f"npu{i}")
    return conv, {t: layout for t in (op.inputs[0], tail.residual) if t}


def _gate_conv(graph: Graph, op, tail: _Tail, weights, depthwise: bool, bias, weight_quant, in_scale, w_scales,
               precision: str, program: str, i: int) -> tuple[api.Conv2D, dict[str, str]]:
    """A 1x1 convolution of a [1, C, 1, 1] vector whose result is a channel gate (the
    excite convolution of a squeeze-excite block, or the hard-sigmoid's scale after it):
    the input's GEMM row is a native map of 4 rows and one column (api.Feature.gemm),
    which a 1x1 convolution at row stride 4 reads row 0 of, writing the one-position
    native map the gate's product reads as its depthwise weights. The gate never leaves
    the NPU."""
    dtype = device_dtype(precision)
    src = _feature(graph, op.inputs[0], "native-gemm", dtype, precision, program)
    if tail.residual is not None:
        raise _Refused("a residual Add is not fused into a channel gate's convolution")
    epi = _epilogue(graph, tail, bias, dtype, precision, program, "native", in_scale, w_scales)
    gate = _feature(graph, tail.output, "native", dtype, precision, program)
    conv = api.Conv2D(src, np.ascontiguousarray(weights), gate, stride=(src.height, 1), depthwise=depthwise,
                      weight_quant=weight_quant, epilogue=epi, name=f"npu{i}")
    return conv, {op.inputs[0]: "native-gemm"}


def _conv_transpose(graph: Graph, i: int, tail: _Tail, precision: str, program: str):
    op = graph.ops[i]
    dtype = device_dtype(precision)
    w = graph.const_value(op.inputs[1])  # [I, O, k, k]
    bias = graph.const_value(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] else None
    bias = tail.bias if bias is None else bias.astype(np.float64) + (0 if tail.bias is None else tail.bias)
    if tail.residual is not None:
        raise _Refused("a residual Add is not fused into a transposed convolution")
    w_scales = None
    if dtype == "int8":
        q = graph.tensors[op.inputs[1]].type.quant
        if isinstance(q, PerAxisQuant) and q.axis != 1:
            raise _Refused(f"int8 ConvTranspose weights {op.inputs[1]!r} are scaled along axis {q.axis}, "
                           "not per output channel (axis 1)")
        w_scales = _weight_scales(graph, op.inputs[1], w.shape[1])
        wq = np.clip(np.rint(w / w_scales.reshape(1, -1, 1, 1)), -128, 127).astype(np.int8)
        weight_quant = _weight_quant(w_scales)
    else:
        wq, weight_quant = w.astype(np.float16), None
    in_scale = _act_quant(graph, op.inputs[0], precision).scale if dtype == "int8" else 1.0
    epi = _epilogue(graph, tail, bias, dtype, precision, program, "native", in_scale, w_scales)
    ct = api.ConvTranspose2D(_feature(graph, op.inputs[0], "native", dtype, precision, program),
                             np.ascontiguousarray(wq.transpose(1, 2, 3, 0)),
                             _feature(graph, tail.output, "native", dtype, precision, program),
                             weight_quant, epi, name=f"npu{i}")
    return ct, {op.inputs[0]: "native"}


def _gemm(graph: Graph, i: int, tail: _Tail, precision: str, program: str) -> tuple[api.Gemm, dict[str, str]]:
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
            vec = None if c is None else _per_channel(c, b.shape[1], 2, True)
            if vec is None:
                raise _Refused("Gemm's C must be a constant per-column bias")
            bias = vec * float(op.attrs.get("beta", 1.0))
    if tail.bias is not None:
        bias = tail.bias if bias is None else bias + tail.bias
    w_scales = None
    if dtype == "int8":
        w_scales = _weight_scales(graph, op.inputs[1], b.shape[1])
        bq = np.clip(np.rint(b / w_scales.reshape(1, -1)), -128, 127).astype(np.int8)
        b_quant = _weight_quant(w_scales)
    else:
        bq, b_quant = b.astype(np.float16), None
    m = int(a_shape[-2])
    in_scale = _act_quant(graph, op.inputs[0], precision).scale if dtype == "int8" else 1.0
    epi = _epilogue(graph, tail, bias, dtype, precision, program, "native-gemm", in_scale, w_scales)
    gemm = api.Gemm(_feature(graph, op.inputs[0], "native-gemm", dtype, precision, program), np.ascontiguousarray(bq),
                    _feature(graph, tail.output, "native-gemm", dtype, precision, program), m, b_quant=b_quant,
                    epilogue=epi, name=f"npu{i}")
    reads = {op.inputs[0]: "native-gemm"}
    if tail.residual:
        reads[tail.residual] = "native-gemm"
    return gemm, reads


def _activation(graph: Graph, i: int, tail: _Tail, precision: str, program: str):
    op = graph.ops[i]
    function = lut_function(op)
    if function is None:
        raise _Refused(f"{op.type} with these attributes has no DPU lookup table")
    if precision != "fp16":
        raise _Refused("standalone lookup-table activations run in fp16")
    layout = _layout(graph, op.inputs[0])
    if _layout(graph, op.outputs[0]) != layout:
        raise _Refused("a lookup-table activation keeps its input's layout (its result is a channel gate)")
    act = api.Activation(_feature(graph, op.inputs[0], layout, "fp16", precision, program),
                         _feature(graph, op.outputs[0], layout, "fp16", precision, program), function, name=f"npu{i}")
    return act, {op.inputs[0]: layout}


def _eltwise(graph: Graph, i: int, tail: _Tail, precision: str, program: str):
    op = graph.ops[i]
    if len(op.inputs) != 2 or any(graph.const_value(t) is not None for t in op.inputs):
        raise _Refused("the NPU combines two tensors element by element (constants fold into a convolution)")
    shapes = {tuple(graph.tensors[t].type.shape) for t in (*op.inputs, op.outputs[0])}
    if len(shapes) != 1:
        gate = _channel_gate(graph, op)
        if gate is None:
            raise _Refused("the NPU's element-wise operands have the output's shape (no broadcasting), or a "
                           "Mul of a map by a run-time [1, C, 1, 1] vector (fp16)")
        if precision != "fp16":
            raise _Refused("a map times a run-time per-channel vector runs in fp16 (the vector as depthwise "
                           "weights)")
        if tail.ops:
            raise _Refused("a channel gate's product takes no activation of its own")
        x, s = gate
        shape = graph.tensors[x].type.shape
        # x * s as a 1x1 depthwise convolution whose weights are s, which the host writes
        # as a native [C, 1, 1] map: byte for byte the 1x1 depthwise weight layout; it
        # treats every position alike, so a map of few rows is read as a taller grid
        view = _position_view(shape, lambda r, w: r >= MIN_ROWS)
        conv = api.Conv2D(_feature(graph, x, "native", "fp16", precision, program, view),
                          np.zeros((1, 1, int(shape[1])), np.float16),
                          _feature(graph, op.outputs[0], "native", "fp16", precision, program, view), depthwise=True,
                          name=f"npu{i}", weights_buffer=_gate_buffer(graph, s, program))
        return conv, {x: "native", s: "native"}
    dtype = device_dtype(precision)
    layout = _layout(graph, tail.output)
    a, b = (_feature(graph, t, layout, dtype, precision, program) for t in op.inputs)
    ew = api.Elementwise(a, b, _feature(graph, tail.output, layout, dtype, precision, program),
                         lowering(op).function, name=f"npu{i}", activation=tail.activation, clip=tail.clip)
    return ew, {t: layout for t in op.inputs}


def _gate_buffer(graph: Graph, s: str, program: str) -> str:
    """The NPU buffer holding gate `s` as a native map: its own (its producer writes it so,
    `_gate_conv`), or the copy the host writes beside its GEMM row (`dense_name`)."""
    return npu_name(s, "fp16", program) if _layout(graph, s) == "native" else dense_name(s, "fp16", program)


def _channel_gate(graph: Graph, op) -> tuple[str, str] | None:
    """(map, vector) of a Mul of a [1, C, H, W] map by a run-time [1, C, 1, 1] vector
    (a squeeze-excite gate) whose product has the map's shape, else None."""
    if op.type != "Mul":
        return None
    out = tuple(graph.tensors[op.outputs[0]].type.shape)
    for x, s in (op.inputs, op.inputs[::-1]):
        xs, ss = tuple(graph.tensors[x].type.shape), tuple(graph.tensors[s].type.shape)
        if xs == out and len(xs) == 4 and xs[0] == 1 and _vector_map(ss) and ss[1] == xs[1] \
                and npu_layout(graph, x) == "native":
            return x, s
    return None


def _pool(graph: Graph, i: int, tail: _Tail, precision: str, program: str):
    op = graph.ops[i]
    x = graph.tensors[op.inputs[0]].type
    dtype = device_dtype(precision)
    view = None
    if _vector_map(x.shape):
        raise _Refused("pooling a 1x1 map is the identity")
    if _vector_map(graph.tensors[op.outputs[0]].type.shape) and _layout(graph, op.outputs[0]) != "native-gemm":
        raise _Refused("a pool's 1x1 result is written as a GEMM row, not as a channel gate's weights")
    if op.type == "GlobalAveragePool":
        # the mean of every position: any grid of them will do, so take one whose
        # window fits the kernel fields and gives a task its minimum rows
        view = _position_view(x.shape, lambda r, w: MIN_ROWS <= r <= KERNEL_MAX and w <= KERNEL_MAX)
        rows, width = view or x.shape[2:]
        # the result is a GEMM row of 4 stored rows (_vector_map): the window slides
        # 3 rows further into bottom padding, which makes those rows (never read)
        kernel, stride, padding = (int(rows), int(width)), (1, 1), (0, GEMM_ROW_ALIGN - 1, 0, 0)
        if rows < GEMM_ROW_ALIGN:
            raise _Refused(f"a global pool over {x.shape[2]}x{x.shape[3]} positions has no grid of "
                           f"{GEMM_ROW_ALIGN}+ rows")
    else:
        kernel = tuple(int(k) for k in op.attrs["kernel_shape"])
        stride = tuple(int(s) for s in op.attrs.get("strides", [1, 1]))
        begin, end = pads_for(op.attrs.get("auto_pad", "NOTSET"), x.shape[2:], kernel, stride, [1, 1],
                              op.attrs.get("pads"))
        padding = (begin[0], end[0], begin[1], end[1])
        if op.type == "AveragePool" and any(padding) and not op.attrs.get("count_include_pad", 0):
            raise _Refused("the NPU's average divides by the whole window; padded windows that exclude the "
                           "padding from the count stay on the CPU")
        if op.attrs.get("ceil_mode", 0):
            raise _Refused("ceil_mode pooling is not lowered")
        if _vector_map(graph.tensors[op.outputs[0]].type.shape):
            # one window (a 7x7 pool of a 7x7 map): the result is a GEMM row of 4 stored
            # rows, as a global pool's; the stride never applies, so the window slides
            # row by row 3 rows further into bottom padding, which makes those rows
            pt, pb, pl, pr = padding
            padding, stride = (pt, pb + GEMM_ROW_ALIGN - 1, pl, pr), (1, 1)
    pool = api.Pool(_feature(graph, op.inputs[0], "native", dtype, precision, program, view),
                    _feature(graph, op.outputs[0], _layout(graph, op.outputs[0]), dtype, precision, program),
                    lowering(op).function, kernel, stride, padding, name=f"npu{i}")
    return pool, {op.inputs[0]: "native"}


def _upsample(graph: Graph, i: int, tail: _Tail, precision: str, program: str):
    op = graph.ops[i]
    dtype = device_dtype(precision)
    x = _feature(graph, op.inputs[0], "native", dtype, precision, program)
    y = _feature(graph, op.outputs[0], _layout(graph, op.outputs[0]), dtype, precision, program)
    up = api.Upsample(x, y, name=f"npu{i}", factor=y.height // x.height)
    return up, {op.inputs[0]: "native"}


# emitter operation an op's NpuLowering names -> the builder making it from the
# graph op; tests/npu/test_op_declarations.py checks every operation the OpSpecs
# name has one, and every builder serves some OpSpec
BUILDERS = {api.Conv2D: _conv, api.Gemm: _gemm, api.Elementwise: _eltwise, api.Activation: _activation,
            api.Pool: _pool, api.Upsample: _upsample, api.ConvTranspose2D: _conv_transpose,
            api.LocalResponseNorm: emitter_norm.build_lrn}


def _emit(graph: Graph, i: int, tail: _Tail, precision: str, program: str,
          options: api.EmitOptions) -> NpuGroup:
    op = graph.ops[i]
    operation = lowering(op).operation
    api_op, reads = BUILDERS[operation](graph, i, tail, precision, program)
    if isinstance(api_op, api.Pool) and api_op.method == "avg":
        # averages stay depthwise convolutions (the DPU divides exactly) even where the PPU completes
        options = replace(options, ppu_completes=False)
    result = emit(api_op, options)
    if result.cpu:
        raise _Refused("the emitter needs a CPU finishing step")
    layout = "native-gemm" if operation is api.Gemm else _layout(graph, tail.output)
    relaid = tuple(t for t, how in reads.items() if how != _layout(graph, t))
    return NpuGroup(i, [i, *tail.ops], reads, tail.output, layout, result, device_dtype(precision),
                    list(result.notes), relaid)


def _ew_activation(op) -> bool:
    """ReLU or Clip: what the EW stage applies after an element-wise op."""
    return epilogue_activation(op) == "relu" or op.type == "Clip"


def _passes_values(op) -> bool:
    """A CPU op that hands its input's values on (Concat, Split, MaxPool, Resize...)."""
    return op.type in ("Concat", "Split", "MaxPool", "Resize", "Reshape", "Flatten", "Identity")


def _has_lut(graph: Graph, tail: _Tail) -> bool:
    return any(lut_function(graph.ops[j]) is not None for j in tail.ops)


def plan_groups(graph: Graph, precision: str, candidate: Callable[[int], bool],
                fp16_anchors: frozenset[int] | set[int] = frozenset(), options: api.EmitOptions = EMIT_OPTIONS
                ) -> tuple[dict[int, NpuGroup], dict[int, str]]:
    """Groups keyed by every op they cover; reasons for candidates left on the CPU.
    In an int8 program, groups anchored at `fp16_anchors` compute in fp16."""
    users: dict[str, list[int]] = {}
    for j, op in enumerate(graph.ops):
        for name in op.present_inputs():
            users.setdefault(name, []).append(j)
    groups: dict[int, NpuGroup] = {}
    reasons: dict[int, str] = {}
    table_fp16: set[str] = set()  # outputs of int8-program groups in fp16 for a lookup table
    # maps an int8 program holds in fp16 anyway: fp16 groups' outputs, what fp16 anchors read
    fp16_maps: set[str] = {t for a in fp16_anchors for t in graph.ops[a].present_inputs()}
    for i, op in enumerate(graph.ops):
        if _passes_values(op) and any(t in table_fp16 for t in op.present_inputs()):
            table_fp16.update(op.outputs)
        if op.type in MOVES_VALUES and all(t in fp16_maps for t in op.present_inputs()):
            fp16_maps.update(op.outputs)  # slices of one fp16 buffer
        how = lowering(op)
        if how is None or not how.anchors or not candidate(i) or i in groups:
            continue
        if how.operation in (api.Conv2D, api.Gemm, api.ConvTranspose2D):  # the anchors with an epilogue of their own
            gemm = how.operation is api.Gemm
            w = graph.const_value(op.inputs[1])
            if w is None:  # a run-time B (compiler/emitter_matmul.py): only its shape matters here
                w = np.broadcast_to(np.float16(0), graph.tensors[op.inputs[1]].type.shape)
            channels = (w.shape[0] if op.type == "Conv" else w.shape[1] if op.type == "ConvTranspose" else
                        (w.shape[0] if op.type == "Gemm" and op.attrs.get("transB") else w.shape[-1]))
            tails = _tails(graph, i, users, lambda j: candidate(j) and j not in groups, channels, gemm)
        elif how.operation is api.Elementwise:
            # the EW stage's ReLU / ReLU-X after the combination (a residual block's ReLU
            # when its Add fuses into neither convolution)
            tails = _tails(graph, i, users, lambda j: candidate(j) and j not in groups and _ew_activation(graph.ops[j]),
                           0, False)
        else:
            tails = [_Tail(output=op.outputs[0])]  # no epilogue of its own
        # a group meant for fp16 the emitter cannot build in fp16 stays in the program's dtype
        tries = [(own, tail) for own in dict.fromkeys(("fp16" if i in fp16_anchors else precision, precision))
                 for tail in tails]
        lut_side = precision == "int8" and (_has_lut(graph, tails[0]) or how.operation is api.LocalResponseNorm or
                                            any(t in table_fp16 for t in op.present_inputs()))
        if lut_side:
            # the lookup table is documented on fp16 data only (dpu-lut-activation.md; int8 is
            # hardware question Q22): an int8 group whose epilogue needs one computes in fp16,
            # rather than leave the activation to the CPU; a group reading such a group's
            # output stays in fp16 rather than convert it on the CPU (a tensor a concatenation,
            # split or pool passes on counts as its source's)
            tries.insert(0, ("fp16", tails[0]))
        elif precision == "int8" and op.type == "MatMul" and graph.const_value(op.inputs[1]) is None:
            tries.insert(0, ("fp16", tails[0]))  # a run-time B is multiplied in fp16 only
        elif precision == "int8" and op.type == "MaxPool" and op.inputs[0] in fp16_maps:
            # the PPU pools fp16 only (Q14): a max pool of a map held in fp16 anyway (an
            # fp16 group makes it or reads it) pools that copy rather than run on the CPU
            tries.insert(0, ("fp16", tails[0]))
        for own, tail in tries:
            try:
                group = _emit(graph, i, tail, own, precision, options)
            except _Refused as exc:
                reasons[i] = str(exc)
                continue
            except UnsupportedError as exc:
                reasons[i] = f"the emitter refuses it: {exc}"
                continue
            for j in group.ops:
                groups[j] = group
            reasons.pop(i, None)
            if lut_side and group.dtype == "fp16":
                table_fp16.add(group.output)
            if precision == "int8" and group.dtype == "fp16":
                fp16_maps.add(group.output)
            break
    return groups, reasons


# -- segments -> program steps ----------------------------------------------------------------
BUSY = PerfModel(kick_overhead_s=0.0)  # a layer's modelled cycles: its tasks on their cores, kicks apart


@dataclass
class SegmentLowering:
    """What compiler/program_steps.py needs back from one segment."""

    step: Step
    scratch: list[tuple[str, int]]  # emitter scratch buffers (name, bytes) live during the step
    extents: dict[str, int]  # symbolic buffer -> bytes the tasks touch
    zero_rows: list[str] = field(default_factory=list)  # maps a window reads over their zero rows


def lower_segment(graph: Graph, groups: list[NpuGroup], builder, name: str, precision: str,
                  independent: bool = False) -> SegmentLowering:
    """`independent`: no group reads what another writes (an LLM segment's
    products): each core's tasks become one job (compiler/npu/assemble.py)."""
    results = [g.result for g in groups]
    asm = assemble(results, region="regcmd", align=64, merge_jobs=True, independent=independent)
    base = builder.add_regcmd(asm.entries)
    for r in results:
        for c in r.constants:
            builder.weight(c.name, c.data, [len(c.data)], DType.UINT8, "packed")
    for rel in asm.relocations:
        if rel.target == asm.region:
            builder.relocate(base + rel.entry, "regcmd", rel.offset + base * 8)
        else:
            builder.relocate(base + rel.entry, rel.target, rel.offset)
    planned = {ref.entry: r.tasks[t] for r, refs in zip(results, asm.task_refs) for t, ref in enumerate(refs)}
    task_costs = [[list(astuple(planned[t.entry].cost())) for t in job.tasks] for job in asm.jobs]
    scratch = [(s.name, s.size) for r in results for s in r.scratch]
    # an emitter's own scratch is placed with the step (ModuleBuilder.append_segment)
    emitter_scratch = {n for n, _ in scratch}

    def region(buffer: str) -> str:
        return "scratch" if buffer in emitter_scratch else builder.region_of(buffer)

    jobs = []
    for job in asm.jobs:
        tasks = [TaskRef("regcmd", base + t.entry, t.count) for t in job.tasks]
        jobs.append(Job(tasks, sorted({region(b) for b in job.reads}), sorted({region(b) for b in job.writes}),
                        job.lane))
    layers = []
    for g in groups:
        counters = g.result.counters
        op = graph.ops[g.anchor]
        layers.append({
            "name": op.name or f"{op.type}:{op.outputs[0]}",
            "op": "+".join(graph.ops[j].type for j in g.ops),
            "macs": int(counters.macs) or cost.op_macs(graph, op),
            "ddr_bytes": sum(t.cost().dma_bytes for t in g.result.tasks),  # regcmd fetches included
            # of those, written by the DPU (the rest is read: features, weights, regcmd)
            "ddr_written": sum(sum(t.counters.dma_write.values()) for t in g.result.tasks),
            "cycles": round(BUSY.submission_seconds(g.result.cost_jobs(chained=True)) * BUSY.clock_hz),
            "dtype": g.dtype,
            "tasks": len(g.result.tasks),
            "notes": g.notes,
        })
    extents: dict[str, int] = {}
    for r in results:
        for buf, end in r.extents().items():
            extents[buf] = max(extents.get(buf, 0), end)
    reads = sorted({g.read_name(t, precision) for g in groups for t in g.reads})
    outputs = sorted({g.npu_name(g.output, precision) for g in groups})
    chained = all(CHAINABLE[g.dtype] for g in groups)
    step = Step(kind="npu", name=name, jobs=jobs, chained=chained, inputs=reads, outputs=outputs,
                stats={"layers": layers, "task_costs": task_costs, "tasks": sum(len(j.tasks) for j in jobs),
                       "kicks_stock": sum(len(j.tasks) for j in jobs),
                       "kicks_chained": len(jobs) if chained else sum(len(j.tasks) for j in jobs)})
    return SegmentLowering(step, scratch, extents, _zero_rows_read(results, builder))


def _zero_rows_read(results: list[api.EmitResult], builder) -> list[str]:
    """The maps of few rows some convolution of the segment reads with the zero rows
    stored below them (`_zero_padded_input`): the memory plan must keep those rows zero."""
    kept = set()
    for r in results:
        x = r.op.input if isinstance(r.op, api.Conv2D) else None
        info = builder.tensors.get(x.buffer) if x is not None else None
        # read over its zero rows: the whole stored map (a taller grid of its positions, a
        # view, is row_padded and reads only them)
        if info is not None and geometry.zero_rows(info.shape, info.layout) and not x.row_padded \
                and x.height > info.shape[2]:
            kept.add(x.buffer)
    return sorted(kept)
