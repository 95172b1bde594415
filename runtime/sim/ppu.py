"""PPU + PPU_RDMA: pooling (TRM ch. 36 'PPU' 0x6000-0x60DC, 'PPU_RDMA' 0x7000-0x7030)."""

from __future__ import annotations

from runtime.sim.errors import UnsupportedError


def run(r, mem, quirks, blocks, stats) -> None:
    raise UnsupportedError("the PPU is not modelled yet", register="PPU_OPERATION_MODE_CFG")
