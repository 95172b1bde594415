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
  pooled or copied like any other: they hold what the NPU wrote there;
  runtime/map_ops.py);
* a depthwise convolution between fp16 maps (one the NPU refuses: a window over
  fewer than 4 rows) with constant weights: runtime/kernels/depthwise_jit.py on
  the atoms (runtime/map_ops.py);
* attention's softmax between two NPU products: the fp16 scores read where the
  first GEMM wrote them, the probabilities written as atoms of the same layout, the
  second GEMM's A (ScaledSoftmax), or as its run-time weights (SoftmaxTranspose)
  (runtime/kernels/softmax_jit.py, runtime/map_ops.py);
* a Relayout between fp16 NPU buffers (compiler/relayout.py): each result's index map
  turned, at load, into native element positions of each source and of the result,
  then one gather per source and result (runtime/relayout_edges.py).

A uint8 image's chain into the first map runs as one pass (runtime/image_edges.py,
called by runtime/execute.py); where a map lies and how the host holds it is
runtime/native_maps.py.

`run_step(run, step)` runs a step this way when its tensors allow it and says
whether it did; any other step takes the interpreter's path. The model's input and
output edges are worked out at their first run into closures that later runs call
straight (`_input_edge`, `_output_edge`). The values are
the kernels' own (tests/runtime/test_feature_edges.py).
"""

from __future__ import annotations

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.program import Step, TensorInfo
from rkc.ir.types import DType
from rkc.runtime import map_ops, native_maps, relayout_edges
from rkc.runtime.kernels import run_kernel

PLANE_OPS = frozenset({"MaxPool", "Resize"})


def one_scale(run, step: Step) -> tuple[float, int] | None:
    """(scale, zero point) of a per-tensor (De)QuantizeLinear with an int8 zero point;
    read once when both are the program's constants (a step of the first run keeps them)."""
    if len(step.inputs) != 3 or not step.inputs[2] or step.attrs.get("block_size", 0):
        return None
    key = _scale_key(step)
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


def scale_is_constant(run, step: Step) -> bool:
    """Whether `one_scale` found the step's scale and zero point among the program's
    constants (then they are the same every run, and a closure may keep them)."""
    return _scale_key(step) in run.schedule.native_plans


def _scale_key(step: Step) -> tuple:
    return "scale", id(step)


def run_step(run, step: Step) -> bool:
    """Run `step` on the native layout of its feature maps if it is one of the
    cases above (True), else do nothing (False). A step worked out at its first run into a
    closure (`_input_edge`) is kept under native_maps.prepared_key, which runtime/execute.py's
    `cpu` calls from then on, before this."""
    if step.op == "Relayout":  # (one step may gather several results)
        return relayout_edges.relayout(run, step)
    if len(step.outputs) != 1 or not step.inputs or not step.inputs[0]:
        return False
    tensors = run.model.tensors
    src, dst = tensors.get(step.inputs[0]), tensors.get(step.outputs[0])
    if src is None or dst is None:
        return False
    if step.op in ("Cast", "QuantizeLinear") and src.region is None and (form := native_maps.edge_form(run, dst)):
        return _input_edge(run, step, src, dst) if form == "map" else _rows_edge(run, step, src, dst)
    if step.op in ("Cast", "DequantizeLinear") and dst.region is None and (form := native_maps.edge_form(run, src)):
        return _output_edge(run, step, src, dst) if form == "map" else _rows_edge(run, step, src, dst)
    if step.op in PLANE_OPS and native_maps.in_bo(run, src) and native_maps.in_bo(run, dst) and src.dtype == dst.dtype:
        return (step.op == "MaxPool" and map_ops.max_pool(run, step, src, dst)) or map_ops.plane_op(run, step, src, dst)
    if step.op == "Conv" and native_maps.in_bo(run, src) and native_maps.in_bo(run, dst) and src.dtype == dst.dtype == DType.FP16:
        return map_ops.depthwise(run, step, src, dst)
    if (step.op, dst.layout) in (("ScaledSoftmax", "native-gemm"), ("SoftmaxTranspose", "native-weights")) \
            and src.layout == "native-gemm" and src.dtype == dst.dtype == DType.FP16 \
            and src.region in run.model.bos and dst.region in run.model.bos:
        return map_ops.softmax_probabilities(run, step, src, dst)
    return False


# element-wise ops a recoding chain may pass through: each output element a function of the same
# input element alone (other inputs constants of one value), so a table of every code's result is exact
CHAIN_OPS = frozenset({"Relu", "LeakyRelu", "Clip", "Abs", "Neg", "Identity", "Sigmoid", "HardSigmoid",
                       "HardSwish", "Swish", "Tanh", "Add", "Sub", "Mul", "Div", "Max", "Min"})
_OUT_OF_FEATURE = ("DequantizeLinear", "Cast")
INTO_FEATURE = ("QuantizeLinear", "Cast")


def chained(steps, j: int, last_use: dict, outputs) -> bool:
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
        if not chained(steps, j, last_use, outputs):
            return None
        if step.op in INTO_FEATURE:
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
    with native_maps.Held(run, [src, dst]) as (fin, fout):
        codes_in = fin.view(np.uint8 if src.dtype == "int8" else np.uint16)
        if overlap:
            codes_in = codes_in.copy()
        codes_out = fout.view(np.uint16 if dst.dtype == "fp16" else np.uint8)
        codes_in, codes_out = native_maps.long_lines(codes_in, codes_out)
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
    if None in (src, dst) or not (native_maps.in_bo(run, src) and native_maps.in_bo(run, dst)) or list(src.shape) != list(dst.shape) \
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

    if mid is None or dst is None or mid.region is not None or mid.dtype != "fp32" or not native_maps.in_bo(run, dst) \
            or dst.dtype != "int8" or list(mid.shape) != list(dst.shape) or len(dst.shape) != 4 or dst.shape[0] != 1:
        return False
    params = one_scale(run, following)
    inputs = [run.read(n) if n else None for n in step.inputs]
    if params is None or inputs[0] is None or inputs[0].dtype != np.float32:
        return False
    tiles = conv.conv_transpose_tiles(*inputs, **step.attrs)
    if tiles is None or tiles.ndim != 6 or list(tiles.shape[:2]) != list(dst.shape[:2]) \
            or [tiles.shape[2] * tiles.shape[4], tiles.shape[3] * tiles.shape[5]] != list(dst.shape[2:]):
        return False
    with native_maps.Held(run, [dst]) as (fm,):
        quant_jit.quantize_tiles_into_feature(tiles[0], *params, fm)
    return True


def _input_edge(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A float32 map quantized or rounded to fp16 into a feature map (an image: whole atoms
    in one pass, pixels_jit). Worked out at its first run into a closure runtime/execute.py calls
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
        params = one_scale(run, step)
        if params is None or dst.dtype != "int8":
            return False
    bo, lo, hi, dtype, stored, h = native_maps.place(run, dst)
    hold, shape, name = native_maps.Hold(run.model.device, [bo]), tuple(dst.shape), step.inputs[0]
    with hold:  # (a view only while the BO is held)
        image = pixels_jit.is_image(shape[1], bo.host[lo:hi].view(dtype).reshape(stored)[:, :h])
    if params is None and image:
        def kernel(planes, fm):
            pixels_jit.narrow_image(planes.view(np.uint32), fm.view(np.uint16))
    elif params is None:
        def kernel(planes, fm):
            half.narrow_into_feature(*native_maps.long_lines(planes.view(np.uint32), fm.view(np.uint16)))
    elif image:
        def kernel(planes, fm):
            pixels_jit.quantize_image(planes, *params, fm)
    else:
        def kernel(planes, fm):
            x, fm = native_maps.long_lines(planes, fm)
            quant_jit.quantize_into_feature(x, *params, fm)

    def edge(run) -> bool:
        value = run.read(name)
        if value.dtype != np.float32 or value.shape != shape:
            return False  # (the interpreter's path then names what is wrong)
        with hold:
            kernel(value.reshape(shape[1:]), bo.host[lo:hi].view(dtype).reshape(stored)[:, :h])
        return True

    edge(run)
    if params is None or scale_is_constant(run, step):  # its scale a constant, read once
        run.schedule.native_plans[native_maps.prepared_key(run, step)] = edge
    return True


def _output_edge(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A feature map dequantized or widened into the row-major result (or handed over as
    its fp16 values: `keeps_fp16`). Worked out at its first run into a closure runtime/execute.py
    calls from then on: hold the BO, run the kernel, keep the result (the checks, places,
    imports and views around the logits' ~5 us kernel cost ~15 us a run, load 10). A map
    stored row after row (no taller surfaces) is seen, with the output, as long lines
    ([C1, 1, H * W, C2], [C, 1, H * W]: native_maps.long_lines' form) straight from the BO's
    bytes (a detector's six fp16 outputs: ~10 us of a ~45 us step, load 10)."""
    from rkc.runtime import half
    from rkc.runtime.kernels import quant_jit

    if dst.dtype != "fp32" or list(src.shape) != list(dst.shape):
        return False
    kept = run.keeps_fp16(step)  # the caller takes the NPU's fp16 values as they are
    params = None
    if step.op == "Cast" or kept:
        if src.dtype != "fp16":
            return False
        kernel = half.unpack_feature_bits if kept else half.widen_feature
        codes, values = np.uint16, np.uint16 if kept else np.uint32  # (bits both sides)
    else:
        params = one_scale(run, step)
        if params is None or src.dtype != "int8":
            return False

        def dequantize(fm, planes):
            quant_jit.dequantize_feature(fm, *params, planes)
        kernel, codes, values = dequantize, np.int8, np.float32
    bo, lo, hi, _, stored, h = native_maps.place(run, src)
    hold, shape, name = native_maps.Hold(run.model.device, [bo]), tuple(dst.shape), step.outputs[0]
    c1, rows, w, c2 = stored
    lines = rows == h and len(shape) == 4
    fm_shape, out_shape = ((c1, 1, h * w, c2), (shape[1], 1, h * w)) if lines else (stored, shape[1:])
    if lines and params is None:  # (both C-contiguous: the BO's bytes and a new array)
        kernel = half.feature_rows_kernel(fm_shape, out_shape, kept)
    out_dtype = np.float16 if kept else np.float32

    def edge(run) -> bool:
        out = np.empty(shape, out_dtype)
        with hold:  # the view made while the BO is held
            fm = bo.host[lo:hi].view(codes).reshape(fm_shape)
            kernel(fm if lines else fm[:, :h], out.view(values).reshape(out_shape))
        run.env[name] = out  # (a host tensor: dst has no region)
        return True

    edge(run)
    if params is None or scale_is_constant(run, step):  # its scale a constant, read once
        run.schedule.native_plans[native_maps.prepared_key(run, step)] = edge
    return True


def _rows_edge(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """An fp16 Cast into or out of a GEMM operand [M, K] ([K/C2][rows][C2] atoms): rounded
    straight into the atoms (rows past M and channels past K zeroed) or widened straight
    out of them (runtime/half.py, numpy's bits), as runtime/plan.py's edges do. Worked out
    at its first run into a closure `run_step` calls from then on (the checks and places
    around the ~2 us kernel cost ~10 us a run, as `_output_edge`'s did)."""
    from rkc.runtime import half

    into = src.region is None
    gemm, other = (dst, src) if into else (src, dst)
    if step.op != "Cast" or gemm.dtype != "fp16" or other.dtype != "fp32" or list(src.shape) != list(dst.shape) \
            or (not into and run.keeps_fp16(step)):
        return False
    m, k = int(gemm.shape[-2]), int(gemm.shape[-1])
    bo, lo, hi, _, (c1, rows, _, c2), _ = native_maps.place(run, gemm)
    hold, shape = native_maps.Hold(run.model.device, [bo]), tuple(dst.shape)
    name = step.inputs[0] if into else step.outputs[0]

    if into:
        def edge(run) -> bool:
            value = run.read(name)
            if value.dtype != np.float32 or value.shape != shape:
                return False  # (the interpreter's path then names what is wrong)
            with hold:  # every stored row: zeroed past M
                atoms = bo.host[lo:hi].view(np.uint16).reshape(c1, rows, c2)
                half.narrow_into_atoms(value.reshape(m, k).view(np.uint32), atoms)
            return True
    else:
        def edge(run) -> bool:
            out = np.empty((m, k), np.float32)
            with hold:
                half.widen_atoms(bo.host[lo:hi].view(np.uint16).reshape(c1, rows, c2), m, k, out.T.view(np.uint32))
            run.env[name] = out.reshape(shape)
            return True

    if not edge(run):
        return False
    run.schedule.native_plans[native_maps.prepared_key(run, step)] = edge
    return True
