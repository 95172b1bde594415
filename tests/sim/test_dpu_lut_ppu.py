"""The DPU lookup table and the PPU pool, on the programs the public
hardware notes validated (dpu-lut-activation.md, ppu-pooling.md)."""

import numpy as np
import pytest

from rkc.ir.npu import layout
from programs import Ref, flying_lut_task, lut_tables, place, pool_task, upload
from rkc.runtime.sim import Quirks, SimDevice
from rkc.runtime.sim.errors import NoWritebackError, QuirkRejection


def _sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def _run_lut(x: np.ndarray, le, lo, index_scale, lo_value=0.0, s_exp=0):
    dev = SimDevice()
    atoms = x.size // 8
    xb = Ref(upload(dev, x.astype(np.float16)))
    yb = Ref(dev.create_bo(x.size * 2))
    prog = place(dev, [flying_lut_task(xb, yb, atoms, le, lo, index_scale, lo_value, s_exp)],
                 in_bos=[xb.bo], out_bos=[yb.bo])
    dev.run([prog.job()])
    return yb.bo.host[:x.size * 2].view(np.float16).astype(np.float64)


def test_sigmoid_lut():
    scale = 2596.0  # the validated index scale: the tables cover |x| <= 6.31
    le, lo = lut_tables(_sigmoid, scale)
    x = np.linspace(-6.3, 6.3, 8 * 256)
    got = _run_lut(x, le, lo, scale)
    assert np.abs(got - _sigmoid(x.astype(np.float16))).max() < 2e-3
    far = np.array([-40.0, -9.0, 9.0, 40.0] * 2)  # past the tables: the end entries (slopes 0)
    got = _run_lut(far, le, lo, scale)
    assert np.abs(got - _sigmoid(far)).max() < 3e-3


def test_signed_output_decoded_by_out_cvt():
    scale = 16384 / 4.0
    le, lo = lut_tables(np.tanh, scale, lo=-1.0, s_exp=1)
    x = np.linspace(-3.9, 3.9, 8 * 64)
    got = _run_lut(x, le, lo, scale, lo_value=-1.0, s_exp=1)
    assert np.abs(got - np.tanh(x.astype(np.float16).astype(np.float64))).max() < 3e-3


def test_zero_table_entry_is_refused():
    le, lo = lut_tables(_sigmoid, 2596.0)
    le[3] = 0
    with pytest.raises(QuirkRejection, match="decodes as ~4.0"):
        _run_lut(np.zeros(8), le, lo, 2596.0)


def _pool(method, k, stride, pad, quirks):
    rng = np.random.default_rng(5)
    c, h, w = 16, 9, 9
    x = (rng.standard_normal((c, h, w)) * 4).astype(np.float16)
    dev = SimDevice(quirks=quirks)
    xb = Ref(upload(dev, layout.pack_feature(x)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    yb = Ref(dev.create_bo(2 * oh * ow * 16))
    dev.run([place(dev, [pool_task(xb, yb, c, h, w, k, stride, method, pad)]).job()])
    got = layout.unpack_feature(yb.bo.host[:2 * oh * ow * 16].view(np.float16).reshape(2, oh, ow, 8), c)
    fill = -np.inf if method == "max" else 0.0
    xp = np.full((c, h + 2 * pad, w + 2 * pad), fill)
    xp[:, pad:pad + h, pad:pad + w] = x
    wins = np.stack([xp[:, ky:ky + stride * (oh - 1) + 1:stride, kx:kx + stride * (ow - 1) + 1:stride]
                     for ky in range(k) for kx in range(k)])
    ref = wins.max(0) if method == "max" else wins.sum(0) / (k * k)
    return got.astype(np.float64), ref


PPU_COMPLETES = Quirks(completion_blocks=("DPU", "PPU"))


@pytest.mark.parametrize("k,stride,pad", [(2, 2, 0), (3, 1, 1), (3, 2, 1)])
def test_max_pool_is_exact(k, stride, pad):
    got, ref = _pool("max", k, stride, pad, PPU_COMPLETES)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("k,stride", [(2, 2), (3, 1)])
def test_average_pool_within_reciprocal_rounding(k, stride):
    got, ref = _pool("avg", k, stride, 0, PPU_COMPLETES)
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max() + 1e-3


def test_pool_alone_never_completes_under_stock_rocket():
    with pytest.raises(NoWritebackError, match="DPU interrupt"):
        _pool("max", 2, 2, 0, Quirks())


def test_lut_programs_alternating_on_one_core_keep_their_own_tables():
    """A task's decoding is replayed from the simulator's cache on later runs; its LUT
    uploads must be replayed too (here two functions take turns on core 0)."""
    x = np.linspace(-3.9, 3.9, 8 * 64)
    fns = [(_sigmoid, 2596.0, 0.0, 0), (np.tanh, 16384 / 4.0, -1.0, 1)]
    dev = SimDevice()
    xb = Ref(upload(dev, x.astype(np.float16)))
    progs = []
    for f, scale, lo_value, s_exp in fns:
        le, lo = lut_tables(f, scale, lo=lo_value, s_exp=s_exp)
        yb = Ref(dev.create_bo(x.size * 2))
        progs.append((place(dev, [flying_lut_task(xb, yb, x.size // 8, le, lo, scale, lo_value, s_exp)],
                            in_bos=[xb.bo], out_bos=[yb.bo]), yb, f))
    for _ in range(2):
        for prog, yb, f in progs:
            dev.run([prog.job()])
            got = yb.bo.host[:x.size * 2].view(np.float16).astype(np.float64)
            assert np.abs(got - f(x.astype(np.float16).astype(np.float64))).max() < 3e-3
    assert dev.mem.cache.hits >= 2
