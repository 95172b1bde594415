"""A task's decoding is kept with its regcmd bytes and replayed (runtime/sim/
executor.fetch_task): the replay must leave the core exactly as decoding would,
including the LUT cursor a later task's data writes continue from."""

import numpy as np

from rkc.ir.npu.regcmd import RegcmdBuilder
from programs import place
from rkc.runtime.sim import SimDevice
from rkc.runtime.sim.executor import CoreState, fetch_task
from rkc.runtime.sim.npu import kernel_amount


def _task(*writes) -> RegcmdBuilder:
    b = RegcmdBuilder()
    for name, fields in writes:
        b.write(name, **fields)
    b.finish(0x18)
    return b


def test_replayed_tasks_leave_registers_lut_and_cursor_as_decoding_does():
    dev = SimDevice()
    select = _task(("DPU_LUT_ACCESS_CFG", dict(LUT_ACCESS_TYPE=1, LUT_TABLE_ID=0, LUT_ADDR=10)))
    other = _task(("DPU_OUT_CVT_SCALE", dict(OUT_CVT_SCALE=3)))  # touches no LUT register
    data = _task(*[("DPU_LUT_ACCESS_DATA", dict(LUT_ACCESS_DATA=v)) for v in (7, 8, 9)])
    prog = place(dev, [select, other, data])
    a, b, c = [(t.regcmd_iova, kernel_amount(t.regcmd_count)) for t in prog.tasks]

    def run(state, order):
        for iova, amount in order:
            fetch_task(state, dev.mem, iova, amount)

    fresh, replayed = CoreState(0), CoreState(0)
    order = [a, b, c, c, b, c]  # the last data task continues where the cursor is, not where it was
    run(fresh, order)
    run(CoreState(1), order)  # decodes and keeps every task
    hits = dev.mem.cache.hits
    run(replayed, order)
    assert dev.mem.cache.hits > hits
    assert replayed.regs.values == fresh.regs.values
    assert replayed.lut_cursor == fresh.lut_cursor == (1, 0, 19)
    np.testing.assert_array_equal(replayed.lut, fresh.lut)
    np.testing.assert_array_equal(fresh.lut[0, 10:19], [7, 8, 9] * 3)
