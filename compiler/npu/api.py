"""The graph-free NPU op API: one NPU operation and its tensors in, tasks out.

This is the contract the graph compilers (ONNX, GGUF) and the tests build on;
it knows nothing about graphs. A client describes

* **operands** (`Feature`): a tensor in NPU memory, named by a symbolic buffer
  (resolved later by relocation), a byte offset, its logical shape and dtype,
  optional quantization, in the native NC1HWC2 layout of `ir/npu/layout.py`
  (C2 = 16 bytes / element size). A GEMM operand A[M, K] is the feature
  C=K, H=gemm_rows(M), W=1 (`Feature.gemm`), and C[M, N] likewise;
* **constants** as numpy arrays (weights, bias): `emit` packs them into the
  native layout and returns them as `ConstBuffer`s to place in a weights region;
* **one operation** (`Gemm`, `Conv2D`, `Elementwise`, `Activation`, `Pool`, or the
  Mesa-compatible `compiler.npu.mesa.MesaConv`) with an `Epilogue`.

`compiler.npu.dispatch.emit(op)` returns an `EmitResult`: the tasks (regcmd incl.
the 4-entry tail, relocations, CBUF plan, counters), the jobs (task indices per
job, one core each; independent jobs spread over the 3 cores), the constant
buffers to fill, scratch buffers the caller must allocate, and `CpuStep`s for
what the NPU cannot finish. `compiler.npu.assemble.assemble(results)` lays the
tasks of several ops into one regcmd region, links tails within each job, and
returns `ir.program` records.

This module is a leaf: the data contract only. The emitters import it; it
imports none of them.

Dtype names are those of `ir.types.DType` ("int8", "fp16", "int32", "fp32").
8-bit features are signed on the NPU: a uint8 tensor is stored as int8 with
zero point - 128 (the Mesa-compatible mode does that conversion itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

from rkc.ir.npu.footprint import Access
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout
from rkc.ir.npu.geometry import GEMM_ROW_ALIGN
from rkc.ir.npu.perf import JobCost, TaskCost
from rkc.ir.npu.regcmd import ENTRY_BYTES

# the dtypes whose tasks may run as one hardware-chained kick: integer tasks after the
# first of a chain are reported wrong on hardware (docs/hardware-questions.md Q1)
CHAINED_DTYPES = frozenset({"fp16"})
ITEMSIZE = {"int8": 1, "int16": 2, "fp16": 2, "int32": 4, "fp32": 4}
# element widths; int4 (nibbles, two per byte) exists only as a GEMM input (gemm_int4.py)
BITS = {"int4": 4, **{name: 8 * size for name, size in ITEMSIZE.items()}}
NUMPY = {"int4": np.int8, "int8": np.int8, "int16": np.int16, "fp16": np.float16, "int32": np.int32, "fp32": np.float32}


def gemm_rows(m: int) -> int:
    """Rows the NPU reads and writes for a GEMM of M rows (M=1 decode included)."""
    if m < 1:
        raise UnsupportedError(f"GEMM needs at least one row, got M={m}")
    return layout.align(m, GEMM_ROW_ALIGN)


# -- operands -------------------------------------------------------------------------
@dataclass(frozen=True)
class Quant:
    """Affine quantization: real = scale * (q - zero_point). `scale` is a float
    (per tensor) or a tuple (per output channel, weights only; zero point 0)."""

    scale: float | tuple[float, ...]
    zero_point: int = 0

    @property
    def per_channel(self) -> bool:
        return isinstance(self.scale, tuple)

    def scales(self, n: int) -> np.ndarray:
        s = np.asarray(self.scale, dtype=np.float64)
        return np.broadcast_to(s, (n,)).copy() if s.ndim == 0 else s


@dataclass(frozen=True)
class Feature:
    """A tensor in NPU memory, native layout [C/C2][H][W][C2] (C2 = 16 B / itemsize).

    `surface_stride` (bytes between channel groups) defaults to the dense H*W*16;
    a larger one lets a tile address part of a bigger tensor (rows are always
    dense: line stride W*16)."""

    buffer: str
    offset: int
    channels: int
    height: int
    width: int
    dtype: str
    quant: Quant | None = None
    surface_stride: int | None = None
    # bytes from one row to the next (default dense, W*16): a larger pitch leaves a gap
    # after every row, which only the DPU writes (its NOTCH, Q4): a convolution's output
    line_stride: int | None = None
    # the surfaces at `surface_stride` are this map's own, taller than its rows (a map
    # of few rows stored in 4-row surfaces, ir/npu/geometry.py): not a slice of a bigger
    # tensor, so channels past its last may be read and written as for a dense map
    row_padded: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in BITS:
            raise UnsupportedError(f"{self.buffer}: NPU tensors are {', '.join(BITS)}, not {self.dtype}")
        if min(self.channels, self.height, self.width) < 1 or self.offset < 0:
            raise UnsupportedError(f"{self.buffer}: bad feature shape {self.shape} at offset {self.offset}")
        if self.offset % layout.ATOM_BYTES:
            raise UnsupportedError(f"{self.buffer}: feature offset {self.offset} is not 16-byte aligned")
        if self.line_stride is not None and (self.line_stride % layout.ATOM_BYTES
                                             or self.line_stride < self.width * layout.ATOM_BYTES):
            raise UnsupportedError(f"{self.buffer}: line stride {self.line_stride} is below the "
                                   f"{self.width * layout.ATOM_BYTES} bytes of one row or not 16-byte aligned")
        if self.surface_stride is not None and (
                self.surface_stride % layout.ATOM_BYTES or self.surface_stride < self.dense_surface_bytes):
            raise UnsupportedError(f"{self.buffer}: surface stride {self.surface_stride} is below the "
                                   f"{self.dense_surface_bytes} bytes of one surface or not 16-byte aligned")

    @classmethod
    def gemm(cls, buffer: str, offset: int, rows: int, cols: int, dtype: str,
             quant: Quant | None = None) -> "Feature":
        """GEMM operand [rows, cols] as the feature C=cols, H=gemm_rows(rows), W=1."""
        return cls(buffer, offset, cols, gemm_rows(rows), 1, dtype, quant)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.channels, self.height, self.width

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def bits(self) -> int:
        return BITS[self.dtype]

    @property
    def c2(self) -> int:
        return 8 * layout.ATOM_BYTES // self.bits

    @property
    def surfaces(self) -> int:
        return -(-self.channels // self.c2)

    @property
    def line_bytes(self) -> int:
        """The row pitch."""
        return self.line_stride or self.width * layout.ATOM_BYTES

    @property
    def dense_surface_bytes(self) -> int:
        """Bytes one surface spans (its rows' gaps included)."""
        return (self.height - 1) * self.line_bytes + self.width * layout.ATOM_BYTES

    @property
    def surface_bytes(self) -> int:
        return self.surface_stride or self.dense_surface_bytes

    @property
    def nbytes(self) -> int:
        """Bytes from `offset` to the end of the last element."""
        return (self.surfaces - 1) * self.surface_bytes + self.dense_surface_bytes

    def view(self, channel0: int = 0, channels: int | None = None,
             row0: int = 0, rows: int | None = None) -> "Feature":
        """A sub-tensor: channels [channel0, +channels) and rows [row0, +rows)
        (channel0 a multiple of C2); strides are those of this tensor."""
        channels = self.channels - channel0 if channels is None else channels
        rows = self.height - row0 if rows is None else rows
        if channel0 % self.c2 or channel0 + channels > self.channels or row0 + rows > self.height:
            raise UnsupportedError(f"{self.buffer}: view c[{channel0}+{channels}] h[{row0}+{rows}] "
                                   f"outside {self.shape}")
        offset = self.offset + channel0 // self.c2 * self.surface_bytes + row0 * self.line_bytes
        return replace(self, offset=offset, channels=channels, height=rows,
                       surface_stride=self.surface_bytes, row_padded=False)


# -- epilogues ------------------------------------------------------------------------
ELEMENTWISE_OPS = ("add", "mul", "max", "min")
LUT_FUNCTIONS = ("sigmoid", "tanh", "silu", "gelu", "gelu_tanh", "exp", "hardsigmoid", "hardswish")
ACTIVATIONS = ("relu", "relu6", "clip", "leaky_relu", *LUT_FUNCTIONS)


@dataclass(frozen=True)
class Residual:
    """A second tensor combined element by element with the result (add, mul, max, min).
    It has the output's shape; quantized outputs need its quant."""

    tensor: Feature
    op: str = "add"


@dataclass(frozen=True, eq=False)
class Epilogue:
    """What the DPU does to the accumulator before writing it.

    Order: + bias (per output channel) -> residual -> activation -> output
    conversion (requantization when the output is int8, fp32->fp16 narrowing,
    raw int32/fp32 otherwise). `bias` is int32 (in units of
    input_scale*weight_scale) for integer paths, float for fp16 paths.
    `clip` bounds are in real units (for "clip"; "relu6" implies (0, 6)); `slope`
    is "leaky_relu"'s factor for negative values."""

    bias: np.ndarray | None = None
    activation: str | None = None
    clip: tuple[float, float] | None = None
    residual: Residual | None = None
    slope: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.activation, str) and self.activation not in ACTIVATIONS:
            raise UnsupportedError(f"unknown activation {self.activation!r} (have {', '.join(ACTIVATIONS)})")
        if self.activation == "clip" and self.clip is None:
            raise UnsupportedError("activation 'clip' needs clip=(lo, hi)")
        if (self.activation == "leaky_relu") != (self.slope is not None):
            raise UnsupportedError("activation 'leaky_relu' takes slope=, and only it")
        if self.residual is not None and self.residual.op not in ELEMENTWISE_OPS:
            raise UnsupportedError(f"residual op {self.residual.op!r} is not one of {', '.join(ELEMENTWISE_OPS)}")

    @property
    def clip_range(self) -> tuple[float, float] | None:
        return {"relu": (0.0, float("inf")), "relu6": (0.0, 6.0), "clip": self.clip}.get(self.activation or "")

    @property
    def lut(self) -> object | None:
        """A lookup-table activation: a name of LUT_FUNCTIONS, or a table of the
        emitter's own (a `compiler.npu.lut.LutFunction`, e.g. LRN's power)."""
        if self.activation is None or self.activation in ACTIVATIONS and self.activation not in LUT_FUNCTIONS:
            return None
        return self.activation


NO_EPILOGUE = Epilogue()


# -- operations -----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Gemm:
    """C[M, N] = A[M, K] x B[K, N] as a 1x1 convolution.

    int8 x int8 -> int32 (raw), int8 (requantized: `c.quant` set), fp32 (exact
    cast of the int32 sum); fp16 x fp16 -> fp32 or fp16. `b` is the constant
    [K, N] matrix (int8 with `b_quant`, or float16).

    `b_buffer`: B is not a constant but the contents of that buffer at run time,
    in the native 1x1 weight layout (`layout.pack_weights` of B^T, one K tile),
    written by whoever owns it (an LLM's KV cache, the softmax's
    probabilities); `b` then only gives B's shape and dtype (a zero-stride
    stand-in will do). fp16 only, and K within one task's channels."""

    a: Feature
    b: np.ndarray
    c: Feature
    m: int
    b_quant: Quant | None = None
    epilogue: Epilogue = NO_EPILOGUE
    name: str = "gemm"
    # (first output channel, channels, lane) ranges chosen for a whole segment
    # (compiler/npu/placement.py); None: the emitter cuts N evenly over the cores
    placement: tuple[tuple[int, int, int], ...] | None = None
    b_buffer: str | None = None

    @property
    def k(self) -> int:
        return self.b.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[1]

    @property
    def weights_buffer(self) -> str:
        """The buffer the CNA reads B from: the runtime operand's, or the packed constant's."""
        return self.b_buffer or f"{self.name}.weights"


INT4_SEGMENT = 256  # default K segment of an int4 GEMM: 256 x 64 = 16384, far inside int16


@dataclass(frozen=True, eq=False)
class GemmInt4:
    """int4 x int4 -> int16 partial products over K segments (compiler/npu/gemm_int4.py).

    `b` is the constant [K, N] matrix of int4 values (int8 in [-8, 7]), `a` the int4
    operand Feature.gemm(rows=M, cols=K). K is cut into segments of `segment`
    channels (a multiple of 32); segment g writes C_g = A[:, Kg] x B[Kg, :] to
    channels [g * Np, g * Np + N) of `c` (int16, Np = N rounded up to 64), so the
    caller combines the partials with per-segment scales (quantization groups
    along K). A segment of s channels sums at most 64 s: s <= 480 keeps every
    partial inside int16, whose overflow behaviour is undocumented (Q23); a
    longer segment is taken only when the weights bound every partial within
    int16 (8 x a column's sum of |w|, gemm_int4.partial_bound)."""

    a: Feature
    b: np.ndarray
    c: Feature
    m: int
    segment: int = INT4_SEGMENT
    name: str = "gemm4"
    # (K group, first output channel, channels, lane) ranges placed for a whole
    # segment (placement.place_segment_int4); None: each group's N cut evenly over the cores
    placement: tuple[tuple[int, int, int, int], ...] | None = None
    # 0, or two quantization groups per segment (paired nibble rows,
    # runtime/llm/int4_rows.pair_rows): of each 4 rows of A, the first 2 hold values only
    # over a segment's first `row_split` channels, the last 2 only over the rest, so each
    # row's int16 sum covers one group and the bound is the group's, not the segment's
    row_split: int = 0

    @property
    def k(self) -> int:
        return self.b.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[1]

    @property
    def n_padded(self) -> int:
        return layout.align(self.n, layout.INT4_KERNEL_GROUP)

    @property
    def segments(self) -> int:
        return -(-self.k // self.segment)


@dataclass(frozen=True, eq=False)
class Conv2D:
    """Direct or depthwise 2-D convolution on NC1HWC2 features.

    `weights` is [O, KH, KW, I] (TFLite OHWI) for a direct conv and [KH, KW, C]
    for depthwise (channel multiplier 1). `padding` = (top, bottom, left, right),
    `stride` = (y, x)."""

    input: Feature
    weights: np.ndarray
    output: Feature
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    depthwise: bool = False
    weight_quant: Quant | None = None
    epilogue: Epilogue = NO_EPILOGUE
    name: str = "conv"
    # the weights are not a constant but that buffer's contents at run time, in the
    # native depthwise layout, written by whoever owns it (fp16 depthwise only; as
    # Gemm.b_buffer): `weights` then gives only their shape and dtype
    weights_buffer: str | None = None
    # what the CNA reads past the map's edges, as stored (an int8 code, an fp16 value);
    # None: the input's zero (its zero point). A max pool's taps pad with the minimum.
    pad_value: float | None = None

    @property
    def weights_source(self) -> str:
        """The buffer the CNA reads the weights from: the run-time one, or the packed constant's."""
        return self.weights_buffer or f"{self.name}.weights"

    @property
    def kernel(self) -> tuple[int, int]:
        return tuple(self.weights.shape[:2]) if self.depthwise else tuple(self.weights.shape[1:3])

    def output_hw(self) -> tuple[int, int]:
        (kh, kw), (sy, sx), (pt, pb, pl, pr) = self.kernel, self.stride, self.padding
        return ((self.input.height + pt + pb - kh) // sy + 1, (self.input.width + pl + pr - kw) // sx + 1)


@dataclass(frozen=True, eq=False)
class Elementwise:
    """out = act(a OP b) for two tensors of one shape (standalone DPU "flying" task);
    `activation` is one the EW stage applies after the combination: "relu", "relu6"
    or "clip" (`clip` its real bounds), as a convolution's epilogue with a residual."""

    a: Feature
    b: Feature
    out: Feature
    op: str = "add"
    name: str = "eltwise"
    activation: str | None = None
    clip: tuple[float, float] | None = None
    # fp16: a power of two a is multiplied by first (exact: the identity weight), so that
    # a product beyond fp16's range can be written scaled down (LRN's squares)
    scale: float = 1.0


@dataclass(frozen=True, eq=False)
class Activation:
    """out = f(x) through the DPU lookup table (standalone flying task), fp16."""

    input: Feature
    output: Feature
    function: str = "sigmoid"
    name: str = "act"


@dataclass(frozen=True, eq=False)
class Pool:
    """Max or average pooling on the PPU. `kernel=None` means global pooling.

    An average divides by the whole window (padding included) unless
    `count_padding` is False: then by the window positions inside the map
    (ONNX count_include_pad 0). An output larger than the padded map gives (ceil
    mode) has windows overhanging the end padding, which never count."""

    input: Feature
    output: Feature
    method: str = "max"
    kernel: tuple[int, int] | None = None
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    name: str = "pool"
    count_padding: bool = True


@dataclass(frozen=True, eq=False)
class LocalResponseNorm:
    """ONNX LRN across channels, fp16: out = x / (bias + alpha / size * sum of the
    squares of `size` neighbouring channels) ** beta (compiler/npu/lrn.py)."""

    input: Feature
    output: Feature
    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0
    name: str = "lrn"
    # the largest |x| the input holds (its calibrated range): the power's table must
    # cover what the window sums reach (compiler/npu/lrn.py); None: unknown
    input_max: float | None = None


@dataclass(frozen=True, eq=False)
class Upsample:
    """Nearest upsampling by an integer `factor` k in both directions: output
    [C, kH, kW] (input and output share dtype and quantization: the values are copied)."""

    input: Feature
    output: Feature
    name: str = "upsample"
    factor: int = 2


@dataclass(frozen=True, eq=False)
class ConvTranspose2D:
    """Transposed convolution whose stride equals its k x k kernel (no padding):
    every input pixel (y, x) writes its own k x k block of the [O, kH, kW] output,
    out[o, k*y + i, k*x + j] = sum_c weights[o, i, j, c] * input[c, y, x] (+ epilogue).
    `weights` is [O, k, k, I], as a Conv2D's (ONNX's [I, O, k, k] transposed)."""

    input: Feature
    weights: np.ndarray
    output: Feature
    weight_quant: Quant | None = None
    epilogue: Epilogue = NO_EPILOGUE
    name: str = "conv_transpose"

    @property
    def k(self) -> int:
        return int(self.weights.shape[1])


# the operations of this API; compiler/npu/dispatch.LOWERINGS has one emitter for each
# (and for the Mesa-compatible compiler.npu.mesa.MesaConv)
OPERATIONS = (Gemm, GemmInt4, Conv2D, Elementwise, Activation, Pool, Upsample, ConvTranspose2D, LocalResponseNorm)


# -- results --------------------------------------------------------------------------
@dataclass(frozen=True)
class Reloc:
    """Regcmd entry `entry` of a task carries the address of `buffer` + `offset`."""

    entry: int
    buffer: str
    offset: int = 0


@dataclass(frozen=True)
class CbufPlan:
    """How a task uses the 12 x 32 KiB convolution buffer of its core."""

    data_banks: int
    weight_banks: int
    data_bytes: int = 0  # feature bytes the task holds in its data banks
    weight_bytes: int = 0  # weight bytes of the task
    weights_resident: bool = True  # all weights fit the weight banks (else streamed)
    data_reuse: bool = False  # feature left in CBUF by the previous task on this core
    weight_reuse: bool = False  # weights left in CBUF by the previous task on this core

    @property
    def banks(self) -> int:
        return self.data_banks + self.weight_banks


@dataclass
class Counters:
    """What a task costs: multiply-accumulates and DDR bytes per DMA engine."""

    macs: int = 0
    dma_read: dict[str, int] = field(default_factory=dict)
    dma_write: dict[str, int] = field(default_factory=dict)
    mac_dtype: str = "int8"

    @property
    def ddr_bytes(self) -> int:
        return sum(self.dma_read.values()) + sum(self.dma_write.values())

    def add(self, other: "Counters") -> None:
        self.macs += other.macs
        for mine, theirs in ((self.dma_read, other.dma_read), (self.dma_write, other.dma_write)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v


@dataclass
class Task:
    regcmd: np.ndarray  # uint64 entries, the 4-entry tail included
    relocations: list[Reloc]
    cbuf: CbufPlan | None
    counters: Counters
    label: str = ""
    touches: list[tuple[str, int, int]] = field(default_factory=list)  # (buffer, start, end) bytes read/written
    # the exact bytes read and written (ir/npu/footprint.py), where the emitter knows them:
    # assemble() chains consecutive layers' tasks on one core by them; None: `touches` stand in
    access: Access | None = None

    @property
    def count(self) -> int:
        return len(self.regcmd)

    def cost(self) -> TaskCost:
        """What the performance model needs (ir/npu/perf.py): the DMA engines'
        bytes plus the regcmd bytes the PC fetches (the whole task, through its
        op-enable entry, as the simulator counts them)."""
        c = self.counters
        precision = c.mac_dtype if self.cbuf is not None else ""  # the CORE's, for a convolution task
        return TaskCost(c.macs, c.ddr_bytes + self.count * ENTRY_BYTES, precision)


@dataclass
class JobPlan:
    """Tasks (indices into EmitResult.tasks) that run in order on one core."""

    tasks: list[int]
    lane: int = 0
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class ConstBuffer:
    """Bytes to place in a read-only region under `name` (weights, bias, tables)."""

    name: str
    data: bytes
    align: int = 64


@dataclass(frozen=True)
class Scratch:
    """An NPU buffer the caller must allocate (contents undefined between ops)."""

    name: str
    size: int


@dataclass(frozen=True, eq=False)
class CpuStep:
    """Work the NPU cannot finish, to run on the CPU after `after` (job indices).

    kind "sum_partials": output = finish(sum of the int32 `inputs`), where finish
    applies `epilogue` (bias, requantization to `output.quant`, clip); see
    compiler.npu.cpu_finish.run_cpu_step for the exact arithmetic."""

    kind: str
    inputs: tuple[Feature, ...]
    output: Feature
    epilogue: Epilogue = NO_EPILOGUE
    params: Mapping[str, object] = field(default_factory=dict)
    after: tuple[int, ...] = ()
    reason: str = ""


@dataclass
class EmitResult:
    op: object
    tasks: list[Task]
    jobs: list[JobPlan]
    constants: list[ConstBuffer] = field(default_factory=list)
    scratch: list[Scratch] = field(default_factory=list)
    cpu: list[CpuStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # tiling decisions, for `rkc inspect`

    @property
    def counters(self) -> Counters:
        total = Counters()
        for t in self.tasks:
            total.add(t.counters)
        return total

    @property
    def uses_ppu(self) -> bool:
        """Whether a task runs on the PPU (stock rocket never completes one: Q12)."""
        return any("ppu_rdma" in t.counters.dma_read for t in self.tasks)

    def extents(self) -> dict[str, int]:
        """Bytes each buffer must have (from its start) for this op's tasks: what
        they read and write, including channels written past the logical end."""
        out: dict[str, int] = {}
        for t in self.tasks:
            for buf, _, end in t.touches:
                out[buf] = max(out.get(buf, 0), end)
        for c in self.constants:
            out[c.name] = max(out.get(c.name, 0), len(c.data))
        for s in self.scratch:
            out[s.name] = max(out.get(s.name, 0), s.size)
        for step in self.cpu:
            for f in (*step.inputs, step.output):
                out[f.buffer] = max(out.get(f.buffer, 0), f.offset + f.nbytes)
        return out

    @property
    def kicks_stock(self) -> int:
        """Kicks under stock rocket: one per task."""
        return len(self.tasks)

    @property
    def kicks_chained(self) -> int:
        """Kicks with hardware chaining: one per job."""
        return len(self.jobs)

    def cost_jobs(self, chained: bool) -> list[JobCost]:
        """The jobs as the performance model sees them when submitted on their own."""
        return [JobCost(j.lane, 1 if chained else len(j.tasks), [self.tasks[i].cost() for i in j.tasks])
                for j in self.jobs]


@dataclass(frozen=True)
class EmitOptions:
    """Knobs of the emitter (defaults are rkc's choices; see docs/npu-emitters.md)."""

    cores: int = 3
    n_tile_max: int = 4096  # output channels per task (13-bit fields end at 8192; stay off the edge)
    k_tile_max: int = 8192  # input channels per task (Rockchip's matmul API splits B above 8192)
    allow_cpu_finish: bool = True  # int8 K splits: sum partials on the CPU (else raise)
    # Stock rocket completes a task only on the DPU interrupt, so a PPU-only pooling
    # task never finishes there; set this on a kernel that completes PPU tasks.
    # Without it average pooling runs as a depthwise convolution and max pooling
    # is refused.
    ppu_completes: bool = False
    # GEMM weights packed once per (name, K tiles) and reused: for callers whose
    # GEMMs of one name always multiply the same B (an LLM's programs share their
    # weights; the ModuleBuilder's digest check still compares every copy)
    pack_cache: dict | None = field(default=None, compare=False, hash=False, repr=False)

    # -- readings of open hardware questions (docs/hardware-questions.md) --------
    # These exist so that `rkc probe` (compiler/probe) can build the programs the
    # safe readings refuse and ask a board how it behaves. The defaults ARE the
    # safe readings, matching runtime/sim/quirks.DEFAULT; nothing else sets them.
    #
    # Q2: every convolution task reads at least this many input rows: maps of
    # fewer than 4 rows compute wrongly on silicon (rocket-userspace
    # include/rocket_matmul.h @ e0677862; hw-matmul.md 2.3).
    min_input_rows: int = 4
    # Q6: CBUF banks reserved past an int8 feature tile: the int8 feature DMA
    # over-reads one bank past its allocation near bank-full sizes
    # (rockchip-npu-notes encodings/cbuf-bank-slack.md, HW-proven); fp16 needs none.
    int8_slack_banks: int = 1
    # Q23: the longest K one int4 task reduces; 480 x 64 (the largest |int4 x int4|)
    # stays inside int16 whatever the hardware does past it. Only `rkc probe` raises it
    int4_segment_max: int = 480
    # Q22: a lookup-table activation on an int8 convolution's integer datapath (the
    # BN stage's integer multiply makes the table index, OUT_CVT requantizes the
    # entry to int8). Every validated LUT program runs on fp16 data: only `rkc probe`
    # sets it; compiles run such groups in fp16.
    integer_lut: bool = False
    # Q27: fp16 output straight from an int8 GEMM (OUT_PRECISION 2, the per-channel
    # dequant scale in BS and OUT_CVT, the integer result cast to fp16). Documented
    # for small single tiles only: only `rkc probe` sets it.
    integer_fp16_out: bool = False

    def slack_banks(self, dtype: str) -> int:
        """CBUF banks a feature tile of `dtype` keeps free past its data."""
        return self.int8_slack_banks if dtype in ("int8", "int4") else 0


DEFAULT_OPTIONS = EmitOptions()

