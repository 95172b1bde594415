"""--device auto|sim|rocket: auto picks rocket when a rocket node exists and says which on stderr."""

import pytest

from rkc.ir.errors import RkcError
from rkc.runtime.devices import open_device, rocket_status
from rkc.runtime.rocket import RocketDevice
from rkc.runtime.rocket.emulated import EmulatedKernel
from rkc.runtime.sim import SimDevice


def test_auto_without_npu_is_the_simulator(capsys):
    dev = open_device("auto", kernel=EmulatedKernel(nodes={}), cores=2)
    assert isinstance(dev, SimDevice)
    assert capsys.readouterr().err == "rkc: using device sim (no rocket NPU found)\n"


def test_auto_with_a_rocket_node(capsys):
    kernel = EmulatedKernel(nodes={"/dev/accel/accel0": "ivpu", "/dev/accel/accel1": "rocket"})
    dev = open_device("auto", kernel=kernel, cores=1)
    assert isinstance(dev, RocketDevice) and dev.node == "/dev/accel/accel1"
    assert capsys.readouterr().err == "rkc: using device rocket (rocket NPU at /dev/accel/accel1)\n"
    dev.close()


def test_auto_explains_an_unreadable_node(capsys):
    kernel = EmulatedKernel(denied=("/dev/accel/accel0",))
    assert rocket_status(kernel) == (False, "no rocket NPU found; /dev/accel/accel0 could not be asked "
                                            "(Permission denied)")
    assert isinstance(open_device("auto", kernel=kernel), SimDevice)
    assert "Permission denied" in capsys.readouterr().err


def test_explicit_kinds(capsys):
    assert isinstance(open_device("sim", quiet=True), SimDevice)
    with pytest.raises(RkcError, match="no rocket NPU found"):
        open_device("rocket", kernel=EmulatedKernel(nodes={}))
    with pytest.raises(RkcError, match="unknown device 'gpu'"):
        open_device("gpu")
    dev = open_device("rocket", kernel=EmulatedKernel(shared_address_space=True), cores=2)
    assert dev.lanes == 2
    dev.close()
