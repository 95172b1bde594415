"""int4 GEMM by K segments: int4 x int4 -> int16 partial products (api.GemmInt4).

The int4 datapath (hw-matmul.md 2.1, 3.2: precision 6, A (K/32, M, 32) nibbles, B
(N/64, K/32, 64, 32) nibbles low first, int16 out with size_e 7) is documented
only as far as a raw int16 sum; whether a sum past int16 saturates, wraps or
comes from a wider accumulator is not (Q23). So no task reduces more K than
int16 holds: each K segment is its own task writing its own int16 partial, and
the caller combines the partials on the CPU with per-segment scales (the
quantization groups along K). A segment is safe for any weights up to 480
channels (480 x 64 < 2^15); a longer one only when these weights bound every
partial within int16: 8 x the column's sum of |w| (|a| <= 8), checked here.

Paired rows (`row_split`): one token's hi and lo nibble rows fill 2 of the 4
rows the NPU reads anyway, so a segment may span two quantization groups with
each token's 4 rows split, the first 2 zero over the second group and the last
2 over the first: every row still sums one group (the bound is the group's), the
weights are read once, and a token's output atoms hold no padding rows (half the
partial bytes the host reads, half the tasks).

Tiling: per segment, N tiles of at most `n_tile_max` kernels (whole 64-kernel
groups), M tiles of the rows that fit the data banks (with the slack bank of a
W=1 map, as int8); the (segment, N tile) pairs are cut into one contiguous run
per core, so consecutive M tiles of one pair reuse resident weights and, with one
M tile, consecutive pairs of one segment reuse the feature.
"""

from __future__ import annotations

import numpy as np

from rkc.compiler.npu import api, epilogue, schedule
from rkc.compiler.npu.conv_core import ConvTile, cbuf_row_bytes, tile_task
from rkc.compiler.npu.schedule import Work
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import hw, layout

INT4_PRODUCT_MAX = 64  # |(-8) x (-8)|
INT16_MAX = 32767
PAIRED_ROWS = 4  # a token's hi/lo nibble rows of two K groups (GemmInt4.row_split)


def segment_limit() -> int:
    """The longest K segment whose every int16 partial is exact: 511 -> 480 (a multiple of 32)."""
    return INT16_MAX // INT4_PRODUCT_MAX // layout.CHANNEL_GROUP * layout.CHANNEL_GROUP


assert api.DEFAULT_OPTIONS.int4_segment_max == segment_limit()


def _check(op: api.GemmInt4, options: api.EmitOptions) -> int:
    """The operands' shapes and types (B's values: _check_values, where B is packed)."""
    if op.b.ndim != 2 or op.b.dtype != np.int8:
        raise UnsupportedError(f"{op.name}: B must be an int8 [K, N] array of int4 values, got "
                               f"{op.b.dtype} {op.b.shape}")
    if op.segment % layout.CHANNEL_GROUP or op.segment <= 0:
        raise UnsupportedError(f"{op.name}: K segment {op.segment} must be a positive multiple of 32")
    if op.row_split and (op.segment != 2 * op.row_split or op.m % PAIRED_ROWS):
        raise UnsupportedError(f"{op.name}: paired rows need M % {PAIRED_ROWS} == 0 and a segment of two groups, got "
                               f"M={op.m}, segment {op.segment}, split {op.row_split}")
    k, n = op.b.shape
    rows = op.a.height  # gemm_rows(M); exactly M only for a probe of Q2 (min_input_rows < 4)
    if rows != api.gemm_rows(op.m) and not (rows == op.m and options.min_input_rows <= op.m):
        raise UnsupportedError(f"{op.name}: A has {rows} rows for M={op.m}; the NPU reads {api.gemm_rows(op.m)}")
    if op.a.dtype != "int4" or (op.a.channels, op.a.width) != (k, 1):
        raise UnsupportedError(f"{op.name}: A must be int4 Feature.gemm(rows={op.m}, cols={k}), got "
                               f"{op.a.dtype} {op.a.shape}")
    want = (op.segments * op.n_padded, rows, 1)
    if op.c.dtype != "int16" or (op.c.channels, op.c.height, op.c.width) != want:
        raise UnsupportedError(f"{op.name}: C must be int16 Feature.gemm(rows={op.m}, "
                               f"cols={want[0]} = {op.segments} segments x {op.n_padded}), got "
                               f"{op.c.dtype} {op.c.shape}")
    return rows


def _check_values(op: api.GemmInt4, options: api.EmitOptions) -> None:
    """B's values are int4 and, over segments past the always-safe length, bound every
    int16 partial. Checked as B is packed: a GEMM that finds its weights in the pack
    cache (the same name and bytes: an LLM's later programs) was checked then."""
    if op.b.size and (op.b.min() < layout.INT4_MIN or op.b.max() > layout.INT4_MAX):
        raise UnsupportedError(f"{op.name}: B holds values outside int4 [-8, 7]")
    summed = op.row_split or op.segment  # the K one int16 sum covers
    if summed > options.int4_segment_max:
        worst = partial_bound(op.b, summed)
        if worst > INT16_MAX:
            raise UnsupportedError(f"{op.name}: K segment {summed}: a partial of these weights can reach "
                                   f"{worst} (8 x the column's sum of |w|), past int16 (Q23); segments of at most "
                                   f"{options.int4_segment_max} are safe for any weights")


def partial_bound(b: np.ndarray, segment: int, columns: int = 16384) -> int:
    """The largest |partial| any int4 A (|a| <= 8) can give with weights `b` [K, N]
    over K segments of `segment`: 8 x the largest column sum of |w| in a segment.
    `b` holds int4 values: |w| <= 8 is an int8, summed in int32 without an int32 copy."""
    worst = 0
    for k0 in range(0, b.shape[0], segment):
        for n0 in range(0, b.shape[1], columns):
            block = np.abs(b[k0:k0 + segment, n0:n0 + columns])
            worst = max(worst, int(block.sum(axis=0, dtype=np.int32).max(initial=0)))
    return INT4_PRODUCT_MAX // 8 * worst


def segments_of(k: int, segment: int) -> list[tuple[int, int]]:
    return [(k0, min(segment, k - k0)) for k0 in range(0, k, segment)]


def _m_tiles(rows: int, kt_max: int, options: api.EmitOptions) -> tuple[list[tuple[int, int]], int]:
    """M tiles and data banks: as many rows as fit beside one weight bank (int8's slack kept)."""
    row_bytes = cbuf_row_bytes(1, layout.align(kt_max, layout.INT4_C2) // layout.INT4_C2)
    slack = options.slack_banks("int4")
    cap = (hw.CBUF_BANKS - 1 - slack) * hw.CBUF_BANK_BYTES // row_bytes
    cap = min(cap, 2044) // api.GEMM_ROW_ALIGN * api.GEMM_ROW_ALIGN  # DATAIN_HEIGHT: 11 bits
    m_tiles = schedule.split_evenly(rows, -(-rows // cap), api.GEMM_ROW_ALIGN)
    mt_max = max(size for _, size in m_tiles)
    return m_tiles, schedule.data_banks(mt_max * row_bytes, slack)


def pack_b(b: np.ndarray, segment: int) -> tuple[bytes, list[int]]:
    """B in the native int4 weight layout, one block per K segment (kernels padded
    to whole 64-kernel groups, channels to 32, with zeros); the blocks' offsets."""
    k, n = b.shape
    n_hw = layout.align(n, layout.INT4_KERNEL_GROUP)
    parts, offsets, pos = [], [], 0
    for k0, kt in segments_of(k, segment):
        block = np.zeros((n_hw, kt), np.int8)
        block[:n] = b[k0:k0 + kt].T
        offsets.append(pos)
        parts.append(layout.pack_weights_int4(block).tobytes())
        pos += len(parts[-1])
    return b"".join(parts), offsets


def lower_gemm_int4(op: api.GemmInt4, options: api.EmitOptions) -> api.EmitResult:
    rows = _check(op, options)
    k, n = op.b.shape
    kg = layout.INT4_KERNEL_GROUP
    segs = segments_of(k, op.segment)
    kt_max = max(size for _, size in segs)
    m_tiles, d_banks = _m_tiles(rows, kt_max, options)
    w_banks = hw.CBUF_BANKS - d_banks
    key = (op.name, op.segment, op.b.shape)
    if options.pack_cache is not None and key in options.pack_cache:  # (bytes, offsets, no weight sums)
        packed, offsets, _ = options.pack_cache[key]
    else:
        _check_values(op, options)
        packed, offsets = pack_b(op.b, op.segment)
        if options.pack_cache is not None:
            options.pack_cache[key] = packed, offsets, None
    plan = epilogue.plan(epilogue.DpuRequest("int4", op.c, n, None, None, np.zeros(n), api.NO_EPILOGUE))
    works = []
    for g, ni, (n0, nt), lane in _n_tiles(op, len(segs), len(m_tiles), options):
        k0, kt = segs[g]
        for mi, (m0, mt) in enumerate(m_tiles):
            if lane is None:  # one N tile per K group: the M tiles go over the cores instead
                lane = schedule.lane_of(mi, len(m_tiles), options.cores)
            works.append(_work(op, plan, (g, k0, kt, offsets[g]), (ni, n0, nt), (mi, m0, mt), lane,
                               d_banks, w_banks, options.min_input_rows))
    n_tiles = {ni for w in works for ni in [w.weight_key[1]]}
    tasks, jobs = schedule.schedule(works)
    notes = [f"int4 GEMM M={op.m} K={k} N={n}: {len(segs)} K segments of <= {op.segment} (int16 partials) x "
             f"{len(n_tiles)} N tiles x {len(m_tiles)} M tiles on {len(jobs)} core(s); CBUF {d_banks} data + "
             f"{w_banks} weight banks" + (", placed with its segment" if op.placement else "")]
    return api.EmitResult(op, tasks, jobs, [api.ConstBuffer(f"{op.name}.weights", packed)], [], [], notes)


def _n_tiles(op: api.GemmInt4, groups: int, m_tiles: int, options: api.EmitOptions):
    """(K group, N tile index, (first channel, channels), lane or None) per task column:
    the segment's placement, else each group's N cut evenly over the cores (gemm.py's rule)."""
    kg = layout.INT4_KERNEL_GROUP
    if op.placement is not None:
        covered = {}
        for g, start, size, lane in op.placement:
            if not (0 <= g < groups and start % kg == 0 and size > 0 and 0 <= lane < options.cores):
                raise UnsupportedError(f"{op.name}: internal: bad placement range {(g, start, size, lane)}")
            covered[g] = covered.get(g, 0) + size
        if covered != {g: op.n for g in range(groups)}:
            raise UnsupportedError(f"{op.name}: internal: placement does not cover N={op.n} in every K group")
        i = 0
        for g, start, size, lane in sorted(op.placement):
            for p0, nt in schedule.split_evenly(size, -(-size // options.n_tile_max), kg):
                yield g, i, (start + p0, nt), lane
                i += 1
        return
    n_parts = max(-(-op.n // options.n_tile_max), min(options.cores, -(-op.n // kg)))
    tiles = schedule.split_evenly(op.n, n_parts, kg)
    for g in range(groups):
        for ni, tile in enumerate(tiles):
            lane = schedule.lane_of(ni, len(tiles), options.cores) if len(tiles) > 1 or m_tiles == 1 else None
            yield g, ni, tile, lane


def _work(op: api.GemmInt4, plan, seg, ntile, mtile, lane: int, d_banks: int, w_banks: int,
          min_rows: int) -> Work:
    (g, k0, kt, k_offset), (ni, n0, nt), (mi, m0, mt) = seg, ntile, mtile
    kernels = layout.align(nt, layout.INT4_KERNEL_GROUP)
    kt_hw = layout.align(kt, layout.INT4_C2)
    w_bytes = kernels * kt_hw // 2
    a_tile = op.a.view(channel0=k0, channels=kt, row0=m0, rows=mt)
    o_tile = op.c.view(channel0=g * op.n_padded + n0, channels=nt, row0=m0, rows=mt)
    cbuf = api.CbufPlan(d_banks, w_banks, data_bytes=mt * kt_hw // 2, weight_bytes=w_bytes,
                        weights_resident=w_bytes <= w_banks * hw.CBUF_BANK_BYTES)
    tile = ConvTile(input=a_tile, output=o_tile, weights_buffer=f"{op.name}.weights",
                    weights_offset=k_offset + n0 * kt_hw // 2, kernels=kernels, out_channels_hw=kernels,
                    kernel=(1, 1), stride=(1, 1), pad=(0, 0), pad_value=0, depthwise=False, dpu=plan, cbuf=cbuf,
                    channel0=n0, label=f"{op.name} g{g} n{ni} m{mi}", min_input_rows=min_rows)

    def build(cb: api.CbufPlan, t: ConvTile = tile) -> api.Task:
        t.cbuf = cb
        return tile_task(t)

    return Work(lane, ("A", mi, g), ("B", ni, g), cbuf, build, (op.a.buffer, f"{op.name}.weights"),
                (op.c.buffer,))


def reference(a: np.ndarray, b: np.ndarray, segment: int) -> np.ndarray:
    """numpy model: [M, segments, N] int64 partial products."""
    return np.stack([a[:, k0:k0 + kt].astype(np.int64) @ b[k0:k0 + kt].astype(np.int64)
                     for k0, kt in segments_of(b.shape[0], segment)], axis=1)
