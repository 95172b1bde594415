"""Max pooling without the PPU (compiler/npu/pool.py `_max_as_taps`): one-hot depthwise
convolutions whose EW stage keeps the running max, on the simulator against numpy over
a sweep of kernels, strides, paddings (the ceil-mode overhang included: extra bottom /
right padding) and channel counts that are not a multiple of the atom; random data
from fixed seeds. int8 and fp16 pooling select an input element, so the results are
compared exactly."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.compiler.npu import api
from rkc.compiler.npu.dispatch import emit

sim = pytest.importorskip("rkc.runtime.sim", reason="the NPU simulator (issue 3) is not in this tree yet")
from npu.emit_cases import fp16_data, int8_data, needs_fp16_depthwise_writer  # noqa: E402
from npu_runner import run  # noqa: E402

# (channels, height, width, kernel, stride, padding (top, bottom, left, right))
CASES = [
    (24, 9, 11, 2, 2, (0, 0, 0, 0)),
    (70, 12, 10, 3, 1, (1, 1, 1, 1)),
    (96, 13, 13, 3, 2, (0, 0, 0, 0)),
    (40, 13, 14, 3, 2, (0, 1, 0, 1)),  # ceil mode: the last window overhangs by one
    (128, 10, 9, 5, 1, (2, 2, 2, 2)),  # YOLO's SPPF
    (17, 11, 12, 5, 2, (1, 2, 2, 1)),
    (64, 8, 8, 1, 2, (0, 0, 0, 0)),  # a strided pick
    (32, 6, 7, 1, 1, (0, 0, 0, 0)),  # a copy
    (48, 9, 8, 3, 1, (0, 2, 1, 1)),  # stride 1 keeping the width only
]


def _reference(x: np.ndarray, k: int, s: int, pad, oh: int, ow: int) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad[0], pad[1]), (pad[2], pad[3])), constant_values=-np.inf)
    wins = [xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s] for i in range(k) for j in range(k)]
    return np.max(wins, axis=0)


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
@pytest.mark.parametrize("c, h, w, k, s, pad", CASES)
@pytest.mark.parametrize("cores", [1, 3])
def test_max_pool_on_the_dpu_matches_numpy(dtype, c, h, w, k, s, pad, cores):
    if dtype == "fp16":
        needs_fp16_depthwise_writer()
    oh, ow = (h + pad[0] + pad[1] - k) // s + 1, (w + pad[2] + pad[3] - k) // s + 1
    q = api.Quant(0.05, -7) if dtype == "int8" else None
    X, Y = api.Feature("x", 0, c, h, w, dtype, q), api.Feature("y", 0, c, oh, ow, dtype, q)
    r = emit(api.Pool(X, Y, "max", (k, k), (s, s), pad), api.EmitOptions(cores=cores))
    assert not any("ppu_rdma" in t.counters.dma_read for t in r.tasks)  # stock rocket completes it
    assert all(r.extents()[b.name] <= b.size for b in r.scratch)
    seed = c * 1000 + h * 10 + k
    x = int8_data((c, h, w), seed) if dtype == "int8" else fp16_data((c, h, w), seed, 4.0)
    if dtype == "fp16":  # the extremes the padding must lose to (fp16's smallest finite is the padding)
        x.reshape(-1)[::97] = np.float16(-60000.0)
    got = run([r], sim.SimDevice(), {"x": (X, x)}).feature(Y).astype(np.float64)
    np.testing.assert_array_equal(got, _reference(x, k, s, pad, oh, ow))


def test_the_ppu_still_pools_fp16_where_the_kernel_completes_it():
    X, Y = api.Feature("x", 0, 32, 8, 8, "fp16"), api.Feature("y", 0, 32, 4, 4, "fp16")
    r = emit(api.Pool(X, Y, "max", (2, 2), (2, 2)), api.EmitOptions(ppu_completes=True))
    assert all("ppu_rdma" in t.counters.dma_read for t in r.tasks)
    q = api.Quant(0.1, 0)
    X8, Y8 = api.Feature("x", 0, 32, 8, 8, "int8", q), api.Feature("y", 0, 32, 4, 4, "int8", q)
    r8 = emit(api.Pool(X8, Y8, "max", (2, 2), (2, 2)), api.EmitOptions(ppu_completes=True))
    assert not any("ppu_rdma" in t.counters.dma_read for t in r8.tasks)  # int8: the DPU taps (Q14)
