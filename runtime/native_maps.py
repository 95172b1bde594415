"""Where an NPU feature map lies and how the host sees it: its bytes as [C1, H, W, C2]
atoms, its placement in a BO worked out once per tensor, the maps held for CPU
access while a step runs. Shared by the CPU steps that work on the native layout
(feature_edges.py, image_edges.py, map_ops.py, relayout_edges.py)."""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from rkc.ir.npu import geometry, layout
from rkc.ir.program import TensorInfo
from rkc.ir.types import DType


def feature(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as its feature map [C1, H, W, C2] (a strided view of a map
    stored in taller surfaces than its rows: its zero rows are left alone)."""
    dtype, stored, _, h = feature_form(info.dtype, info.layout, tuple(info.shape))
    return layout.feature_view(raw, stored[0] * stored[3], stored[1], stored[2], dtype)[:, :h]


@functools.lru_cache(maxsize=4096)
def feature_form(dtype: str, kind: str, shape: tuple[int, ...]) -> tuple:
    """(numpy dtype, stored shape [C1, rows, W, C2], its bytes, logical rows) of a feature
    map, worked out once per form (with `place`, ~7 us of every CPU step at a map before)."""
    c, h, rows, w = geometry.feature_map(shape, kind)
    dtype = DType(dtype).numpy
    c2 = layout.c2_for(dtype.itemsize)
    c1 = -(-c // c2)
    return dtype, (c1, rows, w, c2), c1 * rows * w * c2 * dtype.itemsize, h


def planes(fm: np.ndarray) -> np.ndarray:
    """A feature map [C1, H, W, C2] as planes [C1, C2, H, W] (a view)."""
    return fm.transpose(0, 3, 1, 2)


def long_lines(*maps: np.ndarray) -> tuple[np.ndarray, ...]:
    """Feature maps [C1, H, W, C2] and row-major maps [C, H, W] of one shape seen as
    one line per channel group ([C1, 1, H * W, C2], [C, 1, H * W]) when all are
    contiguous, so that the edge kernels, which work a line at a time, run long
    vectorised loops: on a 13x13 map a line's fixed cost was most of the time
    (512x13x13 quantized into its map 0.37 -> 0.06 ms). Otherwise as they are."""
    if not all(m.flags.c_contiguous for m in maps):
        return maps
    return tuple(m.reshape(m.shape[0], 1, m.shape[1] * m.shape[2], *m.shape[3:]) for m in maps)


class Hold:
    """Some BOs held for CPU access over a `with` block (prepare_cpu_access on entry,
    finish_cpu_access on exit, also on an error). Made once with a step's plan and entered
    every run: a plain object, not a generator per run (the steps around it cost ~5-10 us)."""

    __slots__ = ("bos", "prepare", "finish")

    def __init__(self, device, bos) -> None:
        self.bos = tuple({id(bo): bo for bo in bos}.values())
        self.prepare, self.finish = device.prepare_cpu_access, device.finish_cpu_access

    def __enter__(self) -> None:
        for bo in self.bos:
            self.prepare(bo)  # host is writable from here on

    def __exit__(self, *exc) -> None:
        for bo in self.bos:
            self.finish(bo)


class Held:
    """The feature maps of some BO tensors, held for CPU access while a step runs. Where
    each lies (its BO, its bytes, its stored shape) is worked out once per tensor and kept
    with the program's plans (`place`); the views are made each time, inside the bracket."""

    def __init__(self, run, infos: list[TensorInfo]) -> None:
        self.places = [place(run, info) for info in infos]
        self.hold = Hold(run.model.device, [p[0] for p in self.places])

    def __enter__(self) -> list[np.ndarray]:
        self.hold.__enter__()
        return _views(self.places)

    def __exit__(self, *exc) -> None:
        self.hold.__exit__()


def _views(places) -> list[np.ndarray]:
    return [bo.host[lo:hi].view(dtype).reshape(stored)[:, :h] for bo, lo, hi, dtype, stored, h in places]


def _stored(places) -> list[np.ndarray]:
    return [bo.host[lo:hi].view(dtype).reshape(stored) for bo, lo, hi, dtype, stored, _ in places]


def prepared_key(run, step) -> tuple:
    """Where a step's closure prepared at its first run is kept (runtime/execute.py's `cpu` calls it)."""
    return "prepared", id(step), run.fp16_outputs


def held_step(run, infos: list[TensorInfo], body: Callable[..., bool], stored: bool = False) \
        -> Callable[[object], bool]:
    """A step's closure for later runs: body(run, *maps) with the feature maps of `infos`
    held for CPU access (as Held, their places worked out now, once), its result the
    step's (False: the interpreter's path takes the run). Held's per-run work and the
    dispatch to the step's kind cost ~10-15 us a step (load 2-6). `stored`: each map as
    the C-contiguous array it is stored in [C1, stored rows, W, C2] (a map stored over zero
    rows whole), for a body that reads its rows in place."""
    places = [place(run, info) for info in infos]
    hold = Hold(run.model.device, [p[0] for p in places])
    views = _stored if stored else _views

    def step(run) -> bool:
        with hold:  # (the views only while the BOs are held)
            return body(run, *views(places))

    return step


def place(run, info: TensorInfo) -> tuple:
    """(BO, first byte, end, numpy dtype, stored shape [C1, rows, W, C2], logical rows) of a
    feature map in a BO, kept per tensor with the program's plans (a run's BOs and tensors
    live as long as its schedule)."""
    plans = run.schedule.native_plans
    key = ("place", id(info))
    place = plans.get(key)
    if place is None:
        dtype, stored, nbytes, h = feature_form(info.dtype, info.layout, tuple(info.shape))
        bo = run.model.bos[info.region]
        if nbytes > info.nbytes or info.offset + nbytes > bo.host.size:
            layout.feature_view(bo.host[info.offset:info.offset + info.nbytes], stored[0] * stored[3], stored[1],
                                stored[2], dtype)  # raises, naming the shortfall
        place = plans[key] = (bo, info.offset, info.offset + nbytes, dtype, stored, h)
    return place


def in_bo(run, info: TensorInfo | None) -> bool:
    return info is not None and info.region is not None and info.region in run.model.bos \
        and info.layout == "native"


def edge_form(run, info: TensorInfo | None) -> str | None:
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
