"""What NPU lowering reads of the graph (compiler/emitter_ops.py plans the groups,
compiler/emitter_builders.py builds their emitter operations): how an op reaches
the NPU, the layout and buffer name of each tensor's NPU copy, the emitter
features and quantization of tensors, and the DPU epilogue an anchor absorbs
(bias, residual, activation). `Refused` is a builder's reason an op stays on
the CPU."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from rkc.compiler.npu import api
from rkc.compiler.ops import OPS, NpuLowering
from rkc.ir.errors import OptionError
from rkc.ir.graph import Graph
from rkc.ir.npu import geometry, hw
from rkc.ir.npu.layout import ATOM_BYTES
from rkc.ir.types import PerAxisQuant, PerTensorQuant


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


def vector_map(shape) -> bool:
    """[1, C, 1, 1]: one value per channel (a global pool's result, a squeeze-excite
    branch). It is held as a GEMM row (ir/npu/geometry.py): a 1-row map is below the
    rows a task must read (Q2), the GEMM row's 4 stored rows are not."""
    return len(shape) == 4 and shape[0] == 1 and shape[2] == 1 and shape[3] == 1


def npu_layout(graph: Graph, tensor: str) -> str:
    """The layout an NPU group keeps `tensor` in. A [1, C, 1, 1] vector read only as a
    channel gate's run-time depthwise weights is a native map (its C values dense: the
    1x1 depthwise weight layout), which its producer writes as such (`_gate_conv`)."""
    shape = graph.tensors[tensor].type.shape
    if len(shape) == 4 and not vector_map(shape):
        return "native"
    return "native" if gate_only(graph, tensor) else "native-gemm"


def gate_only(graph: Graph, tensor: str) -> bool:
    """`tensor` is a [1, C, 1, 1] vector whose every reader is a channel gate's Mul
    taking it as the vector (not a graph output)."""
    if not vector_map(graph.tensors[tensor].type.shape) or tensor in graph.outputs:
        return False
    readers = [op for op in graph.ops if tensor in op.inputs]
    return bool(readers) and all((channel_gate(graph, op) or (None, None))[1] == tensor for op in readers)


EMIT_OPTIONS = api.EmitOptions(allow_cpu_finish=False)  # K splits the NPU cannot sum stay on the CPU


def emit_options(cores: int, ppu_completes: bool = False) -> api.EmitOptions:
    """The compilers' emitter options for a program that uses `cores` NPU cores
    (`rkc compile --cores`): every task on lanes 0..cores-1; `ppu_completes`:
    the target kernel ends tasks on the PPU interrupt (`--kernel-ppu-irq`)."""
    if cores not in range(1, hw.CORES + 1):
        raise OptionError(f"--cores {cores}: the RK3588 NPU has cores 1 to {hw.CORES}")
    return replace(EMIT_OPTIONS, cores=cores, ppu_completes=ppu_completes)


# Whether a segment's jobs may run as hardware-chained kicks (api.CHAINED_DTYPES, Q1):
# int8 segments kick every task on its own.
CHAINABLE = {d: d in api.CHAINED_DTYPES for d in ("fp16", "int8", "int4")}


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


class Refused(Exception):
    """This op cannot be lowered as asked (the message says why)."""


# -- reading the graph --------------------------------------------------------------------
def act_quant(graph: Graph, name: str, precision: str) -> api.Quant | None:
    if precision != "int8":
        return None
    q = graph.tensors[name].type.quant
    if not isinstance(q, PerTensorQuant):
        raise Refused(f"int8 needs a calibrated scale for {name!r} (give --calib)")
    return api.Quant(float(q.scale), int(q.zero_point))


def weight_scales(graph: Graph, name: str, channels: int) -> np.ndarray:
    """One scale per output channel (a per-tensor scale repeated)."""
    q = graph.tensors[name].type.quant
    if isinstance(q, PerTensorQuant) and q.zero_point == 0:
        return np.full(channels, float(q.scale))
    if not isinstance(q, PerAxisQuant):
        raise Refused(f"int8 weights {name!r} have no symmetric int8 scales")
    return graph.payloads[q.scale].astype(np.float64).reshape(-1)


def per_channel_quant(scales: np.ndarray) -> api.Quant:
    """Per-channel scales; one scale when they are all equal (the per-tensor path)."""
    if np.all(scales == scales[0]):
        return api.Quant(float(scales[0]))
    return api.Quant(tuple(float(s) for s in scales))


def npu_feature(graph: Graph, tensor: str, layout: str, dtype: str, precision: str, program: str,
             view: tuple[int, int] | None = None) -> api.Feature:
    """The NPU feature of `tensor`; `view` = (rows, width) reads a native map's
    H*W positions as another grid of the same size (the same bytes: a surface holds
    the positions row-major), for ops that treat every position alike."""
    shape = graph.tensors[tensor].type.shape
    try:
        c, h, rows, w = geometry.feature_map(shape, layout)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    quant = act_quant(graph, tensor, precision)
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


def zero_padded_input(x: api.Feature, padding: tuple[int, int, int, int],
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
        raise Refused(f"{name}: the input has {x.height} rows; its zero rows, read as the {stored} rows a task "
                       f"needs (Q2), are not the int8 padding (zero point {x.quant.zero_point})")
    if bottom < extra:
        raise Refused(f"{name}: the input has {x.height} rows and a bottom padding of {bottom}; read as the "
                       f"{stored} rows a task needs (Q2) it would give more output rows than the map")
    return replace(x, height=stored, surface_stride=None, row_padded=False), (top, bottom - extra, left, right)


def position_view(shape, fits: Callable[[int, int], bool]) -> tuple[int, int] | None:
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
class Tail:
    ops: list[int] = field(default_factory=list)
    bias: np.ndarray | None = None  # float, per output channel
    residual: str | None = None
    activation: str | None = None
    clip: tuple[float, float] | None = None
    slope: float | None = None  # LeakyReLU's
    output: str = ""


def per_channel(value: np.ndarray, channels: int, rank: int, gemm: bool) -> np.ndarray | None:
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


def ready_before(graph: Graph, tensor: str, index: int) -> bool:
    """`tensor` exists before op `index` runs (a model input or an earlier op's output):
    a residual operand the anchor's group reads. One a later op makes stays an Add of
    its own, or fuses into that op's group (the Add commutes)."""
    for j, op in enumerate(graph.ops):
        if tensor in op.outputs:
            return j < index
    return True


def epilogue_tails(graph: Graph, anchor: int, users: dict[str, list[int]], candidate: Callable[[int], bool],
           channels: int, gemm: bool) -> list[Tail]:
    """The epilogues the anchor could absorb, longest first (each a prefix of the
    next longer): when the emitter refuses one (an int8 path has no lookup-table
    activation), a shorter one still fuses what it can."""
    prefixes = [Tail(output=graph.ops[anchor].outputs[0])]
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
                vec = per_channel(value, channels, rank, gemm)
                if vec is None:
                    return prefixes[::-1]
                tail.bias = vec
            elif value is None and graph.tensors[other].type.shape == graph.tensors[out].type.shape \
                    and other != out and ready_before(graph, other, anchor):
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


def dpu_epilogue(graph: Graph, tail: Tail, bias: np.ndarray | None, dtype: str, precision: str, program: str,
              layout: str, in_scale: float, w_scales: np.ndarray | None,
              view: tuple[int, int] | None = None) -> api.Epilogue:
    if bias is not None and dtype == "int8":
        bias = np.rint(bias / (in_scale * w_scales)).astype(np.int64)
        if np.abs(bias).max(initial=0) >= 2 ** 31:
            raise Refused("the int8 bias does not fit 32 bits at these scales")
        bias = bias.astype(np.int32)
    elif bias is not None:
        bias = bias.astype(np.float32)
    residual = None
    if tail.residual is not None:
        residual = api.Residual(npu_feature(graph, tail.residual, layout, dtype, precision, program, view), "add")
    return api.Epilogue(bias=bias, activation=tail.activation, clip=tail.clip, residual=residual, slope=tail.slope)


def channel_gate(graph: Graph, op) -> tuple[str, str] | None:
    """(map, vector) of a Mul of a [1, C, H, W] map by a run-time [1, C, 1, 1] vector
    (a squeeze-excite gate) whose product has the map's shape, else None."""
    if op.type != "Mul":
        return None
    out = tuple(graph.tensors[op.outputs[0]].type.shape)
    for x, s in (op.inputs, op.inputs[::-1]):
        xs, ss = tuple(graph.tensors[x].type.shape), tuple(graph.tensors[s].type.shape)
        if xs == out and len(xs) == 4 and xs[0] == 1 and vector_map(ss) and ss[1] == xs[1] \
                and npu_layout(graph, x) == "native":
            return x, s
    return None
