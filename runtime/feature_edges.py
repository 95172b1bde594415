"""CPU steps at an NPU feature map ("native": [C1, H, W, C2], ir/npu/layout.py),
run on the native layout itself instead of through the interpreter's generic
unpack and pack around the kernel (runtime/execute.py's from_layout /
to_layout: a transposed copy each way, and numpy's fp16 casts at ~2 ns an
element, which made a 640x640 detector's input and outputs most of its host time):

* the model's input edge: a float32 map quantized (QuantizeLinear, one scale)
  or rounded to fp16 (Cast) straight into the feature map, threads over rows;
* its output edges: a feature map dequantized (DequantizeLinear, one scale) or
  widened (Cast) to float32 straight into the row-major result;
* an int8 <-> fp16 edge of a mixed-precision program (a conversion out of one
  feature map into float32 and straight back into another): one recoding pass
  through a table of every code's result (`run_pair`);
* a learned upsampling (a ConvTranspose whose stride is its kernel) quantized
  into a feature map: its tap products quantized in place (`run_pair`);
* ops that work plane by plane and only select values (MaxPool without its
  indices, nearest Resize): the kernel of runtime/kernels runs on the feature
  maps seen as planes [C1, C2, H, W] (no conversion, the padding channels
  pooled or copied like any other: they hold what the NPU wrote there);
* a depthwise convolution between fp16 maps (one the NPU refuses: a window over
  fewer than 4 rows) with constant weights: runtime/kernels/depthwise_jit.py on
  the atoms (`_depthwise`);
* attention's softmax between two NPU products (SoftmaxTranspose): the fp16
  scores read where the first GEMM wrote them, the probabilities written as the
  second GEMM's run-time weights (runtime/kernels/softmax_jit.py, `_softmax_weights`);
* a Relayout between fp16 NPU buffers (compiler/relayout.py): its index map turned,
  at the program's first run, into native element positions of each source and of
  the result, then one gather per source (runtime/relayout_edges.py).

`run_step(run, step)` runs a step this way when its tensors allow it and says
whether it did; any other step takes the interpreter's path. The model's input and
output edges are worked out at their first run into closures that later runs call
straight (`_input_edge`, `_output_edge`). The values are
the kernels' own (tests/runtime/test_feature_edges.py).
"""

from __future__ import annotations

import functools

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.npu import geometry, layout
from rkc.ir.program import Step, TensorInfo
from rkc.ir.types import DType
from rkc.runtime import relayout_edges
from rkc.runtime.kernels import run_kernel

PLANE_OPS = frozenset({"MaxPool", "Resize"})


def _feature(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as its feature map [C1, H, W, C2] (a strided view of a map
    stored in taller surfaces than its rows: its zero rows are left alone)."""
    dtype, stored, _, h = _feature_form(info.dtype, info.layout, tuple(info.shape))
    return layout.feature_view(raw, stored[0] * stored[3], stored[1], stored[2], dtype)[:, :h]


@functools.lru_cache(maxsize=4096)
def _feature_form(dtype: str, kind: str, shape: tuple[int, ...]) -> tuple:
    """(numpy dtype, stored shape [C1, rows, W, C2], its bytes, logical rows) of a feature
    map, worked out once per form (with `_place`, ~7 us of every CPU step at a map before)."""
    c, h, rows, w = geometry.feature_map(shape, kind)
    dtype = DType(dtype).numpy
    c2 = layout.c2_for(dtype.itemsize)
    c1 = -(-c // c2)
    return dtype, (c1, rows, w, c2), c1 * rows * w * c2 * dtype.itemsize, h


def _planes(fm: np.ndarray) -> np.ndarray:
    """A feature map [C1, H, W, C2] as planes [C1, C2, H, W] (a view)."""
    return fm.transpose(0, 3, 1, 2)


def _long_lines(*maps: np.ndarray) -> tuple[np.ndarray, ...]:
    """Feature maps [C1, H, W, C2] and row-major maps [C, H, W] of one shape seen as
    one line per channel group ([C1, 1, H * W, C2], [C, 1, H * W]) when all are
    contiguous, so that the edge kernels, which work a line at a time, run long
    vectorised loops: on a 13x13 map a line's fixed cost was most of the time
    (512x13x13 quantized into its map 0.37 -> 0.06 ms). Otherwise as they are."""
    if not all(m.flags.c_contiguous for m in maps):
        return maps
    return tuple(m.reshape(m.shape[0], 1, m.shape[1] * m.shape[2], *m.shape[3:]) for m in maps)


class _Held:
    """The feature maps of some BO tensors, held for CPU access while a step runs. Where
    each lies (its BO, its bytes, its stored shape) is worked out once per tensor and kept
    with the program's plans (`_place`); the views are made each time, inside the bracket."""

    def __init__(self, run, infos: list[TensorInfo]) -> None:
        self.device = run.model.device
        self.places = [_place(run, info) for info in infos]
        self.bos = list({id(p[0]): p[0] for p in self.places}.values())

    def __enter__(self) -> list[np.ndarray]:
        for bo in self.bos:
            self.device.prepare_cpu_access(bo)  # host is writable from here on
        return [bo.host[lo:hi].view(dtype).reshape(stored)[:, :h] for bo, lo, hi, dtype, stored, h in self.places]

    def __exit__(self, *exc) -> None:
        for bo in self.bos:
            self.device.finish_cpu_access(bo)


def _place(run, info: TensorInfo) -> tuple:
    """(BO, first byte, end, numpy dtype, stored shape [C1, rows, W, C2], logical rows) of a
    feature map in a BO, kept per tensor with the program's plans (a run's BOs and tensors
    live as long as its schedule)."""
    plans = run.schedule.native_plans
    key = ("place", id(info))
    place = plans.get(key)
    if place is None:
        dtype, stored, nbytes, h = _feature_form(info.dtype, info.layout, tuple(info.shape))
        bo = run.model.bos[info.region]
        if nbytes > info.nbytes or info.offset + nbytes > bo.host.size:
            layout.feature_view(bo.host[info.offset:info.offset + info.nbytes], stored[0] * stored[3], stored[1],
                                stored[2], dtype)  # raises, naming the shortfall
        place = plans[key] = (bo, info.offset, info.offset + nbytes, dtype, stored, h)
    return place


def _in_bo(run, info: TensorInfo | None) -> bool:
    return info is not None and info.region is not None and info.region in run.model.bos \
        and info.layout == "native"


def _edge_form(run, info: TensorInfo | None) -> str | None:
    """How an edge step reaches a tensor in a BO: "map" (a feature map, or a GEMM operand
    [1, K, 1, 1], one row of K channels: the same [C1, rows, 1, C2] atoms seen as planes
    [K, 1, 1]), "rows" (a GEMM operand [M, K] or [1, M, K]: fp16 casts through
    runtime/half.py's atom loops), or None (the interpreter's path)."""
    if info is None or info.region is None or info.region not in run.model.bos:
        return None
    if info.layout == "native":
        return "map"
    if info.layout == "native-gemm":
        shape = list(info.shape)
        if len(shape) == 4 and shape[0] == 1 and shape[2:] == [1, 1]:
            return "map"
        if len(shape) == 2 or (len(shape) == 3 and shape[0] == 1):
            return "rows"
    return None


def _one_scale(run, step: Step) -> tuple[float, int] | None:
    """(scale, zero point) of a per-tensor (De)QuantizeLinear with an int8 zero point;
    read once when both are the program's constants (a step of the first run keeps them)."""
    if len(step.inputs) != 3 or not step.inputs[2] or step.attrs.get("block_size", 0):
        return None
    key = ("scale", id(step))
    params = run.schedule.native_plans.get(key)
    if params is not None:
        return params
    scale, zp = run.read(step.inputs[1]), run.read(step.inputs[2])
    if scale.size != 1 or zp.size != 1 or zp.dtype != np.int8 or scale.dtype != np.float32:
        return None
    params = float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])
    tensors, host = run.model.tensors, run.model.host_regions
    if all(n in tensors and tensors[n].region in host for n in step.inputs[1:]):
        run.schedule.native_plans[key] = params
    return params


def run_step(run, step: Step) -> bool:
    """Run `step` on the native layout of its feature maps if it is one of the
    cases above (True), else do nothing (False)."""
    prepared = run.schedule.native_plans.get(_prepared_key(run, step))
    if prepared is not None and prepared(run):  # an edge worked out at its first run (`_input_edge`)
        return True
    if len(step.outputs) != 1 or not step.inputs or not step.inputs[0]:
        return False
    tensors = run.model.tensors
    src, dst = tensors.get(step.inputs[0]), tensors.get(step.outputs[0])
    if src is None or dst is None:
        return False
    if step.op in ("Cast", "QuantizeLinear") and src.region is None and (form := _edge_form(run, dst)):
        return _input_edge(run, step, src, dst) if form == "map" else _rows_edge(run, step, src, dst)
    if step.op in ("Cast", "DequantizeLinear") and dst.region is None and (form := _edge_form(run, src)):
        return _output_edge(run, step, src, dst) if form == "map" else _rows_edge(run, step, src, dst)
    if step.op in PLANE_OPS and _in_bo(run, src) and _in_bo(run, dst) and src.dtype == dst.dtype:
        return (step.op == "MaxPool" and _max_pool(run, step, src, dst)) or _plane_op(run, step, src, dst)
    if step.op == "Conv" and _in_bo(run, src) and _in_bo(run, dst) and src.dtype == dst.dtype == DType.FP16:
        return _depthwise(run, step, src, dst)
    if step.op == "Relayout":
        return relayout_edges.relayout(run, step)
    if step.op == "SoftmaxTranspose" and src.layout == "native-gemm" and dst.layout == "native-weights" \
            and src.dtype == dst.dtype == DType.FP16 and src.region in run.model.bos and dst.region in run.model.bos:
        return _softmax_weights(run, step, src, dst)
    return False


# element-wise ops a recoding chain may pass through: each output element a function of the same
# input element alone (other inputs constants of one value), so a table of every code's result is exact
CHAIN_OPS = frozenset({"Relu", "LeakyRelu", "Clip", "Abs", "Neg", "Identity", "Sigmoid", "HardSigmoid",
                       "HardSwish", "Swish", "Tanh", "Add", "Sub", "Mul", "Div", "Max", "Min"})
_OUT_OF_FEATURE = ("DequantizeLinear", "Cast")
_INTO_FEATURE = ("QuantizeLinear", "Cast")


def _chained(steps, j: int, last_use: dict, outputs) -> bool:
    """Whether CPU step j reads, as its first input, step j-1's single output
    and is its only reader (not a program output either)."""
    before, step = steps[j - 1], steps[j]
    return (step.kind == "cpu" and len(before.outputs) == 1 and bool(step.inputs)
            and step.inputs[0] == before.outputs[0] and last_use.get(before.outputs[0]) == j
            and before.outputs[0] not in outputs)


def chain_end(steps, i: int, last_use: dict, outputs) -> int | None:
    """The index of the last step of the recoding chain starting at steps[i], if
    its shape is one: a conversion out of a tensor, element-wise CHAIN_OPS, a
    conversion into one, each step's first input the previous step's single
    output that nothing else reads. Whether the tensors are feature maps and
    the constants single values, `run_chain` checks."""
    if steps[i].kind != "cpu" or steps[i].op not in _OUT_OF_FEATURE:
        return None
    for j in range(i + 1, len(steps)):
        step = steps[j]
        if not _chained(steps, j, last_use, outputs):
            return None
        if step.op in _INTO_FEATURE:
            return j
        if step.op not in CHAIN_OPS:
            return None
    return None


def run_pair(run, step: Step, following: Step) -> bool:
    """`run_chain` of two steps, or a learned upsampling then its QuantizeLinear
    into a feature map (`_tiles_into_feature`). The caller knows nothing else
    reads the float32 tensor between them."""
    if following.kind != "cpu" or len(step.outputs) != 1 or len(following.outputs) != 1 \
            or not following.inputs or following.inputs[0] != step.outputs[0] or not step.inputs[0]:
        return False
    if (step.op, following.op) == ("ConvTranspose", "QuantizeLinear"):
        tensors = run.model.tensors
        return _tiles_into_feature(run, step, following, tensors.get(step.outputs[0]), tensors.get(following.outputs[0]))
    return run_chain(run, [step, following])


def run_chain(run, steps: list[Step], plan: "ChainPlan | None" = None) -> bool:
    """Run `steps` (a chain_end chain: a conversion out of a feature map into a
    float32 host tensor, element-wise ops on it, its conversion back into
    another feature map; int8 -> fp16 in a mixed-precision program is
    DequantizeLinear then Cast, an int8 segment's residual ReLU left on the
    CPU DequantizeLinear, Relu, QuantizeLinear) as one recoding of the codes
    through a table of every code's result (256 int8 or 65536 fp16 codes run
    through the reference kernels, runtime/kernels), if the tensors allow it.
    `plan`: `chain_plan`'s result for these steps, made once by the caller.
    The caller knows nothing else reads the float32 tensors between them."""
    from rkc.runtime.kernels import quant_jit

    plan = plan or chain_plan(run, steps)
    if plan is None:
        return False
    src, dst, table, overlap = plan
    with _Held(run, [src, dst]) as (fin, fout):
        codes_in = fin.view(np.uint8 if src.dtype == "int8" else np.uint16)
        if overlap:
            codes_in = codes_in.copy()
        codes_out = fout.view(np.uint16 if dst.dtype == "fp16" else np.uint8)
        codes_in, codes_out = _long_lines(codes_in, codes_out)
        quant_jit.recode_feature(codes_in, table, codes_out, int(src.shape[1]))
    return True


ChainPlan = tuple  # (source TensorInfo, destination TensorInfo, table, whether their bytes overlap)


def chain_plan(run, steps: list[Step]) -> ChainPlan | None:
    """What run_chain needs of `steps`, none of it changing between runs (the
    tensors, the table, the overlap), or None if they are no such chain."""
    tensors = run.model.tensors
    first, last = steps[0], steps[-1]
    if any(len(s.outputs) != 1 for s in steps) or not first.inputs or not first.inputs[0]:
        return None
    src, dst = tensors.get(first.inputs[0]), tensors.get(last.outputs[0])
    mids = [tensors.get(s.outputs[0]) for s in steps[:-1]]
    if None in (src, dst) or not (_in_bo(run, src) and _in_bo(run, dst)) or list(src.shape) != list(dst.shape) \
            or any(m is None or m.region is not None or m.dtype != "fp32" for m in mids):
        return None
    if (first.op, src.dtype) not in (("DequantizeLinear", "int8"), ("Cast", "fp16")) \
            or (last.op, dst.dtype) not in (("QuantizeLinear", "int8"), ("Cast", "fp16")):
        return None
    key, chain = [], []  # every step's op, attributes and constant inputs: the table is a function of these
    for s in steps:
        consts = [None if not n else _single_value(run, n) for n in s.inputs[1:]]
        if any(n and c is None for n, c in zip(s.inputs[1:], consts)):
            return None
        if s.op in ("DequantizeLinear", "QuantizeLinear") and (s.attrs.get("block_size", 0) or len(consts) != 2
                                                                or consts[1] is None or consts[1].dtype != np.int8):
            return None
        key.append((s.op, repr(sorted(s.attrs.items())),
                    tuple(None if c is None else (c.dtype.str, c.tobytes()) for c in consts)))
        chain.append((s.op, s.attrs, consts))
    key.append(src.dtype)
    table = _TABLES.get(tuple(key), False)
    if table is False:
        if len(_TABLES) >= 1024:
            _TABLES.clear()
        table = _TABLES[tuple(key)] = _chain_table(chain, src.dtype)
    if table is None:
        return None
    # the memory plan may give the last step's output the first's dead input bytes: then the codes are
    # read from a copy (PP-OCR det has 7 such edges)
    overlap = src.region == dst.region and src.offset < dst.offset + dst.nbytes and dst.offset < src.offset + src.nbytes
    return src, dst, table, overlap


def image_chain_end(steps, i: int, last_use: dict, outputs, in_map) -> int | None:
    """The index of the last step of an image chain starting at steps[i]: a
    Transpose (NHWC -> NCHW: the image taken as pixels, rkc compile --image-input),
    then Cast, element-wise CHAIN_OPS and 1x1 depthwise convolutions (the
    normalisation, each value a function of its channel's pixel alone), and a
    conversion into a feature map; each step's first input the previous step's
    single output that nothing else reads; `in_map(name)`: whether a tensor is a
    feature map in a BO. `image_plan` checks the rest."""
    if steps[i].kind != "cpu" or steps[i].op != "Transpose" or list(steps[i].attrs.get("perm", ())) != [0, 3, 1, 2]:
        return None
    for j in range(i + 1, len(steps)):
        step = steps[j]
        if not _chained(steps, j, last_use, outputs):
            return None
        if step.op in _INTO_FEATURE and len(step.outputs) == 1 and in_map(step.outputs[0]):
            return j
        if step.op not in CHAIN_OPS and step.op not in ("Cast", "Conv", "SpaceToDepth"):
            return None
    return None


def image_plan(run, steps: list[Step]) -> tuple | None:
    """What run_image needs of `steps` (an image_chain_end chain), none of it
    changing between runs: the image's name, the destination map, one table
    of 256 codes per channel, made by the reference kernels over every pixel
    value, whether the map is of 2x2 blocks and, for fp16 blocks, the affine
    form of the codes where it gives the tables' (`_affine_codes`); or None if
    the tensors or steps are not such a chain."""
    from rkc.runtime.kernels import pixels_jit

    tensors = run.model.tensors
    first, last = steps[0], steps[-1]
    src, dst = tensors.get(first.inputs[0]), tensors.get(last.outputs[0])
    # the map of the image's 2x2 blocks (compiler/passes/image_blocks.py): a SpaceToDepth just before
    # the conversion into the map, which the tables pass through (it only moves values)
    blocks = len(steps) > 2 and steps[-2].op == "SpaceToDepth"
    if src is None or dst is None or src.region is not None or src.dtype != "uint8" or len(src.shape) != 4 \
            or src.shape[0] != 1 or not _in_bo(run, dst) \
            or (last.op, dst.dtype) not in (("QuantizeLinear", "int8"), ("Cast", "fp16")):
        return None
    c, (h, w) = src.shape[3], src.shape[1:3]
    if list(dst.shape) != ([1, 4 * c, h // 2, w // 2] if blocks else [1, c, h, w]) or any(
            s.op == "SpaceToDepth" for s in steps[:-2]) or blocks and (
            c != 3 or h % 2 or w % 2 or int(steps[-2].attrs.get("blocksize", 0)) != 2):
        return None
    if any(len(s.outputs) != 1 for s in steps) \
            or any(tensors.get(s.outputs[0]) is None or tensors[s.outputs[0]].region is not None for s in steps[:-1]):
        return None
    value = before_last = np.broadcast_to(np.arange(256, dtype=np.uint8), (1, c, 1, 256))  # every pixel value
    with np.errstate(all="ignore"):
        for s in steps[1:]:
            if s.op == "SpaceToDepth":
                continue
            consts = [None if not n else run.read(n) if _constant(run, n) else False for n in s.inputs[1:]]
            if any(v is False for v in consts):
                return None
            if s.op == "Conv" and not _depthwise_1x1(s, consts, c):
                return None
            if s.op in ("DequantizeLinear", "QuantizeLinear") and (
                    len(consts) != 2 or consts[0] is None or np.size(consts[0]) != 1 or consts[1] is None
                    or consts[1].dtype != np.int8 or s.attrs.get("block_size", 0)):
                return None
            try:
                (value,) = run_kernel(s.op, [value, *consts], s.attrs, 1)
            except RkcError:
                return None
            value = np.asarray(value)
            if value.shape != (1, c, 1, 256):  # a step mixing channels or positions: not this path
                return None
            info = tensors[s.outputs[0]]
            value = value.astype(DType(info.dtype).numpy, copy=False)  # as the interpreter stores it
            if s is not last:
                before_last = value
    tables = np.ascontiguousarray(value[0, :, 0]).view(np.uint8 if dst.dtype == "int8" else np.uint16)
    with _Held(run, [dst]) as (fm,):
        if not (pixels_jit.is_rgb_blocks(fm) if blocks else pixels_jit.is_image(c, fm)):
            return None
    affine = _affine_codes(tables, before_last[0, :, 0], w) if blocks and dst.dtype == "fp16" else None
    return first.inputs[0], dst, tables, blocks, affine


def _affine_codes(tables: np.ndarray, values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scales, offsets) for an image `width` pixels wide (pixels_jit.affine_rows) with which
    pixels_jit.pixels_into_blocks' computed codes are the tables' for every pixel value of
    every channel (checked by the kernel itself on an image holding each value), from the
    float32 values [3, 256] the last conversion rounds (a normalisation's x * scale +
    offset); None if they are not."""
    from rkc.runtime.kernels import pixels_jit

    values = values.astype(np.float32)
    offsets = values[:, 0].copy()
    scales = ((values[:, 255] - offsets) / np.float32(255)).astype(np.float32)
    if not (np.isfinite(scales).all() and np.isfinite(offsets).all()):
        return None
    image = np.empty((2, 256, 3), np.uint8)  # every value in every channel, in both rows of a block
    image[0] = np.arange(256, dtype=np.uint8)[:, None]
    image[1] = image[0, ::-1]
    looked, computed = (np.zeros((2, 1, 128, 8), np.uint16) for _ in range(2))
    pixels_jit.pixels_into_blocks(image, tables, looked)
    pixels_jit.pixels_into_blocks(image, tables, computed, pixels_jit.affine_rows(scales, offsets, 256))
    return pixels_jit.affine_rows(scales, offsets, width) if np.array_equal(looked, computed) else None


def run_image(run, steps: list[Step], plan: tuple) -> bool:
    """Run an image chain by its plan: the uint8 pixels straight into the map
    (or into the map of its 2x2 blocks)."""
    from rkc.runtime.kernels import pixels_jit

    name, dst, tables, blocks, affine = plan
    pixels = run.read(name)
    if pixels.dtype != np.uint8 or pixels.ndim != 4:
        return False
    with _Held(run, [dst]) as (fm,):
        if blocks:
            pixels_jit.pixels_into_blocks(pixels[0], tables, fm, affine)
        else:
            pixels_jit.pixels_into_feature(pixels[0], tables, fm)
    return True


def _constant(run, name: str) -> bool:
    info = run.model.tensors.get(name)
    return info is not None and info.region is not None and info.region in getattr(run.model, "host_regions", {})


def _depthwise_1x1(step: Step, consts: list, channels: int) -> bool:
    """A convolution each output value of which is its own channel's input value
    scaled and offset (the normalisation a pass folded into a Conv)."""
    a = step.attrs
    weight = consts[0] if consts else None
    return weight is not None and a.get("group", 1) == channels and list(a.get("kernel_shape", [1, 1])) == [1, 1] \
        and all(v == 1 for v in a.get("strides", [1, 1])) and all(v == 1 for v in a.get("dilations", [1, 1])) \
        and not any(a.get("pads", [0, 0, 0, 0])) and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID") \
        and weight.shape == (channels, 1, 1, 1)


def _single_value(run, name: str) -> np.ndarray | None:
    """A constant input of one value (a host constant), as a one-element array."""
    info = run.model.tensors.get(name)
    if info is None or info.region is None or info.region not in getattr(run.model, "host_regions", {}):
        return None
    value = np.asarray(run.read(name))
    return value.reshape(1) if value.size == 1 else None


_TABLES: dict[tuple, np.ndarray | None] = {}  # run_chain's tables by what they are a function of


def _chain_table(chain: list, src_dtype: str) -> np.ndarray | None:
    """Every source code's result through `chain` ((op, attributes, constant inputs)
    per step) by the reference kernels: int8 codes indexed by their byte, fp16 by
    their bits; the result as bytes (int8) or bits (fp16)."""
    codes = np.arange(256, dtype=np.uint8).view(np.int8) if src_dtype == "int8" \
        else np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    value = codes
    with np.errstate(all="ignore"):
        for k, (op, attrs, consts) in enumerate(chain):
            try:
                (value,) = run_kernel(op, [value, *consts], attrs, 1)
            except RkcError:  # the step's own run reports it
                return None
            value = np.asarray(value).reshape(-1)
            if value.size != codes.size:
                return None
            if k + 1 < len(chain):  # a float32 host tensor between steps, as the interpreter stores it
                value = value.astype(np.float32, copy=False)
    if value.dtype == np.int8:
        return value.view(np.uint8).copy()
    if value.dtype == np.float16:
        return value.view(np.uint16).copy()
    return None


def _tiles_into_feature(run, step: Step, following: Step, mid: TensorInfo | None, dst: TensorInfo | None) -> bool:
    """A stride = kernel ConvTranspose (PP-OCR det's learned upsampling) whose
    float32 output only feeds a QuantizeLinear into a feature map: its tap
    products quantized straight into the map (kernels.conv.conv_transpose_tiles,
    the same products and bias the kernel computes), never interleaved into a
    float32 map of their own."""
    from rkc.runtime.kernels import conv, quant_jit

    if mid is None or dst is None or mid.region is not None or mid.dtype != "fp32" or not _in_bo(run, dst) \
            or dst.dtype != "int8" or list(mid.shape) != list(dst.shape) or len(dst.shape) != 4 or dst.shape[0] != 1:
        return False
    params = _one_scale(run, following)
    inputs = [run.read(n) if n else None for n in step.inputs]
    if params is None or inputs[0] is None or inputs[0].dtype != np.float32:
        return False
    tiles = conv.conv_transpose_tiles(*inputs, **step.attrs)
    if tiles is None or tiles.ndim != 6 or list(tiles.shape[:2]) != list(dst.shape[:2]) \
            or [tiles.shape[2] * tiles.shape[4], tiles.shape[3] * tiles.shape[5]] != list(dst.shape[2:]):
        return False
    with _Held(run, [dst]) as (fm,):
        quant_jit.quantize_tiles_into_feature(tiles[0], *params, fm)
    return True


def _input_edge(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A float32 map quantized or rounded to fp16 into a feature map (an image: whole atoms
    in one pass, pixels_jit). Worked out at its first run into a closure `run_step` calls
    from then on, as `_output_edge`."""
    from rkc.runtime import half
    from rkc.runtime.kernels import pixels_jit, quant_jit  # numba: loaded by programs with these edges only

    value = run.read(step.inputs[0])
    if value.dtype != np.float32 or list(value.shape) != list(dst.shape):
        return False
    params = None
    if step.op == "Cast":
        if dst.dtype != "fp16":
            return False
    else:
        params = _one_scale(run, step)
        if params is None or dst.dtype != "int8":
            return False
    bo, lo, hi, dtype, stored, h = _place(run, dst)
    device, shape, name = run.model.device, tuple(dst.shape), step.inputs[0]
    device.prepare_cpu_access(bo)
    try:  # (a view only while the BO is held)
        image = pixels_jit.is_image(shape[1], bo.host[lo:hi].view(dtype).reshape(stored)[:, :h])
    finally:
        device.finish_cpu_access(bo)
    if params is None and image:
        def kernel(planes, fm):
            pixels_jit.narrow_image(planes.view(np.uint32), fm.view(np.uint16))
    elif params is None:
        def kernel(planes, fm):
            half.narrow_into_feature(*_long_lines(planes.view(np.uint32), fm.view(np.uint16)))
    elif image:
        def kernel(planes, fm):
            pixels_jit.quantize_image(planes, *params, fm)
    else:
        def kernel(planes, fm):
            x, fm = _long_lines(planes, fm)
            quant_jit.quantize_into_feature(x, *params, fm)

    def edge(run) -> bool:
        value = run.read(name)
        if value.dtype != np.float32 or value.shape != shape:
            return False  # (the interpreter's path then names what is wrong)
        device.prepare_cpu_access(bo)
        try:
            kernel(value.reshape(shape[1:]), bo.host[lo:hi].view(dtype).reshape(stored)[:, :h])
        finally:
            device.finish_cpu_access(bo)
        return True

    edge(run)
    if params is None or ("scale", id(step)) in run.schedule.native_plans:  # its scale a constant, read once
        run.schedule.native_plans[_prepared_key(run, step)] = edge
    return True


def _output_edge(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A feature map dequantized or widened into the row-major result (or handed over as
    its fp16 values: `keeps_fp16`). Worked out at its first run into a closure `run_step`
    calls from then on: hold the BO, run the kernel, keep the result (the checks, places,
    imports and views around the logits' ~5 us kernel cost ~15 us a run, load 10)."""
    from rkc.runtime import half
    from rkc.runtime.kernels import quant_jit

    if dst.dtype != "fp32" or list(src.shape) != list(dst.shape):
        return False
    kept = run.keeps_fp16(step)  # the caller takes the NPU's fp16 values as they are
    if step.op == "Cast" and src.dtype == "fp16" and _fp16_lines(run, step, src, dst, kept):
        return True  # (a map stored row after row: its own per-run plan)
    params = None
    if kept:
        def kernel(fm, planes):
            half.unpack_feature_bits(*_long_lines(fm.view(np.uint16), planes.view(np.uint16)))
    elif step.op == "Cast":
        if src.dtype != "fp16":
            return False

        def kernel(fm, planes):
            half.widen_feature(*_long_lines(fm.view(np.uint16), planes.view(np.uint32)))
    else:
        params = _one_scale(run, step)
        if params is None or src.dtype != "int8":
            return False

        def kernel(fm, planes):
            fm, planes = _long_lines(fm, planes)
            quant_jit.dequantize_feature(fm, *params, planes)
    bo, lo, hi, dtype, stored, h = _place(run, src)
    device, shape, name = run.model.device, tuple(dst.shape), step.outputs[0]
    out_dtype = np.float16 if kept else np.float32

    def edge(run) -> bool:
        out = np.empty(shape, out_dtype)
        device.prepare_cpu_access(bo)
        try:  # the view made while the BO is held
            kernel(bo.host[lo:hi].view(dtype).reshape(stored)[:, :h], out.reshape(shape[1:]))
        finally:
            device.finish_cpu_access(bo)
        run.env[name] = out  # (a host tensor: dst has no region)
        return True

    edge(run)
    if params is None or ("scale", id(step)) in run.schedule.native_plans:  # its scale a constant, read once
        run.schedule.native_plans[_prepared_key(run, step)] = edge
    return True


def _prepared_key(run, step: Step) -> tuple:
    return "prepared", id(step), run.fp16_outputs


def _fp16_lines(run, step: Step, src: TensorInfo, dst: TensorInfo, kept: bool) -> bool:
    """An fp16 map's output, kept as it is or widened to float32 (`_output_edge`), from a
    map stored row after row (no taller surfaces), by a plan made at its first run: the
    map and the output as long lines ([C1, 1, H * W, C2], [C, 1, H * W], `_long_lines`'
    form) straight from the BO's bytes, without _Held's and _long_lines' work per run
    (~10 us of a ~45 us step at load 10: a detector has six such outputs)."""
    from rkc.runtime import half

    key = ("lines", id(step))
    plan = run.schedule.native_plans.get(key)
    if plan is None:
        bo, lo, hi, dtype, (c1, rows, w, c2), h = _place(run, src)
        if rows != h or dtype.itemsize != 2 or len(dst.shape) != 4:
            plan = run.schedule.native_plans[key] = ()
        else:
            plan = run.schedule.native_plans[key] = (bo, lo, hi, (c1, 1, h * w, c2), (dst.shape[1], 1, h * w),
                                                     tuple(dst.shape))
    if not plan:
        return False
    bo, lo, hi, fm_lines, out_lines, shape = plan
    out = np.empty(shape, np.float16 if kept else np.float32)
    lines = out.view(np.uint16 if kept else np.uint32).reshape(out_lines)
    device = run.model.device
    device.prepare_cpu_access(bo)
    try:
        fm = bo.host[lo:hi].view(np.uint16).reshape(fm_lines)
        if kept:
            half.unpack_feature_bits(fm, lines)
        else:
            half.widen_feature(fm, lines)
    finally:
        device.finish_cpu_access(bo)
    run.env[step.outputs[0]] = out
    return True


def _rows_edge(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """An fp16 Cast into or out of a GEMM operand [M, K] ([K/C2][rows][C2] atoms): rounded
    straight into the atoms (rows past M and channels past K zeroed) or widened straight
    out of them (runtime/half.py, numpy's bits), as runtime/plan.py's edges do."""
    from rkc.runtime import half

    into = src.region is None
    gemm, other = (dst, src) if into else (src, dst)
    if step.op != "Cast" or gemm.dtype != "fp16" or other.dtype != "fp32" or list(src.shape) != list(dst.shape) \
            or (not into and run.keeps_fp16(step)):
        return False
    m, k = int(gemm.shape[-2]), int(gemm.shape[-1])
    if into:
        value = run.read(step.inputs[0])
        if value.dtype != np.float32 or list(value.shape) != list(dst.shape):
            return False
    bo, lo, hi, _, (c1, rows, _, c2), _ = _place(run, gemm)
    device = run.model.device
    device.prepare_cpu_access(bo)
    try:
        atoms = bo.host[lo:hi].view(np.uint16).reshape(c1, rows, c2)  # every stored row: zeroed past M
        if into:
            half.narrow_into_atoms(value.reshape(m, k).view(np.uint32), atoms)
            return True
        out = np.empty((m, k), np.float32)
        half.widen_atoms(atoms, m, k, out.T.view(np.uint32))
    finally:
        device.finish_cpu_access(bo)
    run.env[step.outputs[0]] = out.reshape(dst.shape)
    return True


def _resize_picks(run, step: Step, src: TensorInfo, dst: TensorInfo) -> tuple:
    """(rows, columns) a nearest Resize of the map's height and width takes, made at the
    program's first run; () for any other Resize (it then runs on the planes)."""
    plans = run.schedule.native_plans
    plan = plans.get(id(step))
    if plan is None:
        plan = ()
        c, h, _, w = geometry.feature_map(src.shape, src.layout)
        c2, itemsize = layout.c2_for(DType(src.dtype).itemsize), DType(src.dtype).itemsize
        planes = (-(-c // c2), c2, h, w)
        rest = _plane_inputs(run, step, src, planes)
        if rest is not None and c2 * itemsize == 16 and not step.attrs.get("antialias", 0):
            from rkc.runtime.kernels import nn

            picks = nn.nearest_picks(planes, *rest, **step.attrs)
            rows, cols = picks.get(2, np.arange(h)), picks.get(3, np.arange(w))
            if set(picks) <= {2, 3} and [len(rows), len(cols)] == list(dst.shape[2:]):
                plan = (rows, cols)
        plans[id(step)] = plan
    return plan


def _plane_inputs(run, step: Step, src: TensorInfo, planes_shape: tuple[int, ...]) -> list | None:
    """The step's other inputs, restated for planes [C1, C2, H, W] (a Resize's
    scales or sizes), or None when they touch the batch or channel axes."""
    rest = [run.read(n) if n else None for n in step.inputs[1:]]
    if step.op != "Resize":
        return rest
    if step.attrs.get("axes") is not None or step.attrs.get("mode", "nearest") != "nearest" \
            or step.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return None
    roi, scales, sizes = (rest + [None, None, None])[:3]
    if sizes is not None and np.size(sizes):
        sizes = np.asarray(sizes).reshape(-1)
        if sizes.size != 4 or list(sizes[:2]) != list(src.shape[:2]):
            return None
        return [roi, scales, np.array([*planes_shape[:2], *sizes[2:]], sizes.dtype)]
    if scales is None or np.size(scales) != 4 or list(np.asarray(scales).reshape(-1)[:2]) != [1, 1]:
        return None
    return [roi, scales, sizes] if len(rest) > 2 else [roi, scales]


def _plane_op(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    if step.op == "Resize":
        picks = _resize_picks(run, step, src, dst)
        with _Held(run, [src, dst]) as (fin, fout):
            if picks and fin.flags.c_contiguous and fout.flags.c_contiguous:
                from rkc.runtime.kernels import gather_jit  # numba: loaded by programs that resize on the CPU

                gather_jit.gather_atoms(fin, *picks, fout)
                return True
    with _Held(run, [src, dst]) as (fin, fout):
        x, y = _planes(fin), _planes(fout)
        rest = _plane_inputs(run, step, src, x.shape)
        if rest is None:
            return False
        run.one_thread()
        (value,) = run_kernel(step.op, [x, *rest], step.attrs, 1)
        if value.shape != y.shape:
            raise RkcError(f"step {step.name!r}: {dst.name!r} came out {list(value.shape)} as planes, "
                           f"the program declares {dst.shape}")
        y[...] = value
    return True


def _max_pool(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A 2-D MaxPool from one feature map into another, pooled atom by atom and written
    straight into the result's bytes (pool_jit.max_pool_atoms; no copy after it), with
    its geometry worked out at the program's first run (`_max_pool_plan`)."""
    from rkc.runtime.kernels import pool_jit  # numba: loaded by programs that pool on the CPU

    return _map_to_map(run, step, src, dst, _max_pool_plan, pool_jit.max_pool_atoms)


def _map_to_map(run, step: Step, src: TensorInfo, dst: TensorInfo, make_plan, kernel) -> bool:
    """kernel(input map, *plan, output map), the step's plan made at the program's first run
    by make_plan(run, step, src, dst) (an empty plan: the step is not this case)."""
    plans = run.schedule.native_plans
    plan = plans.get(id(step))
    if plan is None:
        plan = plans[id(step)] = make_plan(run, step, src, dst)
    if not plan:
        return False
    with _Held(run, [src, dst]) as (fin, fout):
        kernel(fin, *plan, fout)
    return True


def _max_pool_plan(run, step: Step, src: TensorInfo, dst: TensorInfo) -> tuple:
    """(kernel, strides, dilations, begin pads) of a MaxPool whose output is read alone,
    between maps of a dtype pool_jit pools, the result written in place (a map stored over
    zero rows too: its groups' rows past the map's are left alone) apart from the input;
    () otherwise (the step then runs on the planes: PP-OCR cls's 200x2x96 fp16 pool, stored
    over zero rows, took 75 us that way, load 11)."""
    from rkc.runtime.kernels import conv, pool_jit

    if np.dtype(DType(src.dtype).numpy) not in pool_jit.DTYPES or list(src.shape[:2]) != list(dst.shape[:2]):
        return ()
    if src.region == dst.region and src.offset < dst.offset + dst.nbytes and dst.offset < src.offset + src.nbytes:
        return ()  # pooled in place: the plane path pools into a copy first
    try:
        kernel, strides, dilations, begin, out_hw = conv.max_pool_window(src.shape[2:], **step.attrs)
    except (TypeError, ValueError):  # attributes no MaxPool has: the interpreter's path names them
        return ()
    return (kernel, strides, dilations, begin) if out_hw == list(dst.shape[2:]) else ()


def _softmax_weights(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """Scores S [M, N] (fp16, a GEMM's output atoms) -> softmax(scale * S)^T [N, M] as fp16 run-time weights."""
    from rkc.runtime.kernels import softmax_jit  # numba: loaded by programs with attention on the NPU

    m, n = int(src.shape[-2]), int(src.shape[-1])
    if len(src.shape) != 2 or list(dst.shape) != [n, m] or dst.nbytes < geometry.nbytes(dst.shape, dst.layout, 2) \
            or src.nbytes < geometry.nbytes(src.shape, src.layout, 2):
        return False  # a module whose sizes disagree takes the interpreter's path (and its error)
    bos = {r: run.model.bos[r] for r in (src.region, dst.region)}
    device = run.model.device
    for bo in bos.values():
        device.prepare_cpu_access(bo)
    try:
        _, _, rows, _ = geometry.feature_map(src.shape, src.layout)  # GEMM rows stored padded to 4
        atoms = layout.feature_view(bos[src.region].host[src.offset:src.offset + src.nbytes], n, rows, 1, np.uint16)
        out = bos[dst.region].host[dst.offset:dst.offset + dst.nbytes].view(np.uint16)
        softmax_jit.softmax_into_weights(atoms.reshape(atoms.shape[0], rows, atoms.shape[3]), m, n, out,
                                         float(step.attrs.get("scale", 1.0)))
    finally:
        for bo in bos.values():
            device.finish_cpu_access(bo)
    return True


def _depthwise(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A 2-D depthwise Conv ([C, 1, kh, kw] weights, group C) between fp16 feature maps;
    its geometry and lane weights worked out at the program's first run."""
    from rkc.runtime.kernels import depthwise_jit  # numba: loaded by programs with such a convolution

    return _map_to_map(run, step, src, dst, _depthwise_plan, depthwise_jit.depthwise_feature)


def _depthwise_plan(run, step: Step, src: TensorInfo, dst: TensorInfo) -> tuple:
    """(lane weights, lane bias, strides, top-left pads, dilations), or () when the step is no such Conv."""
    from rkc.runtime.kernels import depthwise_jit

    weights = run.read(step.inputs[1])
    bias = run.read(step.inputs[2]) if len(step.inputs) > 2 and step.inputs[2] else None
    channels = src.shape[1]
    if len(src.shape) != 4 or weights.ndim != 4 or weights.shape[:2] != (channels, 1) \
            or int(step.attrs.get("group", 1)) != channels or list(dst.shape[:2]) != [1, channels]:
        return ()
    kernel = list(weights.shape[2:])
    if step.attrs.get("kernel_shape") is not None and list(step.attrs["kernel_shape"]) != kernel:
        return ()
    strides = [int(s) for s in step.attrs.get("strides") or (1, 1)]
    dilations = [int(d) for d in step.attrs.get("dilations") or (1, 1)]
    begin, end = geometry.pads_for(step.attrs.get("auto_pad", "NOTSET"), src.shape[2:], kernel, strides, dilations,
                                   step.attrs.get("pads"))
    out_sizes = [(i + b + e - (k - 1) * d - 1) // s + 1
                 for i, b, e, k, d, s in zip(src.shape[2:], begin, end, kernel, dilations, strides)]
    if out_sizes != list(dst.shape[2:]):
        return ()
    lanes = depthwise_jit.lane_weights(np.asarray(weights, np.float32),
                                       None if bias is None else np.asarray(bias, np.float32))
    return (*lanes, strides, begin, dilations)
