"""Native layouts: pack/unpack are inverses, and they reproduce the weight and
input buffers Mesa's rocket driver built for every captured convolution, and the
A/B tile formulas of the GEMM captures."""

import base64
import json
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from golden_cases import case_files
from rkc.ir.npu import layout


def _bo(case, handle):
    for b in case["submits"][0]["bo_contents"]:
        if b["handle"] == handle and "data" in b:
            return np.frombuffer(zlib.decompress(base64.b64decode(b["data"])), np.uint8)
    raise KeyError(handle)


def _tensor(case, role):
    t = next(t for t in case["model"]["tensors"] if t["role"] == role)
    return t, np.frombuffer(base64.b64decode(t["data_b64"]), np.uint8) if t["data_b64"] else None


def _mesa_convs():
    for path in case_files("mesa-rocket"):
        case = json.loads(path.read_text())
        if case["status"] == "ok" and case["params"]["kind"] == "conv":
            yield path.name, case


def test_mesa_weight_and_input_buffers_match_our_packing():
    checked = 0
    for name, case in _mesa_convs():
        p = case["params"]
        bos = {b["role"]: b["handle"] for b in case["bos"]}
        wt, w = _tensor(case, "weights")
        xt, x = _tensor(case, "input")
        signed_w = (w.astype(np.int16) - 0x80).astype(np.int8)
        if p["depthwise"]:
            kh, kw, c = wt["tflite_shape"][1:]
            packed = layout.pack_depthwise_weights(signed_w.reshape(kh, kw, c),
                                                   pad_value=wt["zero_point"] - 0x80)
        else:
            oc, kh, kw, ic = wt["tflite_shape"]
            # Mesa packs an even number of kernels; channel padding holds the
            # weight zero point, a padding kernel holds zeros
            grid = np.full((layout.align(oc, 2), kh, kw, layout.align(ic, 16)), wt["zero_point"] - 0x80, np.int8)
            grid[:oc, :, :, :ic] = signed_w.reshape(oc, kh, kw, ic)
            grid[oc:] = 0
            packed = layout.pack_weights(grid)
        got = _bo(case, bos["weights:op0"])
        assert bytes(got[:packed.size]) == packed.tobytes(), f"{name}: weights"
        assert not got[packed.size:].any(), f"{name}: bytes past the packed weights"
        _, h, w_, c = xt["tflite_shape"]
        if c > 1:
            img = (x.astype(np.int16) - 0x80).astype(np.int8).reshape(h, w_, c).transpose(2, 0, 1)
            native = layout.pack_feature(img, pad_value=xt["zero_point"] - 0x80)
            inp = _bo(case, bos["tensor:0"])
            assert bytes(inp[:native.size]) == native.tobytes(), f"{name}: input"
        checked += 1
    assert checked > 500


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.integers(1, 5), st.integers(1, 5), st.integers(1, 70), st.sampled_from([np.int8, np.float16]))
def test_weights_pack_unpack_inverse(k, kh, kw, c, dtype):
    w = np.random.default_rng(0).integers(-100, 100, (k, kh, kw, c)).astype(dtype)
    flat = layout.pack_weights(w)
    assert flat.size * flat.itemsize == layout.weight_bytes(k, kh, kw, c, flat.itemsize)
    np.testing.assert_array_equal(layout.unpack_weights(flat, k, kh, kw, c)[..., :c], w)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70), st.integers(1, 9), st.integers(1, 9), st.sampled_from([np.int8, np.float16, np.int32]))
def test_feature_pack_unpack_inverse(c, h, w, dtype):
    x = np.random.default_rng(1).integers(-100, 100, (c, h, w)).astype(dtype)
    native = layout.pack_feature(x)
    assert native.nbytes == layout.feature_bytes(c, h, w, x.itemsize)
    np.testing.assert_array_equal(layout.unpack_feature(native, c), x)
    view = layout.feature_view(native.reshape(-1).view(np.uint8), c, h, w, dtype)
    np.testing.assert_array_equal(layout.unpack_feature(view, c), x)


@pytest.mark.parametrize("dtype, c2, kg", [(np.int8, 16, 32), (np.float16, 8, 16)])
def test_gemm_layout_formulas(dtype, c2, kg):
    """hw-matmul.md 2.1 / the GEMM capture README: element offsets of A and B."""
    m, k, n = 5, 64, 2 * kg
    rng = np.random.default_rng(2)
    a = rng.integers(-9, 9, (m, k)).astype(dtype)
    b = rng.integers(-9, 9, (k, n)).astype(dtype)
    fa = layout.pack_gemm_a(a).reshape(-1)
    fb = layout.pack_gemm_b(b)
    for mi, ki in [(0, 0), (4, 63), (2, 17), (3, 40)]:
        assert fa[(ki // c2) * m * c2 + mi * c2 + ki % c2] == a[mi, ki]
    for ni, ki in [(0, 0), (n - 1, k - 1), (kg + 3, 33), (5, 31)]:
        assert fb[(ni // kg) * kg * k + (ki // 32) * 32 * kg + (ni % kg) * 32 + ki % 32] == b[ki, ni]


@pytest.mark.parametrize("dtype,n", [(np.int8, 100), (np.float16, 70), (np.int8, 64)])
def test_gemm_weights_packed_in_kernel_chunks_equal_packed_whole(monkeypatch, dtype, n):
    """_pack_b packs B a few kernel groups at a time (bounded temporaries): the
    bytes and K-tile offsets equal those of packing every kernel at once."""
    from rkc.compiler.npu import api, gemm

    rng = np.random.default_rng(0)
    k, name = 96, "int8" if dtype == np.int8 else "fp16"
    b = (rng.standard_normal((k, n)) * 40).astype(dtype)
    op = api.Gemm(api.Feature.gemm("a", 0, 4, k, name), b,
                  api.Feature.gemm("c", 0, 4, n, "int32" if name == "int8" else "fp16"), 4, name="w")
    kg = gemm.kernel_group(name)
    tiles = [(0, 64), (64, 32)]
    whole = gemm._pack_b(op, tiles, kg)
    monkeypatch.setattr(gemm, "_PACK_KERNELS", kg)  # one kernel group per chunk
    assert gemm._pack_b(op, tiles, kg) == whole
