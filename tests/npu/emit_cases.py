"""What the simulator tests of the NPU emitters share: running an emitted
program on the simulator (a program it declares it does not model skips the
test in its own words), what the simulator reads of the hardware questions,
seeded data and the numpy convolution over stored values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

sim = pytest.importorskip("rkc.runtime.sim", reason="the NPU simulator (issue 3) is not in this tree yet")
from npu_runner import run  # noqa: E402

SWEEP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run_sim(results, inputs, device=None, **kw):
    """Run on the simulator; a program the simulator declares it does not model
    (its UnsupportedError) skips the test with the simulator's own words."""
    from rkc.runtime.sim.errors import UnsupportedError as NotModelled

    try:
        return run(results if isinstance(results, list) else [results], device or sim.SimDevice(), inputs, **kw)
    except NotModelled as exc:
        if "not modelled" not in str(exc):
            raise
        pytest.skip(f"simulator: {exc}")


def sim_reads(question: str) -> bool:
    """Whether the simulator's table of hardware readings has `question`."""
    from rkc.runtime.sim.quirks import QUESTIONS

    return any(q.id == question for q in QUESTIONS)


def sim_takes_fp16_depthwise() -> bool:
    """rocket-userspace's HW-validated fp16 depthwise program writes 16 channels per
    pass (size_e 3); a simulator reading 8 rejects it (its Q4)."""
    from rkc.runtime.sim.quirks import DEFAULT

    return DEFAULT.dpu_channels_per_pass.get(("depthwise", 2)) == 16


def needs_fp16_depthwise_writer():
    if not sim_takes_fp16_depthwise():
        pytest.skip("this simulator reads fp16 depthwise writes as 8-channel passes (Q4), against "
                    "rocket-userspace's HW-validated size_e 3")


def int8_data(shape, seed):
    return np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)


def fp16_data(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float16)


def conv_reference(x, w, stride, pad, depthwise, pad_value):
    """Direct numpy convolution over the stored values, padded with `pad_value`."""
    xp = np.pad(x.astype(np.float64 if x.dtype == np.float16 else np.int64),
                ((0, 0), (pad[0], pad[1]), (pad[2], pad[3])), constant_values=pad_value)
    kh, kw = w.shape[:2] if depthwise else w.shape[1:3]
    sy, sx = stride
    oh = (xp.shape[1] - kh) // sy + 1
    ow = (xp.shape[2] - kw) // sx + 1
    wv = w.astype(xp.dtype)
    out = np.zeros(((x.shape[0] if depthwise else w.shape[0]), oh, ow), xp.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i:i + sy * (oh - 1) + 1:sy, j:j + sx * (ow - 1) + 1:sx]
            out += patch * wv[i, j][:, None, None] if depthwise else np.einsum("chw,oc->ohw", patch, wv[:, i, j, :])
    return out
