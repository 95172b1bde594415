"""The products of one segment onto the cores, balanced by modelled time.

Each GEMM on its own cuts N evenly over the cores (gemm.py), so a segment of
three products (q/k/v) gives every core one task of each. A decode product is a
weight stream (one row of activations), and int8 segments are kicked task by
task (hardware question Q1): three tasks a core are three 30 us kicks for a
third of a megabyte, more than the DMA time itself. Here the segment's products
are laid end to end as one run of output channels (in the order that gives the
shortest segment) and the run is cut into one contiguous range per core, so
that each core runs as few tasks as it can and the cores' modelled times
(ir/npu/perf.py: MAC or DMA time at one core's share of DRAM, plus its kicks:
one per task where the segment is kicked task by task, else one: the products
are independent, so each core's tasks of the segment are one chained job,
assemble.py)
are as equal as the kernel-group granularity allows: a core whose range crosses
a product boundary runs one task more, so it gets fewer bytes.

The cut changes which core computes which output channels, never a channel's
arithmetic (every task still contracts its channels over the whole K).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Sequence

from rkc.compiler.npu import api, gemm, schedule
from rkc.compiler.npu.conv_core import kernel_group
from rkc.ir.npu import layout
from rkc.ir.npu.perf import PerfModel, TaskCost

MODEL = PerfModel()
MAX_ORDERS = 720  # products in a segment whose every order is tried (6!); past that, the given order
SEARCH_STEPS = 32  # bisection steps on the segment time (to 2^-32 of it)


@dataclass(frozen=True)
class Product:
    """What the placement needs of a GEMM: its shape and element sizes."""

    rows: int  # rows the NPU reads (api.gemm_rows)
    k: int
    n: int
    dtype: str  # "int8", "fp16" or "int4" (one K group of an int4 GEMM)
    out_itemsize: int

    @classmethod
    def of(cls, op: api.Gemm) -> "Product":
        return cls(api.gemm_rows(op.m), op.k, op.n, op.a.dtype, api.ITEMSIZE[op.c.dtype])

    @property
    def group(self) -> int:
        return kernel_group(self.dtype)

    @property
    def units(self) -> int:
        """Kernel groups of N: the granularity a task's output channels start at."""
        return -(-self.n // self.group)

    def channels(self, u0: int, u1: int) -> tuple[int, int]:
        start = u0 * self.group
        return start, min(self.n, u1 * self.group) - start

    def task_cost(self, nt: int) -> TaskCost:
        """One task of `nt` output channels: its MACs and DMA bytes (weights, the
        feature it reads, the output it writes; regcmd left out, the same for every cut)."""
        bits = api.BITS[self.dtype]
        kernels = layout.align(nt, self.group)
        k_hw = layout.align(self.k, layout.CHANNEL_GROUP)
        dma = (kernels * k_hw + self.rows * k_hw) * bits // 8 + self.rows * nt * self.out_itemsize
        return TaskCost(self.rows * self.k * kernels, dma, self.dtype)


NRange = tuple[int, int, int]  # (first output channel, channels, lane)


def _pieces(size: int, n_tile_max: int, group: int) -> list[tuple[int, int]]:
    """The tasks the emitter cuts one range of `size` channels into (gemm.py does the same)."""
    return schedule.split_evenly(size, -(-size // n_tile_max), group)


class _Lanes:
    """Modelled time of a contiguous run of units of the concatenated products."""

    def __init__(self, products: Sequence[Product], per_task_kicks: bool, n_tile_max: int, model: PerfModel,
                 task_times: dict | None = None):
        self.products = products
        self.per_task_kicks = per_task_kicks
        self.n_tile_max = n_tile_max
        self.model = model
        self.bounds = list(itertools.accumulate((p.units for p in products), initial=0))
        # (product, channels) -> its tasks' modelled seconds: the search asks the same
        # ranges' times ~10^6 times per segment; shared by the orders of one segment
        self.task_times = {} if task_times is None else task_times

    @property
    def total(self) -> int:
        return self.bounds[-1]

    def spans(self, u0: int, u1: int):
        """(product index, first unit, end unit) of the run [u0, u1)."""
        for i, p in enumerate(self.products):
            lo, hi = max(u0, self.bounds[i]), min(u1, self.bounds[i + 1])
            if lo < hi:
                yield i, lo - self.bounds[i], hi - self.bounds[i]

    def seconds(self, u0: int, u1: int) -> float:
        busy, tasks, jobs = 0.0, 0, 0
        for i, a, b in self.spans(u0, u1):
            for task in self._task_seconds(self.products[i], a, b):
                busy += task  # task by task, in order: the same sum as ever, so the same cuts
                tasks += 1
            jobs += 1
        return busy + (tasks if self.per_task_kicks else min(jobs, 1)) * self.model.kick_overhead_s

    def _task_seconds(self, p: Product, u0: int, u1: int) -> tuple[float, ...]:
        """The modelled seconds of each task the emitter cuts p's units [u0, u1) into."""
        size = p.channels(u0, u1)[1]
        times = self.task_times.get((p, size))
        if times is None:
            times = tuple(self.model.task_seconds(p.task_cost(nt)) for _, nt in _pieces(size, self.n_tile_max, p.group))
            self.task_times[p, size] = times
        return times

    def longest_within(self, u0: int, limit: float) -> int:
        """The furthest end u1 with seconds(u0, u1) <= limit (time grows with the run)."""
        lo, hi = u0, self.total
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.seconds(u0, mid) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def cut(self, lanes: int, limit: float) -> list[int] | None:
        """Greedy cut points (lanes + 1 of them) with every lane within `limit`, or None."""
        cuts = [0]
        for _ in range(lanes):
            cuts.append(self.longest_within(cuts[-1], limit))
        return cuts if cuts[-1] == self.total else None

    def balanced(self, lanes: int) -> tuple[float, list[int]]:
        """The smallest longest-lane time over contiguous cuts, and its cut points."""
        lo, hi = 0.0, self.seconds(0, self.total)
        best = self.cut(lanes, hi)
        for _ in range(SEARCH_STEPS):
            mid = (lo + hi) / 2
            cuts = self.cut(lanes, mid)
            if cuts is None:
                lo = mid
            else:
                hi, best = mid, cuts
        return max(self.seconds(a, b) for a, b in zip(best, best[1:])), best


def even_split(product: Product, cores: int, n_tile_max: int) -> tuple[NRange, ...]:
    """The ranges the emitter gives a one-tile-row GEMM on its own (gemm.py's even split)."""
    n_parts = max(-(-product.n // n_tile_max), min(cores, product.units))
    tiles = schedule.split_evenly(product.n, n_parts, product.group)
    return tuple((start, size, schedule.lane_of(i, len(tiles), cores)) for i, (start, size) in enumerate(tiles))


def segment_seconds(products: Sequence[Product], ranges: Sequence[Sequence[NRange]], per_task_kicks: bool,
                    n_tile_max: int, model: PerfModel = MODEL) -> float:
    """The modelled time of the segment so placed: its longest lane, or all its
    bytes at the DRAM bandwidth (ir/npu/perf.py submission_seconds)."""
    lanes: dict[int, list[float]] = {}  # lane -> [busy seconds, tasks]
    dram = 0
    for p, rs in zip(products, ranges):
        for _, size, lane in rs:
            lane_sum = lanes.setdefault(lane, [0.0, 0])
            for _, nt in _pieces(size, n_tile_max, p.group):
                cost = p.task_cost(nt)
                lane_sum[0] += model.task_seconds(cost)
                lane_sum[1] += 1
                dram += cost.dma_bytes
    # chained: a core's tasks of the segment are one job (assemble.py, independent operations)
    longest = max((busy + (tasks if per_task_kicks else 1) * model.kick_overhead_s for busy, tasks in lanes.values()),
                  default=0.0)
    return max(longest, dram / model.dram_bytes_per_s)


def place(products: Sequence[Product], cores: int, per_task_kicks: bool, n_tile_max: int,
          model: PerfModel = MODEL) -> list[tuple[NRange, ...]]:
    return list(_place(tuple(products), cores, per_task_kicks, n_tile_max, model))


@functools.lru_cache(maxsize=256)  # every layer's segment of a model has the same shapes
def _place(products: tuple[Product, ...], cores: int, per_task_kicks: bool, n_tile_max: int,
           model: PerfModel) -> tuple[tuple[NRange, ...], ...]:
    """Per product, its N ranges and their lanes: every product's channels
    covered once, each lane one contiguous run of the products laid end to end.
    Where that is no faster than each product's even split (a segment the DRAM
    bandwidth bounds either way, such as the output head), the even split."""
    order_count = 1
    for i in range(2, len(products) + 1):
        order_count *= i
    orders = (itertools.permutations(range(len(products))) if order_count <= MAX_ORDERS
              else [tuple(range(len(products)))])
    best = None
    task_times: dict = {}
    tried = set()
    for order in orders:
        run = tuple(products[i] for i in order)
        if run in tried:  # equal products swapped (an int4 GEMM's equal K groups): the same time, never better
            continue
        tried.add(run)
        lanes = _Lanes(run, per_task_kicks, n_tile_max, model, task_times)
        seconds, cuts = lanes.balanced(cores)
        if best is None or seconds < best[0] - 1e-12:
            best = seconds, order, lanes, cuts
    _, order, lanes, cuts = best
    ranges: list[list[NRange]] = [[] for _ in products]
    for lane, (u0, u1) in enumerate(zip(cuts, cuts[1:])):
        for j, a, b in lanes.spans(u0, u1):
            start, size = lanes.products[j].channels(a, b)
            ranges[order[j]].append((start, size, lane))
    placed = [tuple(sorted(r)) for r in ranges]
    even = [even_split(p, cores, n_tile_max) for p in products]
    if segment_seconds(products, placed, per_task_kicks, n_tile_max, model) < \
            segment_seconds(products, even, per_task_kicks, n_tile_max, model) * (1 - 1e-9):
        return tuple(placed)
    return tuple(even)


def place_segment(ops: Sequence[api.Gemm], options: api.EmitOptions, per_task_kicks: bool) -> list[api.Gemm]:
    """The segment's GEMMs with their N ranges placed together, where each is one
    task row (a single M and K tile: decode and short prefill products); a
    segment with a bigger product keeps every GEMM's own even split."""
    if not ops or any(not gemm.single_tile_row(op, options) for op in ops):
        return list(ops)
    products = [Product.of(op) for op in ops]
    ranges = place(products, options.cores, per_task_kicks, options.n_tile_max)
    return [op if r == even_split(p, options.cores, options.n_tile_max) else replace(op, placement=r)
            for op, p, r in zip(ops, products, ranges)]


def place_segment_int4(ops: Sequence[api.GemmInt4], options: api.EmitOptions) -> list[api.GemmInt4]:
    """The segment's int4 GEMMs placed together as above: each K group of each
    product is one product here (its own weights, its own int16 output), every
    task kicked on its own (Q1). Only which core computes a channel changes."""
    from rkc.compiler.npu.gemm_int4 import segments_of

    pieces = [(i, g, Product(api.gemm_rows(op.m), kt, op.n, "int4", 2))
              for i, op in enumerate(ops) for g, (_, kt) in enumerate(segments_of(op.k, op.segment))]
    ranges = place([p for *_, p in pieces], options.cores, True, options.n_tile_max)
    placed: list[list[tuple[int, int, int, int]]] = [[] for _ in ops]
    for (i, g, _), rs in zip(pieces, ranges):
        placed[i] += [(g, start, size, lane) for start, size, lane in rs]
    return [replace(op, placement=tuple(sorted(r))) for op, r in zip(ops, placed)]
