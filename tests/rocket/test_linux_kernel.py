"""LinuxKernel's calls work on real file descriptors (there is no NPU here, so
generic ones stand in: FIONREAD on a pipe, mmap of a memfd)."""

import ctypes
import os
import termios

import numpy as np

from rkc.runtime.rocket.kernel import LinuxKernel, sort_nodes
from rkc.runtime.rocket.nodes import scan_nodes


def test_ioctl_fills_a_ctypes_struct_and_returns_the_result():
    k = LinuxKernel()
    r, w = os.pipe()
    try:
        os.write(w, b"12345")
        n = ctypes.c_int(-1)
        assert k.ioctl(r, termios.FIONREAD, n) == 0
        assert n.value == 5
    finally:
        os.close(r)
        os.close(w)


def test_mmap_is_shared_and_unmaps():
    k = LinuxKernel()
    fd = os.memfd_create("rkc-test")
    try:
        os.ftruncate(fd, 8192)
        m = k.mmap(fd, 4096, 4096)
        view = np.frombuffer(m, np.uint8)
        view[:3] = (1, 2, 3)
        del view
        k.munmap(m)
        assert os.pread(fd, 3, 4096) == b"\x01\x02\x03"
    finally:
        os.close(fd)


def test_monotonic_clock_and_node_listing(tmp_path):
    k = LinuxKernel(str(tmp_path / "accel"))
    assert k.list_nodes() == []
    (tmp_path / "accel").mkdir()
    for n in ("accel10", "accel2", "card0"):
        (tmp_path / "accel" / n).write_text("")
    assert [os.path.basename(p) for p in k.list_nodes()] == ["accel2", "accel10"]
    assert sort_nodes(["accel1", "accel0"]) == ["accel0", "accel1"]
    nodes = scan_nodes(k)  # plain files: DRM_IOCTL_VERSION is refused
    assert [n.driver for n in nodes] == [None, None] and all("DRM_IOCTL_VERSION failed" in n.error for n in nodes)
    a = k.clock_ns()
    assert k.clock_ns() >= a > 0
