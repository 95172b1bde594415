"""The built-in functional simulator of the RK3588 NPU (a Device).

One module per hardware block: memory (IOVA space of BOs), regfile (register
groups), executor (PC: fetch, decode, op-enable), cna (feature/weight DMA),
cbuf (bank accounting and reuse), core (MAC array), dpu + dpu_rdma (post
processing and its DMAs), ppu (pooling), npu (cores and kicks), stats (the
counters ir/npu/perf.py turns into modelled time), quirks (the readings of open hardware questions), device (SimDevice).
"""

from rkc.runtime.sim.device import SimDevice
from rkc.runtime.sim.errors import SimError
from rkc.runtime.sim.quirks import Quirks

__all__ = ["SimDevice", "SimError", "Quirks"]
