"""The rocket device: rkc's Device on the mainline Linux rocket DRM-accel driver.

`RocketDevice` marshals the UAPI through a KernelInterface (`LinuxKernel` on a
board); `runtime.rocket.emulated.EmulatedKernel` answers the same ioctls for
tests and for `rkc probe` where no NPU exists."""

from rkc.runtime.rocket.device import RocketDevice
from rkc.runtime.rocket.errors import JobDropped, JobFailed, JobRejected, JobTimeout, RocketError
from rkc.runtime.rocket.nodes import find_rocket_node, scan_nodes

__all__ = ["RocketDevice", "find_rocket_node", "scan_nodes", "RocketError", "JobRejected", "JobDropped",
           "JobTimeout", "JobFailed"]
