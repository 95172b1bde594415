"""The model's image input straight into the first feature map: a uint8 NHWC
image (rkc compile --image-input) and its normalisation chain (Transpose, Cast,
element-wise ops, 1x1 depthwise scales, a conversion into the map) run as one
pass through a table of every pixel value's code per channel, into the map
itself or into the map of its 2x2 blocks (compiler/passes/image_blocks.py)."""

from __future__ import annotations

import numpy as np

from rkc.ir.errors import RkcError
from rkc.ir.program import Step
from rkc.ir.types import DType
from rkc.runtime import feature_edges, native_maps
from rkc.runtime.kernels import run_kernel


def image_chain_end(steps, i: int, last_use: dict, outputs, in_map) -> int | None:
    """The index of the last step of an image chain starting at steps[i]: a
    Transpose (NHWC -> NCHW: the image taken as pixels, rkc compile --image-input),
    then Cast, element-wise feature_edges.CHAIN_OPS and 1x1 depthwise convolutions (the
    normalisation, each value a function of its channel's pixel alone), and a
    conversion into a feature map; each step's first input the previous step's
    single output that nothing else reads; `in_map(name)`: whether a tensor is a
    feature map in a BO. `image_plan` checks the rest."""
    if steps[i].kind != "cpu" or steps[i].op != "Transpose" or list(steps[i].attrs.get("perm", ())) != [0, 3, 1, 2]:
        return None
    for j in range(i + 1, len(steps)):
        step = steps[j]
        if not feature_edges.chained(steps, j, last_use, outputs):
            return None
        if step.op in feature_edges.INTO_FEATURE and len(step.outputs) == 1 and in_map(step.outputs[0]):
            return j
        if step.op not in feature_edges.CHAIN_OPS and step.op not in ("Cast", "Conv", "SpaceToDepth"):
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
            or src.shape[0] != 1 or not native_maps.in_bo(run, dst) \
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
    with native_maps.Held(run, [dst]) as (fm,):
        if not (pixels_jit.is_rgb_blocks(fm) if blocks else pixels_jit.is_image(c, fm)):
            return None
    affine = _affine_codes(tables, before_last[0, :, 0]) if blocks and dst.dtype == "fp16" else None
    return first.inputs[0], dst, tables, blocks, affine


def _affine_codes(tables: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(scales, offsets) per block lane (pixels_jit.affine_lanes) with which
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
    pixels_jit.pixels_into_blocks(image, tables, computed, pixels_jit.affine_lanes(scales, offsets))
    return pixels_jit.affine_lanes(scales, offsets) if np.array_equal(looked, computed) else None


def run_image(run, steps: list[Step], plan: tuple) -> bool:
    """Run an image chain by its plan: the uint8 pixels straight into the map
    (or into the map of its 2x2 blocks)."""
    from rkc.runtime.kernels import pixels_jit

    name, dst, tables, blocks, affine = plan
    pixels = run.read(name)
    if pixels.dtype != np.uint8 or pixels.ndim != 4:
        return False
    with native_maps.Held(run, [dst]) as (fm,):
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
