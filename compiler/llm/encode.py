"""A matrix encoded in the form the NPU multiplies it (EncodedWeight), read
from a row source (compiler/llm/weights.py) block by block, never whole in
fp32: fp16; int8 per output channel (rows rotated first, then rounded by
compiler/llm/quantize.py), whole or streamed into the output as it is placed
(a table only gathered from); int4 in groups along K (compiler/llm/int4.py),
the group count searched for the fewest whose int16 partials stay in range.
compiler/llm/build.py chooses which encoding each matrix gets.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from rkc.compiler.llm.int4 import AUTO_GROUP, Int4Weight, group_for as int4_group_for, \
    quantize_weight as quantize_int4, safe as int4_safe
from rkc.compiler.llm.program_builder import EncodedWeight
from rkc.compiler.llm.quantize import QUANTIZE_ROWS, quantize_matrix
from rkc.compiler.llm.rotate import rotate_matrix
from rkc.compiler.llm.step_clock import STEPS
from rkc.compiler.llm.weights import RowSource
from rkc.ir.errors import UnsupportedError
from rkc.ir.npu import layout
from rkc.runtime.kernels.hadamard import Rotation


# rows encoded at a time: a multiple of the quantizer's own row block, so the
# bits are those of the whole matrix at once (rows are rounded independently),
# and a 262k-row head is never whole in fp32
ENCODE_ROWS = 2 * QUANTIZE_ROWS


def encoded_blocks(source: RowSource, precision: str, rot: Rotation | None = None, rounding: str = "rtn",
                   hessian: np.ndarray | None = None, scales: str = "max"
                   ) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
    """(first row, encoded rows, their int8 scales or None) of a matrix read
    from `source` (rows(), blocks()) row block by row block: fp16, or int8 per
    output channel (each block's rows rotated by `rot`, then quantize_matrix)."""
    if precision == "fp16":
        for r0, rows in source.blocks():
            yield r0, rows.astype(np.float16), None
        return
    for r0, rows in source.blocks(ENCODE_ROWS):
        if rot is not None:
            rows = rotate_matrix(rows, rot)
        q, scale = quantize_matrix(rows, rounding, hessian, scales)
        yield r0, q, scale


def encode_rows(source: RowSource, precision: str, rot: Rotation | None = None, rounding: str = "rtn",
                hessian: np.ndarray | None = None, scales: str = "max") -> EncodedWeight:
    """A matrix read from `source` whole, as encoded_blocks encodes it."""
    n, k = source.shape
    int8 = precision != "fp16"
    data = np.empty((n, k), np.int8 if int8 else np.float16)
    scale = np.empty(n, np.float32) if int8 else None
    for r0, rows, s in encoded_blocks(source, precision, rot, rounding, hessian, scales):
        data[r0:r0 + len(rows)] = rows
        if int8:
            scale[r0:r0 + len(rows)] = s
    return EncodedWeight(data, scale, rot if int8 else None)


def streamed_rows(source: RowSource, precision: str, rounding: str = "rtn", hessian: np.ndarray | None = None,
                  scales: str = "max") -> EncodedWeight:
    """A Gather-only table as encode_rows would encode it, left to be encoded
    block by block into the output when it is placed (EncodedWeight.blocks):
    Gemma 4 E2B's per-layer token table is 2.35 GB in int8."""
    int8 = precision != "fp16"
    return EncodedWeight(np.broadcast_to((np.int8 if int8 else np.float16)(0), source.shape),
                         np.broadcast_to(np.float32(0), source.shape[:1]) if int8 else None,
                         blocks=lambda: encoded_blocks(source, precision, None, rounding, hessian, scales))


# rows an AUTO_GROUP int4 encoding rounds first at each K group count, until they
# are safe: rows are rounded independently, so a count their partials overflow at
# fails for the whole matrix too, and is dropped without rounding it all (a 7B
# model's ffn_down, K = 18944, needs 10 groups: 9 whole roundings saved)
INT4_PROBE_ROWS = 256


def encode_int4(source: RowSource, group: int, rot: Rotation | None = None, hessian: np.ndarray | None = None,
                gather: EncodedWeight | None = None) -> EncodedWeight:
    """A product's matrix in int4 groups along K (its rows rotated by `rot` first);
    `gather`: the int8 rows a tied embedding gathers from (the head's int4 bytes are
    not a row table)."""
    n, k = source.shape
    if k % layout.INT4_C2:
        raise UnsupportedError(f"int4 products need K % {layout.INT4_C2} == 0, K = {k}")

    def rounded(r0: int, r1: int, g: int) -> Int4Weight:
        """Rows r0:r1 rotated and rounded in K groups of g."""
        with STEPS.step("read"):
            rows = source.rows(slice(r0, r1))
        if rot is not None:
            with STEPS.step("rotate"):
                rows = rotate_matrix(rows, rot)
        return quantize_int4(rows, g, hessian)

    def safe(q: Int4Weight) -> bool:
        with STEPS.step("int4 safety check"):
            return int4_safe(q)

    parts = 1
    if group == AUTO_GROUP:  # the fewest K groups the first rows alone allow: fewer fail for the whole matrix
        while not safe(rounded(0, INT4_PROBE_ROWS, int4_group_for(k, parts))):
            parts += 1
    while True:  # group AUTO_GROUP: the fewest K groups whose int16 partials are safe for these weights
        g = group if group != AUTO_GROUP else int4_group_for(k, parts)
        data = np.empty((n, k // 2), np.uint8)  # two values a byte (EncodedWeight.int4_values)
        scales = np.empty((-(-k // g), n), np.float32)
        for r0 in range(0, n, ENCODE_ROWS):
            q = rounded(r0, r0 + ENCODE_ROWS, g)
            if group == AUTO_GROUP and not safe(q):
                break
            with STEPS.step("int4 pack"):
                data[r0:r0 + len(q.data)] = layout.pack_nibbles(q.data)
            scales[:, r0:r0 + len(q.data)] = q.scales
        else:
            return EncodedWeight(data, None, rot, int4_scales=scales, int4_group=g, gather=gather)
        parts += 1
