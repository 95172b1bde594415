"""Device faults while a model runs on rocket (the emulated kernel): a job that
times out, a job the kernel dropped, a device lost underneath (its fd closed).
Each ends in one clear RkcError within the wait's deadline, and every BO the
model created is freed on every path (counted as live GEM objects)."""

import errno

import numpy as np
import pytest

from hostile import compiled_small_cnn
from rkc import runtime
from rkc.ir.errors import RkcError
from rkc.runtime.rocket import RocketDevice
from rkc.runtime.rocket.emulated import STOCK, EmulatedKernel
from rkc.runtime.rocket.errors import JobDropped, JobTimeout
from rkc.runtime.rocket.sim_executor import SimExecutor

X = np.ones((1, 3, 32, 32), np.float32)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return compiled_small_cnn(tmp_path_factory.mktemp("m"))


def _device(**kernel_options):
    kernel = EmulatedKernel(STOCK, executor=SimExecutor(), **kernel_options)
    return RocketDevice(kernel=kernel, quiet=True), kernel


def _model_objects(dev, kernel) -> int:
    """Live GEM objects less the device's own pool of fence witnesses."""
    return kernel.live_objects() - len(dev._witnesses)


def test_a_good_run_frees_every_bo(model_path):
    dev, kernel = _device()
    before = _model_objects(dev, kernel)
    with runtime.load(model_path, device=dev) as model:
        model.run({"x": X})
        assert _model_objects(dev, kernel) > before
    assert _model_objects(dev, kernel) == before
    dev.close()
    assert kernel.live_objects() == 0


def test_a_job_that_never_finishes_times_out(model_path):
    import time

    dev, kernel = _device(stalled=True)
    start = time.monotonic()
    with pytest.raises(JobTimeout, match="not finished after|did not finish writing"):
        with runtime.load(model_path, device=dev) as model:
            model.run({"x": X})
    assert time.monotonic() - start < 60  # bounded by the wait's deadline, not stuck
    dev.close()  # the stalled jobs held their BOs; closing the file kills them
    assert kernel.live_objects() == 0


def test_a_job_the_kernel_dropped(model_path):
    """The second job pushed fails inside the kernel (-ENOMEM): SUBMIT still
    returns 0; the device sees that its fence never appeared while the job
    before it on the lane is still queued. (A dropped job with nothing queued
    before it on its lane looks like one that already finished: docs/rocket.md.)"""
    dev, kernel = _device(push_errors={1: errno.ENOMEM})
    before = _model_objects(dev, kernel)
    with pytest.raises(JobDropped, match="the kernel did not queue this job"):
        with runtime.load(model_path, device=dev) as model:
            model.run({"x": X})
    assert kernel.dropped
    assert _model_objects(dev, kernel) == before
    dev.close()
    assert kernel.live_objects() == 0


@pytest.mark.parametrize("when", ["before run", "after run"])
def test_a_device_lost_underneath(model_path, when):
    """Its fd closed by someone else: the kernel releases the file's handles;
    running is one clear error, and closing the model and device does not fail."""
    dev, kernel = _device()
    model = runtime.load(model_path, device=dev)
    if when == "after run":
        model.run({"x": X})
    kernel.close(dev._fds[0])
    with pytest.raises(RkcError) as info:
        model.run({"x": X})
    assert "\n" not in str(info.value)
    model.close()
    dev.close()
    assert kernel.live_objects() == 0
