"""The null device: checks every submission, completes it at once, touches no buffer."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.device import Job, Task
from rkc.runtime.devices import KINDS, open_device
from rkc.runtime.null import NullDevice, NullDeviceError


def test_null_is_a_device_kind_that_auto_never_picks():
    assert "null" in KINDS
    assert isinstance(open_device("null", cores=2), NullDevice)


def test_submit_checks_and_leaves_buffers_as_they_are():
    dev = NullDevice()
    regcmd, out = dev.create_bo(64), dev.create_bo(4096)
    dev.prepare_cpu_access(out)
    out.host[:4] = [1, 2, 3, 4]
    dev.finish_cpu_access(out)
    dev.run([Job([Task(regcmd.iova, 8)], [regcmd], [out])], chained=True)
    assert list(out.host[:4]) == [1, 2, 3, 4]
    assert (dev.counters.submits, dev.counters.tasks, dev.counters.kicks) == (1, 1, 1)
    with pytest.raises(NullDeviceError, match="outside every BO"):
        dev.submit([Job([Task(regcmd.iova, 10_000)], [regcmd], [out])])
    with pytest.raises(NullDeviceError, match="outside every BO"):
        dev.submit([Job([Task(0, 1)])])
    dev.prepare_cpu_access(out)
    with pytest.raises(NullDeviceError, match="held by the CPU"):
        dev.submit([Job([Task(regcmd.iova, 8)], [regcmd], [out])])
    dev.finish_cpu_access(out)
    dev.free_bo(out)
    with pytest.raises(NullDeviceError, match="not a live BO"):
        dev.submit([Job([Task(regcmd.iova, 8)], [regcmd], [out])])


def test_a_prepared_submit_checks_what_a_submit_checks():
    """prepare_submit: counted as submits are; a BO held by the CPU or freed
    since, or a task outside every BO, refused when the prepared call runs."""
    dev = NullDevice()
    regcmd, out, spare = dev.create_bo(64), dev.create_bo(4096), dev.create_bo(4096)
    jobs = [Job([Task(regcmd.iova, 8), Task(regcmd.iova, 4)], [regcmd], [out])]
    dev.prepare_cpu_access(out)  # held while preparing, as a plan holds every BO while it is built
    run = dev.prepare_submit(jobs)
    dev.finish_cpu_access(out)
    run()
    run()
    assert (dev.counters.submits, dev.counters.jobs, dev.counters.tasks, dev.counters.kicks) == (2, 2, 4, 4)
    dev.prepare_cpu_access(out)
    with pytest.raises(NullDeviceError, match="held by the CPU"):
        run()
    dev.finish_cpu_access(out)
    dev.free_bo(spare)  # another BO freed: still fine
    run()
    dev.free_bo(out)
    with pytest.raises(NullDeviceError, match="not a live BO"):
        run()
    bad = dev.prepare_submit([Job([Task(regcmd.iova, 10_000)], [regcmd])])
    with pytest.raises(NullDeviceError, match="outside every BO"):
        bad()
    assert dev.counters.submits == 3


def test_host_view_is_writable_only_in_the_cpu_bracket():
    dev = NullDevice()
    bo = dev.create_bo(100)
    with pytest.raises(ValueError):
        bo.host[0] = 1
    dev.prepare_cpu_access(bo)
    bo.host[0] = 1
    dev.finish_cpu_access(bo)
    assert bo.host[0] == 1 and not bo.host.flags.writeable
    assert bo.size % 4096 == 0 and bo.iova % 4096 == 0 and bo.iova > 0
    assert np.count_nonzero(dev.create_bo(10).host) == 0


def test_a_hold_lends_its_bos_for_one_block_and_takes_them_back_on_an_error():
    """native_maps.Hold, entered again and again: each BO held once (named twice), writable
    inside the block only, handed back when the block raises."""
    from rkc.runtime.native_maps import Hold

    dev = NullDevice()
    a, b = dev.create_bo(64), dev.create_bo(64)
    hold = Hold(dev, [a, b, a])
    assert hold.bos == (a, b)
    for _ in range(2):
        with hold:
            a.host[0] = b.host[1] = 7
        assert not a.host.flags.writeable and not b.host.flags.writeable
    with pytest.raises(ZeroDivisionError):
        with hold:
            1 / 0
    assert not a.host.flags.writeable and not b.host.flags.writeable and not dev._held
    with pytest.raises(ValueError):
        a.host[0] = 1
