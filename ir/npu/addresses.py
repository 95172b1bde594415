"""What each address register of a regcmd does with the address it holds.

* `direction`: "read" (a DMA reads from it), "write" (the NPU writes there),
  "link" (the tail's next-task pointer, into the regcmd itself) or "kernel"
  (programmed by the kernel per kick; a regcmd may not carry it).
* `needed_by`: the block whose operation-enable bit makes the task use the
  address whatever its other fields say; `unless`: a block whose presence
  means the address is not used (the DPU reads its main data through MRDMA
  only when no convolution feeds it). None: whether it is used depends on
  stage fields (the DPU's BS/BN/EW operands), which the simulator decides
  where it performs the read.

Facts from the register table (ir/npu/register_table.py) and the TRM's block
descriptions; ir/npu/extents.py computes each access's extent (for the load-time
proof and the simulator alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from rkc.ir.npu.registers import REGISTERS, Block


@dataclass(frozen=True)
class AddressUse:
    direction: str
    needed_by: Block | None = None
    unless: Block | None = None


ADDRESS_USE: dict[str, AddressUse] = {
    "PC_BASE_ADDRESS": AddressUse("link"),
    "PC_TASK_DMA_BASE_ADDR": AddressUse("kernel"),
    "CNA_FEATURE_DATA_ADDR": AddressUse("read", Block.CNA),
    "CNA_DCOMP_ADDR0": AddressUse("read", Block.CNA),
    "DPU_DST_BASE_ADDR": AddressUse("write"),
    "DPU_RDMA_RDMA_SRC_BASE_ADDR": AddressUse("read", Block.DPU_RDMA, unless=Block.CNA),
    "DPU_RDMA_RDMA_BS_BASE_ADDR": AddressUse("read"),
    "DPU_RDMA_RDMA_BN_BASE_ADDR": AddressUse("read"),
    "DPU_RDMA_RDMA_EW_BASE_ADDR": AddressUse("read"),
    "PPU_DST_BASE_ADDR": AddressUse("write", Block.PPU),
    "PPU_RDMA_RDMA_SRC_BASE_ADDR": AddressUse("read", Block.PPU_RDMA),
}

_missing = {r.name for r in REGISTERS if r.is_address} ^ set(ADDRESS_USE)
if _missing:  # the register table and this one must name the same registers
    raise ImportError(f"ir/npu/addresses.py out of step with the register table: {sorted(_missing)}")
