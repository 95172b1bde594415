"""The 384 KiB convolution buffer of one core: 12 banks of 32 KiB shared by
feature data (banks from the bottom, DATA_BANK of them) and weights (the top
WEIGHT_BANK banks) (TRM CNA_CBUF_CON0; Mesa rkt_task.c; hw-matmul.md 2.4).

`plan` checks a task's bank split; `Cbuf` remembers what the previous task of
the same job left resident, which is what WEIGHT_REUSE / DATA_REUSE ask the
CNA to use instead of fetching (valid within one job on one core only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rkc.runtime.sim.cna import ATOM, ConvInput
from rkc.runtime.sim.errors import CbufError, QuirkRejection
from rkc.runtime.sim.quirks import Quirks
from rkc.runtime.sim.regfile import TaskRegisters

BANKS = 12
BANK_BYTES = 32 * 1024
ENTRY_BYTES = 64  # unit of CNA_CBUF_CON1.DATA_ENTRIES (one row = ceil(row bytes / 64))


def _banks(nbytes: int) -> int:
    return -(-nbytes // BANK_BYTES)


@dataclass
class BankUse:
    data_banks: int
    weight_banks: int
    data_bytes: int
    weights_resident: bool  # all weights fit the weight banks (reusable by the next task)


def plan(r: TaskRegisters, conv: ConvInput, quirks: Quirks) -> BankUse:
    d = r.fields("CNA_CBUF_CON0")
    data, weight = d["DATA_BANK"], d["WEIGHT_BANK"]
    if data < 1 or weight < 1:
        raise r.error(CbufError, f"DATA_BANK={data}, WEIGHT_BANK={weight}: each needs at least one bank",
                      "CNA_CBUF_CON0")
    if data + weight > BANKS:
        raise r.error(CbufError, f"DATA_BANK={data} + WEIGHT_BANK={weight} = {data + weight} exceeds the "
                      f"{BANKS} CBUF banks", "CNA_CBUF_CON0")
    size0 = r.fields("CNA_DATA_SIZE0")
    width, height = size0["DATAIN_WIDTH"], size0["DATAIN_HEIGHT"]
    argb = r.field("CNA_CONV_CON1", "ARGB_IN")
    c1 = 1 if argb else -(-conv.channels // conv.prec.c2)
    row_bytes = width * c1 * ATOM
    data_bytes = height * row_bytes
    need = _banks(data_bytes)
    # int4 (code 6) reads its feature through the same DMA as int8: the slack is kept
    slack = (quirks.int8_width1_slack_bank and conv.prec.code in (0, 6) and width == 1)
    if data < need + slack:
        why = " + 1 slack bank (int8 with DATAIN_WIDTH=1, Q6)" if slack else ""
        cls = QuirkRejection if slack and data == need else CbufError
        raise r.error(cls, f"the input tile is {data_bytes} bytes ({height} rows of {row_bytes}): needs "
                      f"{need}{why} data banks, DATA_BANK={data}", "CNA_CBUF_CON0")
    if not argb:
        entries = r.field("CNA_CBUF_CON1", "DATA_ENTRIES")
        row_entries = -(-row_bytes // ENTRY_BYTES)
        if entries < row_entries:
            raise r.error(CbufError, f"DATA_ENTRIES={entries}: one input row of {row_bytes} bytes needs "
                          f"{row_entries} 64-byte entries", "CNA_CBUF_CON1")
        if entries * ENTRY_BYTES * height > data * BANK_BYTES:
            raise r.error(CbufError, f"{height} rows of DATA_ENTRIES={entries} x 64 bytes overflow "
                          f"{data} data banks", "CNA_CBUF_CON1")
    capacity = weight * BANK_BYTES
    resident = conv.weight_bytes <= capacity
    if not resident:
        group = conv.prec.kernel_group if conv.mode == "direct" else conv.kernels
        per_kernel = conv.weight_bytes // conv.kernels
        tile = per_kernel * min(group, conv.kernels)
        if tile > capacity:
            raise r.error(CbufError, f"one kernel group of weights ({min(group, conv.kernels)} kernels x "
                          f"{per_kernel} bytes = {tile}) does not fit WEIGHT_BANK={weight} banks",
                          "CNA_CBUF_CON0")
    return BankUse(data, weight, data_bytes, resident)


@dataclass
class _Resident:
    key: tuple
    value: np.ndarray


class Cbuf:
    """What one core's CBUF holds between the tasks of a job."""

    def __init__(self) -> None:
        self.weights: _Resident | None = None
        self.data: _Resident | None = None

    def reset(self) -> None:
        self.weights = self.data = None

    def resolve(self, r: TaskRegisters, conv: ConvInput, use: BankUse, data_key: tuple) -> tuple[bool, bool]:
        """Apply WEIGHT_REUSE/DATA_REUSE: swap in what CBUF holds (raising if it
        holds something else). Returns (weights fetched, data fetched)."""
        fetched_w = fetched_d = True
        if conv.weight_reuse:
            if self.weights is None or self.weights.key != conv.weight_key:
                raise r.error(CbufError, "WEIGHT_REUSE is set but the previous task of this job on this "
                              "core did not leave these weights (same address, size and banks) in CBUF",
                              "CNA_CBUF_CON0")
            conv.weights = self.weights.value
            fetched_w = False
        if conv.data_reuse:
            if self.data is None or self.data.key != data_key:
                raise r.error(CbufError, "DATA_REUSE is set but the previous task of this job on this core "
                              "did not leave this feature tile in CBUF", "CNA_CBUF_CON0")
            conv.x = self.data.value
            fetched_d = False
        self.weights = _Resident(conv.weight_key, conv.weights) if use.weights_resident else None
        self.data = _Resident(data_key, conv.x)
        return fetched_w, fetched_d
