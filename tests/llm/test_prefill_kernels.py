"""The many-row kernels (runtime/llm/prefill_kernels.py) compute what the
row kernels (runtime/llm/jit.py, themselves numpy's bits) compute, bit for
bit: row counts that fill tiles and that leave a partial one, row lengths
below, at and past numpy's pairwise leaf, row- and column-major inputs and
strided views, values that overflow int8 steps, and NaN rows."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.kernels.hadamard import make_rotation
from rkc.runtime.llm import jit
from rkc.runtime.llm import prefill_kernels as pk

F32 = np.float32


def _inputs(rows, k, seed):
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)) * 3)).astype(F32)
    base[rows // 2, 3] = 3e4  # an outlier channel (Gemma's residual stream reaches 3e4)
    wide = np.zeros((rows, k + 5), F32)
    wide[:, 2:k + 2] = base
    return {"C": base, "F": np.asfortranarray(base), "view": wide[:, 2:k + 2]}


ROWS = [1, 16, 37, 128]
KS = [6, 64, 200, 640, 1024, 2048]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k", KS)
def test_rms_norm_is_the_row_kernel(rows, k):
    w = np.random.default_rng(k).standard_normal(k).astype(F32)
    prog = pk.pairwise_program(k)
    for name, x in _inputs(rows, k, rows * k).items():
        want, got = np.empty_like(x), np.empty_like(x)
        jit.rms_norm(x, w, F32(1e-6), want)
        pk.rms_norm(x, w, F32(1e-6), prog, got)
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", [8, 256, 1000])
def test_dequantize_rows_is_the_row_kernel(rows, n):
    rng = np.random.default_rng(rows + n)
    acc = rng.integers(-2 ** 24, 2 ** 24, (rows, n)).astype(np.int32)
    rs, ch, bias = (rng.random(rows) * 1e-3).astype(F32), rng.random(n).astype(F32), rng.standard_normal(n).astype(F32)
    for a in (np.asfortranarray(acc), np.asfortranarray(np.zeros((rows, n + 3), np.int32))[:, 1:n + 1]):
        a[...] = acc
        for has_bias in (False, True):
            want, got = np.empty(a.shape, F32), np.empty_like(a, F32)
            jit.dequantize_rows(a, rs, ch, bias, has_bias, want)
            pk.dequantize_rows(a, rs, ch, bias, has_bias, got)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("k,kind", [(64, "kron"), (640, "kron"), (640, "block"), (1024, "kron"), (2048, "block")])
def test_rotation_and_quantization_are_the_row_kernels(rows, k, kind):
    rot = make_rotation(k, kind)
    signs, block = rot.signs.astype(F32), rot.block
    norm = F32(1.0 / np.sqrt(block))
    for name, x in _inputs(rows, k, rows + k).items():
        x = x.copy() if name == "C" else x
        if name == "view":
            x[0, :] = np.nan if rows > 1 else x[0, :]  # a NaN row: its scale 1, as the row kernel's
        want = np.empty((rows, k), F32)
        jit.hadamard_rows(x, signs, block, norm, want)
        got = np.empty((rows, k), F32)
        pk.hadamard_rows(x, signs, block, norm, got)
        np.testing.assert_array_equal(got, want, err_msg=name)
        q_want, s_want = np.empty((rows, k), np.int8), np.empty(rows, F32)
        jit.quantize_rows(want, q_want, s_want)
        q_got, s_got = np.empty((rows, k), np.int8), np.empty(rows, F32)
        pk.rotate_quantize_rows(x, signs, block, norm, q_got, s_got)
        np.testing.assert_array_equal(s_got, s_want, err_msg=name)
        finite = np.isfinite(want).all(axis=1)  # a NaN's int8 is whatever the cast makes of it
        np.testing.assert_array_equal(q_got[finite], q_want[finite], err_msg=name)


@pytest.mark.parametrize("k,block,first",
                         [(2048, 2048, 256), (2048, 2048, 128), (1536, 512, 256), (1024, 1024, 64), (512, 256, 256)])
def test_butterfly_stages_continue_chunked_butterflies(k, block, first):
    """_butterflies on chunks of `first` channels, then butterfly_stages from
    `first` on: the whole block's butterflies, bit for bit."""
    buf = np.random.default_rng(k + first).standard_normal((k, pk.LANES)).astype(np.float32)
    want = buf.copy()
    pk._butterflies(want, block)
    for c in range(0, k, first):
        pk._butterflies(buf[c:c + first], first)
    pk.butterfly_stages(buf, block, first)
    assert np.array_equal(buf, want)


def test_pairwise_program_is_numpys_split():
    """640 = 320 + 320, each 160 + 160, each 80 + 80 (leaves of at most 128)."""
    prog = pk.pairwise_program(640)
    leaves = [(int(lo), int(n)) for op, lo, n in prog if op == 0]
    assert leaves == [(i * 80, 80) for i in range(8)]
    assert list(prog[:, 0]).count(1) == len(leaves) - 1
    x = np.random.default_rng(1).standard_normal((1, 640)).astype(F32)
    buf = np.zeros((640, pk.LANES), F32)
    buf[:, 0] = x[0]
    out = np.empty(pk.LANES, F32)
    pk._sum_squares(buf, prog, np.empty((len(prog) + 1, pk.LANES), F32), np.empty((8, pk.LANES), F32), out)
    assert out[0] == np.sum(np.multiply(x, x, order="C"), axis=-1, dtype=F32)[0]


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("dims,d", [(256, 256), (64, 128)])
def test_rope_is_the_row_kernel(neox, dims, d):
    rng = np.random.default_rng(dims + d)
    x = rng.standard_normal((37, 4, d)).astype(F32)
    ang = rng.standard_normal((37, dims // 2))
    cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
    npu = np.asfortranarray(rng.standard_normal((37, 6 * d)).astype(F32))[:, d:5 * d].reshape(37, 4, d)  # column-major
    for a in (x, np.asfortranarray(x), x[:, ::2], npu):
        want, got = np.empty_like(a), np.empty_like(a)
        jit.rope(a, cos, sin, dims, neox, want)
        pk.rope(a, cos, sin, dims, neox, got)
        np.testing.assert_array_equal(got, want)


def test_prepared_gelu_is_the_kernel():
    """The prepared GeluTanh (its inner terms in a reused buffer) gives the
    plain kernel's bits, row- and column-major, called twice."""
    from rkc.runtime.llm import kernels, prepared

    run = prepared.BINDERS["GeluTanh"](None, [None], None)
    x = (np.random.default_rng(0).standard_normal((37, 300)) * 4).astype(F32)
    for a in (x, np.asfortranarray(x), x, x[:, 1:]):
        got = run([a])[0]
        assert got.dtype == F32 and got.shape == a.shape
        np.testing.assert_array_equal(got, kernels.gelu_tanh([a], {}, None)[0])


def test_private_einsum_path_is_checked_before_use(monkeypatch):
    """prefill_attention calls numpy's private bmm_einsum (np.einsum(optimize=True)
    without its path search) only while it gives einsum's bits: a numpy whose
    private function changed meaning or signature is caught by the import check."""
    from rkc.runtime.llm import prefill_attention as pa

    if pa._bmm_einsum is None:
        pytest.skip("this numpy has no bmm_einsum: contract is np.einsum itself")
    assert pa._private_path_is_einsums()
    real = pa._bmm_einsum
    monkeypatch.setattr(pa, "_bmm_einsum", lambda eq, a, b: real(eq, a, b) * np.float32(1 + 2 ** -20))
    assert not pa._private_path_is_einsums()
    monkeypatch.setattr(pa, "_bmm_einsum", lambda a, b: a)
    assert not pa._private_path_is_einsums()
