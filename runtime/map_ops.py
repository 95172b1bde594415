"""CPU ops from one NPU feature map to another, on the maps' own layout: ops that
work plane by plane and only select values (MaxPool without its indices, nearest
Resize), a depthwise convolution the NPU refuses, and attention's softmax between
two NPU products (ScaledSoftmax, SoftmaxTranspose). feature_edges.run_step dispatches
to them."""

from __future__ import annotations

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.npu import geometry, layout
from rkc.ir.program import Step, TensorInfo
from rkc.ir.types import DType
from rkc.runtime import native_maps
from rkc.runtime.kernels import run_kernel


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


def plane_op(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    if step.op == "Resize":
        picks = _resize_picks(run, step, src, dst)
        with native_maps.Held(run, [src, dst]) as (fin, fout):
            if picks and fin.flags.c_contiguous and fout.flags.c_contiguous:
                from rkc.runtime.kernels import gather_jit  # numba: loaded by programs that resize on the CPU

                gather_jit.gather_atoms(fin, *picks, fout)
                return True
    with native_maps.Held(run, [src, dst]) as (fin, fout):
        x, y = native_maps.planes(fin), native_maps.planes(fout)
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


def max_pool(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A 2-D MaxPool from one feature map into another, pooled atom by atom and written
    straight into the result's bytes (pool_jit.atoms_pooler; no copy after it), with
    its geometry worked out at the program's first run (`_max_pool_plan`)."""
    return _map_to_map(run, step, src, dst, _max_pool_plan, stored=True)


def _map_to_map(run, step: Step, src: TensorInfo, dst: TensorInfo, make_kernel, stored: bool = False) -> bool:
    """kernel(input map, output map), made at the program's first run by
    make_kernel(run, step, src, dst) (None: the step is not this case), and the step
    prepared for later runs (native_maps.held_step; `stored`: the kernel takes the arrays
    the maps are stored in)."""
    plans = run.schedule.native_plans
    kernel = plans.get(id(step))
    if kernel is None:
        kernel = plans[id(step)] = make_kernel(run, step, src, dst) or ()
    if not kernel:
        return False

    def body(run, fin, fout) -> bool:
        kernel(fin, fout)
        return True

    prepared = plans[native_maps.prepared_key(run, step)] = native_maps.held_step(run, [src, dst], body, stored)
    return prepared(run)


def _max_pool_plan(run, step: Step, src: TensorInfo, dst: TensorInfo):
    """The pool (pool_jit.atoms_pooler) of a MaxPool whose output is read alone, between maps
    of a dtype pool_jit pools, the result written in place (a map stored over zero rows too:
    its groups' rows past the map's are left alone) apart from the input; None otherwise
    (the step then runs on the planes: PP-OCR cls's 200x2x96 fp16 pool, stored over zero
    rows, took 75 us that way, load 11)."""
    from rkc.runtime.kernels import conv, pool_jit  # numba: loaded by programs that pool on the CPU

    if np.dtype(DType(src.dtype).numpy) not in pool_jit.DTYPES or list(src.shape[:2]) != list(dst.shape[:2]):
        return None
    if src.region == dst.region and src.offset < dst.offset + dst.nbytes and dst.offset < src.offset + src.nbytes:
        return None  # pooled in place: the plane path pools into a copy first
    try:
        kernel, strides, dilations, begin, out_hw = conv.max_pool_window(src.shape[2:], **step.attrs)
    except (TypeError, ValueError):  # attributes no MaxPool has: the interpreter's path names them
        return None
    if out_hw != list(dst.shape[2:]):
        return None
    dtype, stored_in, _, h_in = native_maps.feature_form(src.dtype, src.layout, tuple(src.shape))
    _, stored_out, _, h_out = native_maps.feature_form(dst.dtype, dst.layout, tuple(dst.shape))
    try:
        return pool_jit.atoms_pooler(dtype, (stored_in[0], h_in, *stored_in[2:]), (stored_out[0], h_out, *stored_out[2:]),
                                     kernel, strides, dilations, begin)
    except ValueError:  # not whole 16-byte atoms
        return None


def softmax_probabilities(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """Scores S [M, N] (fp16, a GEMM's output atoms) -> softmax(scale * S) over the keys, written
    as P's atoms in the scores' own layout (ScaledSoftmax: the next product's A, "native-gemm";
    dst may be src's bytes) or as P^T [N, M]'s fp16 run-time weights (SoftmaxTranspose). Where
    the bytes lie is worked out at the program's first run (`_softmax_plan`: ~20 us a step
    every run before) into a closure runtime/execute.py calls from then on; the views are
    made inside the hold bracket each run."""
    plans = run.schedule.native_plans
    plan = plans.get(id(step))
    if plan is None:
        plan = plans[id(step)] = _softmax_plan(run, step, src, dst)
    if not plan:
        return False
    kernel, m, n, scale, places = plan
    hold = native_maps.Hold(run.model.device, [bo for bo, *_ in places])

    def probabilities(run) -> bool:
        with hold:
            atoms, out = (bo.host[lo:hi].view(np.uint16).reshape(shape) for bo, lo, hi, shape in places)
            kernel(atoms, m, n, out, scale)
        return True

    plans[native_maps.prepared_key(run, step)] = probabilities
    return probabilities(run)


def _softmax_plan(run, step: Step, src: TensorInfo, dst: TensorInfo) -> tuple:
    """(kernel, M, N, scale, [(BO, first byte, end, shape) of the scores, of the result]), or ()
    when the sizes disagree (the step then takes the interpreter's path, and its error)."""
    from rkc.runtime.kernels import softmax_jit  # numba: loaded by programs with attention on the NPU

    m, n = int(src.shape[-2]), int(src.shape[-1])
    into_atoms = dst.layout == "native-gemm"
    if len(src.shape) != 2 or list(dst.shape) != ([m, n] if into_atoms else [n, m]) \
            or dst.nbytes < geometry.nbytes(dst.shape, dst.layout, 2) or src.nbytes < geometry.nbytes(src.shape, src.layout, 2):
        return ()
    _, _, rows, _ = geometry.feature_map(src.shape, src.layout)  # GEMM rows stored padded to 4
    atoms = (-(-n // layout.c2_for(2)), rows, layout.c2_for(2))
    out = atoms if into_atoms else (geometry.nbytes(dst.shape, dst.layout, 2) // 2,)
    places = [(run.model.bos[t.region], t.offset, t.offset + 2 * int(np.prod(shape)), shape)
              for t, shape in ((src, atoms), (dst, out))]
    kernel = softmax_jit.softmax_into_atoms if into_atoms else softmax_jit.softmax_into_weights
    return kernel, m, n, float(step.attrs.get("scale", 1.0)), places


def depthwise(run, step: Step, src: TensorInfo, dst: TensorInfo) -> bool:
    """A 2-D depthwise Conv ([C, 1, kh, kw] weights, group C) between fp16 feature maps;
    its geometry and lane weights worked out at the program's first run."""
    return _map_to_map(run, step, src, dst, _depthwise_plan)


def _depthwise_plan(run, step: Step, src: TensorInfo, dst: TensorInfo):
    """depthwise_jit.depthwise_feature with the step's lane weights, lane bias, strides,
    top-left pads and dilations, or None when the step is no such Conv."""
    from rkc.runtime.kernels import depthwise_jit  # numba: loaded by programs with such a convolution

    weights = run.read(step.inputs[1])
    bias = run.read(step.inputs[2]) if len(step.inputs) > 2 and step.inputs[2] else None
    channels = src.shape[1]
    if len(src.shape) != 4 or weights.ndim != 4 or weights.shape[:2] != (channels, 1) \
            or int(step.attrs.get("group", 1)) != channels or list(dst.shape[:2]) != [1, channels]:
        return None
    kernel = list(weights.shape[2:])
    if step.attrs.get("kernel_shape") is not None and list(step.attrs["kernel_shape"]) != kernel:
        return None
    strides = [int(s) for s in step.attrs.get("strides") or (1, 1)]
    dilations = [int(d) for d in step.attrs.get("dilations") or (1, 1)]
    begin, end = geometry.pads_for(step.attrs.get("auto_pad", "NOTSET"), src.shape[2:], kernel, strides, dilations,
                                   step.attrs.get("pads"))
    out_sizes = [(i + b + e - (k - 1) * d - 1) // s + 1
                 for i, b, e, k, d, s in zip(src.shape[2:], begin, end, kernel, dilations, strides)]
    if out_sizes != list(dst.shape[2:]):
        return None
    weights, bias = depthwise_jit.lane_weights(np.asarray(weights, np.float32),
                                               None if bias is None else np.asarray(bias, np.float32))
    return lambda fin, fout: depthwise_jit.depthwise_feature(fin, weights, bias, strides, begin, dilations, fout)
