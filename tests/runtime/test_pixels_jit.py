"""The model input's image edge (runtime/kernels/pixels_jit.py): a few-channel
float32 map into the first segment's 16-byte atoms, against a float64
reference of QuantizeLinear (int8: exact, the codes are integers) and numpy's
fp16 cast (exact bits), and against the general edges it replaces, over
channel counts, odd widths, saturating values, ties and strided inputs."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.ir.npu import geometry, layout
from rkc.runtime import half
from rkc.runtime.kernels import pixels_jit, quant_jit

SHAPES = [(1, 3, 5), (3, 7, 9), (3, 2, 33), (4, 5, 6), (2, 1, 1)]


def _fm(x: np.ndarray) -> np.ndarray:
    """[C, H, W] packed by the one reference layout code, as [C1, H, W, C2]."""
    c, h, w = x.shape
    raw = geometry.pack(x[None], "native").reshape(-1).view(np.uint8).copy()
    return layout.feature_view(raw, c, h, w, x.dtype)


def _quantized_f64(x: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """QuantizeLinear in float64: round half to even, saturate to int8."""
    q = np.rint(x.astype(np.float64) / np.float64(scale)) + zp
    return np.clip(q, -128, 127).astype(np.int8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("strided", [False, True])
def test_an_image_quantized_into_its_atoms_is_the_reference(shape, strided):
    rng = np.random.default_rng(sum(shape))
    scale, zp = np.float32(0.02), -7
    full = (rng.standard_normal((shape[0], shape[1], 2 * shape[2])) * 3).astype(np.float32)
    x = full[:, :, ::2] if strided else np.ascontiguousarray(full[:, :, :shape[2]])
    if not strided:  # a tie (rounded to even) and both saturations
        specials = np.array([2.5 * scale, -1e9, 1e9], np.float32)[:x.size]
        x.reshape(-1)[:specials.size] = specials
    want = _fm(_quantized_f64(x, scale, zp))
    got = np.full(want.shape, 99, np.int8)  # stale bytes, padding lanes included
    assert pixels_jit.is_image(shape[0], got)
    pixels_jit.quantize_image(x, float(scale), zp, got)
    np.testing.assert_array_equal(got, want)
    general = np.full(want.shape, 99, np.int8)
    quant_jit.quantize_into_feature(x, float(scale), zp, general)
    np.testing.assert_array_equal(got, general)


@pytest.mark.parametrize("shape", SHAPES)
def test_an_image_rounded_to_fp16_into_its_atoms_is_numpys_cast(shape):
    rng = np.random.default_rng(len(shape) + shape[2])
    x = (rng.standard_normal(shape) * 1e3).astype(np.float32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, 1e-7, 7e4][:x.size]
    with np.errstate(over="ignore"):  # 7e4 overflows to inf, as it should
        want = _fm(x.astype(np.float16)).view(np.uint16)
    got = np.full(want.shape, 0x5555, np.uint16)
    assert pixels_jit.is_image(shape[0], got)
    pixels_jit.narrow_image(x.view(np.uint32), got)
    np.testing.assert_array_equal(got, want)
    general = np.full(want.shape, 0x5555, np.uint16)
    half.narrow_into_feature(x.view(np.uint32), general)
    np.testing.assert_array_equal(got, general)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("scale", [0.05, 0.0123, 1 / 255, 3.7, 2.0 ** -7, 2.0 ** -70, 2.0 ** 65, 2.0 ** -140])
def test_an_image_of_half_integer_quotients_quantizes_as_the_division(channels, scale):
    """The float32 product with the reciprocal flags the rows where it may round apart from the
    float64 division, which are redone: every half-integer quotient and its float32 neighbours
    (~7 % of which the product rounds the other way), around the saturation of every zero
    point too, one a row (a row is redone whole: two would hide each other). A reciprocal
    outside float32's normal range (2^-140's overflows) takes the division for every row."""
    s = np.float32(scale)
    quotients = np.concatenate([np.arange(-140, 140), np.arange(250, 262), np.arange(505, 519)])
    halves = (np.concatenate([quotients, -quotients]) + 0.5).astype(np.float64) * np.float64(s)
    ties = np.concatenate([halves.astype(np.float32), np.nextafter(halves.astype(np.float32), np.float32(np.inf)),
                           np.nextafter(halves.astype(np.float32), np.float32(-np.inf))])
    rng = np.random.default_rng(channels)
    x = (rng.uniform(-100, 100, (channels, ties.size, 7)) * s).astype(np.float32)
    x[rng.integers(0, channels, ties.size), np.arange(ties.size), rng.integers(0, 7, ties.size)] = ties
    for zp in (0, -7, 127, -128):
        want = _fm(_quantized_f64(x, float(s), zp))
        got = np.full(want.shape, 99, np.int8)
        pixels_jit.quantize_image(x, float(s), zp, got)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_an_image_holding_nans_keeps_numpys_nan_bits(channels):
    """A row holding a NaN is rounded by numpy's bits (the payload's top kept, the
    signalling bit too), the other rows by the vector rounding."""
    rng = np.random.default_rng(channels)
    x = (rng.standard_normal((channels, 6, 11)) * 1e3).astype(np.float32)
    bits = x.view(np.uint32)
    bits[0, 1, 3] = 0x7F800001  # a signalling NaN, its payload's top bits zero
    bits[-1, 4, 10] = 0xFFC12345  # a negative quiet NaN with a payload
    want = _fm(x.astype(np.float16)).view(np.uint16)
    got = np.full(want.shape, 0x5555, np.uint16)
    pixels_jit.narrow_image(bits, got)
    np.testing.assert_array_equal(got, want)


def test_a_map_of_many_channels_is_no_image():
    assert not pixels_jit.is_image(5, np.zeros((1, 2, 2, 16), np.int8))
    assert not pixels_jit.is_image(16, np.zeros((1, 2, 2, 16), np.int8))
    assert not pixels_jit.is_image(3, np.zeros((2, 2, 2, 8), np.uint16))


@pytest.mark.parametrize("scale", [0.05, 0.0123, 1 / 255, 3.7, 2.0 ** -7, 2.0 ** -70, 2.0 ** 65])
def test_quantizing_by_the_reciprocal_rounds_ties_as_the_division(scale):
    """quant_jit.quantize_row multiplies by the reciprocal; every half-integer quotient
    (and its float32 neighbours), those around the saturation of every zero point (|q|
    near 256 and 512) and at extreme scales included, still rounds as the float64
    division does."""
    from rkc.runtime.kernels.quant_jit import quantize_row

    s = np.float32(scale)
    quotients = np.concatenate([np.arange(-140, 140), np.arange(250, 262), np.arange(505, 519)])
    quotients = np.concatenate([quotients, -quotients])
    halves = (quotients + 0.5).astype(np.float64) * np.float64(s)
    x = np.concatenate([halves.astype(np.float32), np.nextafter(halves.astype(np.float32), np.float32(np.inf)),
                        np.nextafter(halves.astype(np.float32), np.float32(-np.inf)),
                        np.random.default_rng(1).standard_normal(999).astype(np.float32) * 100 * s])
    for zp in (0, -7, 100, -128, 127):
        got = np.empty(x.size, np.int8)
        quantize_row(x, float(s), 1.0 / float(s), float(zp), got)
        np.testing.assert_array_equal(got, _quantized_f64(x, float(s), zp))
