"""The one-row compiled kernels of the decode plan's fused stretches
(runtime/llm/fused*.py -> runtime/llm/jit.py) against float64 references over
shape sweeps: the residual stretch's body in each form (norm, add, Gemma 4's
layer output scale, second norm, each optional but the add) and the attention
stretch's front (q / k norms, Gemma 4's plain v norm, RoPE, the fp16 cache
row), and the query alone before a KV-shared layer's attention.

Tolerances, float32 against float64: an RMSNorm's value within 4e-6 of the
row's largest magnitude (a pairwise float32 sum of squares, a division, a
square root and a product, each ~6e-8 relative: a few units in the last
place), a sum or product within the same of its operands' largest magnitude;
the cache's fp16 rows within one fp16 step (2^-10 relative) of the float64
value, as a rounding of a float32 within a few ulps of it may fall either side
of an fp16 tie. Bit-identity with the step-by-step kernels is held at model
level (tests/llm/test_plan.py, tests/llm/test_gemma4.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rkc.runtime.llm import decode_attention, jit
from rkc.runtime.llm.decode_attention import RowAttention, RowWork
from rkc.runtime.llm.prefill_kernels import ACT_GELU_TANH, ACT_SILU

F32 = np.float32
NORM_TOL = 4e-6


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return out if w is None else out * w.astype(np.float64)


def _close(got: np.ndarray, want: np.ndarray, tol: float = NORM_TOL) -> None:
    scale = np.abs(want).max(axis=-1, keepdims=True)
    assert np.all(np.abs(got.astype(np.float64) - want) <= tol * scale), np.abs(got - want).max()


@pytest.mark.parametrize("k", [1, 7, 64, 129, 1536, 2048, 6144])
@pytest.mark.parametrize("first_norm,has_scale,last_norm", [(True, False, True), (False, False, True),
                                                            (True, False, False), (True, True, True)])
def test_residual_body_is_the_float64_formula(k, first_norm, has_scale, last_norm):
    """norm_add_norm: out = [norm2](scale * ([norm1](x) + residual)), every
    intermediate row it writes too, against float64, over widths up to E2B's
    FFN (one leaf of the pairwise sum, several, an odd tail) and each body
    the decode plans fuse (Gemma 4's per-layer input and output scale ones)."""
    rng = np.random.default_rng(k + 10 * first_norm + 100 * has_scale + 1000 * last_norm)
    x = (rng.standard_normal((1, k)) * rng.uniform(0.1, 40)).astype(F32)
    res = (rng.standard_normal((1, k)) * rng.uniform(0.1, 40)).astype(F32)
    w1, w2 = (rng.standard_normal(k).astype(F32) for _ in range(2))
    scale = rng.uniform(0.05, 2.0, 1).astype(F32)
    n1, total, scaled, n2 = (np.full((1, k), np.nan, F32) for _ in range(4))
    jit.norm_add_norm(x, w1, F32(1e-6), first_norm, res, scale, has_scale, w2, F32(1e-5), last_norm,
                      n1, total, scaled, n2)
    want1 = _rms(x, w1, 1e-6) if first_norm else x.astype(np.float64)
    want_total = want1 + res
    _close(n1, want1)
    _close(total, want_total, 2 * NORM_TOL)
    summed = want_total * np.float64(scale[0]) if has_scale else want_total
    if has_scale:
        _close(scaled, summed, 2 * NORM_TOL)
    else:
        assert np.isnan(scaled).all()  # not written
    if last_norm:
        _close(n2, _rms(summed.astype(F32), w2, 1e-5))  # the norm of the float32 sum (its own error above)
        _close(n2, _rms(summed, w2, 1e-5), 2e-5)  # and of the float64 one: the sum's error carried through
    else:
        assert np.isnan(n2).all()


def _rope64(x: np.ndarray, pos: int, dims: int, neox: bool, base: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RoPE of x [1, H, D] at `pos` in float64, and the float32 cos / sin tables [1, dims / 2] it used."""
    theta = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    cos, sin = np.cos(pos * theta).astype(F32)[None], np.sin(pos * theta).astype(F32)[None]
    out = x.astype(np.float64)
    c, s = cos[0].astype(np.float64), sin[0].astype(np.float64)
    half = dims // 2
    ia, ib = (np.arange(half), np.arange(half) + half) if neox else (np.arange(0, dims, 2), np.arange(1, dims, 2))
    a, b = out[..., ia].copy(), out[..., ib].copy()
    out[..., ia], out[..., ib] = a * c - b * s, a * s + b * c
    return out, cos, sin


def _fp16_step(x: np.ndarray) -> np.ndarray:
    """One fp16 step at x's magnitude (2^-10 relative; the subnormal step below 2^-14)."""
    return np.maximum(np.abs(x), 2.0 ** -14) * 2.0 ** -10


# (heads, kv heads, head dim, rotated dims, neox, q/k norms, v norm, v is k): Gemma 4 E2B's sliding and full
# layers (hd 256 / 512, a quarter rotated: its partial RoPE), Gemma 3's, Qwen's (no norms), a tiny one
FRONTS = [(8, 1, 256, 256, True, True, True, False), (8, 1, 512, 128, True, True, True, True),
          (4, 1, 256, 256, True, True, False, False), (12, 2, 128, 128, False, False, False, False),
          (4, 2, 32, 16, True, True, True, True), (2, 2, 16, 16, False, True, True, False)]


@pytest.mark.parametrize("heads,hkv,hd,dims,neox,norms,v_norm,v_is_k", FRONTS)
def test_attention_front_is_the_float64_formula(heads, hkv, hd, dims, neox, norms, v_norm, v_is_k):
    """attention_front: the q / k norms, the plain v norm (Gemma 4; its v
    may be k's product before k's norm), RoPE of q and k, and the new cache
    row in fp16, against float64; query_front: q's part alone (a KV-shared
    layer's), the same values as attention_front's."""
    rng = np.random.default_rng(heads * hd + dims + 2 * norms + 4 * v_norm + 8 * v_is_k)
    q = (rng.standard_normal((1, heads, hd)) * 3).astype(F32)
    k = (rng.standard_normal((1, hkv, hd)) * 3).astype(F32)
    v = k if v_is_k else (rng.standard_normal((1, hkv, hd)) * 3).astype(F32)
    qw, kw = (rng.standard_normal(hd).astype(F32) for _ in range(2))
    pos, base, row = int(rng.integers(0, 5000)), 10000.0, 3
    qx, kx, vx = (np.empty_like(a) if on else a for a, on in ((q, norms), (k, norms), (v, v_norm)))
    qr, kr = np.empty_like(q), np.empty_like(k)
    k16, v16 = np.zeros((5, hkv, hd), np.float16), np.zeros((5, hkv, hd), np.float16)
    want_q = _rms(q, qw, 1e-6) if norms else q.astype(np.float64)
    want_k = _rms(k, kw, 1e-6) if norms else k.astype(np.float64)
    want_v = _rms(v, None, 1e-6) if v_norm else v.astype(np.float64)
    rq, cos, sin = _rope64(want_q, pos, dims, neox, base)
    rk, _, _ = _rope64(want_k, pos, dims, neox, base)
    jit.attention_front(q[0], k[0], v[0], qw, F32(1e-6), kw, F32(1e-6), np.ones(hd, F32), F32(1e-6), norms, v_norm,
                        qx[0], kx[0], vx[0], qx, kx, cos, sin, dims, neox, qr, kr, kr.view(np.uint32),
                        vx.view(np.uint32), k16.view(np.uint16), v16.view(np.uint16), row)
    _close(qx, want_q)
    _close(kx, want_k)
    _close(vx, want_v)
    _close(qr, rq, 2 * NORM_TOL)
    _close(kr, rk, 2 * NORM_TOL)
    for got, want in ((k16[row], rk[0]), (v16[row], want_v[0])):
        assert np.all(np.abs(got.astype(np.float64) - want) <= _fp16_step(want))
    assert not k16[:row].any() and not k16[row + 1:].any() and not v16[row + 1:].any()  # one row written
    qx2, qr2 = (np.empty_like(q) if norms else q), np.empty_like(q)
    jit.query_front(q[0], qw, F32(1e-6), norms, qx2[0], qx2, cos, sin, dims, neox, qr2)
    np.testing.assert_array_equal(qr2, qr)
    # front_and_attend: the same front (eps as floats, narrowed in it), then the attention over rows
    # [1, row + 1) of the cache: the bits of attention_front followed by RowAttention's call
    k16[:row], v16[:row] = (rng.standard_normal((row, hkv, hd)) for _ in range(2))
    kpos = np.arange(10, 15, dtype=np.int64)
    one = RowAttention(heads, hkv, hd, hd, hd ** -0.5, 0, RowWork(), threads_max=1)
    want = one(qr, k16[1:row + 1], v16[1:row + 1], kpos[1:row + 1], 20).copy()
    fx, fr, fkx, fkr, fvx = (np.zeros_like(a) for a in (qx, qr, kx, kr, vx))
    qxa, kxa, vxa = (b if on else a for a, b, on in ((q, fx, norms), (k, fkx, norms), (v, fvx, v_norm)))
    k16b, v16b, scores, bits = k16.copy(), v16.copy(), np.empty(heads * 8, F32), np.empty(8, np.int32)
    k16b[row] = v16b[row] = 0
    dst = np.full((heads, hd), np.nan, F32)
    decode_attention.front_and_attend(
        q[0], k[0], v[0], qw, 1e-6, kw, 1e-6, np.ones(hd, F32), 1e-6, norms, v_norm, qxa[0], kxa[0], vxa[0], qxa,
        kxa, cos, sin, dims, neox, fr, fkr, fkr.view(np.uint32), vxa.view(np.uint32), k16b.view(np.uint16),
        v16b.view(np.uint16), kpos, 1, row + 1, 20, one.scale_value, 0, 1, scores, bits, one.acc, one.mx, one.total,
        dst)
    np.testing.assert_array_equal(fr, qr)
    np.testing.assert_array_equal(fkr, kr)
    np.testing.assert_array_equal(k16b, k16)
    np.testing.assert_array_equal(v16b, v16)
    np.testing.assert_array_equal(dst.reshape(1, -1), want)


@pytest.mark.parametrize("k", [1, 13, 262144])
def test_scale_row_is_the_float64_product(k):
    """scale_row (the head's soft-capping scalings, in place): x * factor
    within half a float32 ulp of the float64 product (one rounding)."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((1, k)) * 50).astype(F32)
    factor = F32(1 / 30)
    want = x.astype(np.float64) * np.float64(factor)
    jit.scale_row(x, factor)
    assert np.all(np.abs(x - want) <= np.abs(want) * 2.0 ** -24)


# -- the int8 stretches as one call (jit.rotate_row, rotate_quantize_row, residual_row, gated_row) ---------
# A rotated value is a signed sum of a block's values (and, with a factor, of the blocks' mixes): float32
# within ROT_TOL of the row's largest magnitude of float64's. A code is rint(y / scale) of the float64 row
# y, but where y / scale lies within CODE_SLACK of a rounding tie (then either neighbour).
ROT_TOL = 2e-6
CODE_SLACK = 1e-3


def _rotation(k: int, kind: str):
    from rkc.runtime.kernels.hadamard import compiled_form, make_rotation

    if kind == "none":
        return None, (np.ones(1, F32), 0, F32(1.0), np.zeros((0, 0), F32))
    rot = make_rotation(k, kind)
    form = compiled_form(rot, k)
    return rot, (form.signs, form.block, form.norm, np.zeros((0, 0), F32) if form.factor is None else form.factor)


def _rotated64(y: np.ndarray, rot) -> np.ndarray:
    from rkc.runtime.kernels.hadamard import rotate

    return y if rot is None else rotate(y, rot)


def _check_codes(codes: np.ndarray, scale: np.ndarray, y: np.ndarray) -> None:
    """codes [C1, R, C2] row 0 and scale[0] against the float64 row y [K]; pad channels and rows zero."""
    k = y.shape[-1]
    s = np.abs(y).max() / 127
    assert abs(float(scale[0]) - s) <= 1e-6 * s
    got = codes[:, 0, :].reshape(-1)
    assert not got[k:].any() and not codes[:, 1:, :].any()
    assert np.all(np.abs(got[:k].astype(np.float64) - y / s) <= 0.5 + CODE_SLACK)


def _atoms_of(acc: np.ndarray) -> np.ndarray:
    """An int32 row as an NPU output's [C1, 4] atoms (pad channels garbage: never read)."""
    k = acc.shape[0]
    atoms = np.full((-(-k // 4), 4), 12345, np.int32)
    atoms.reshape(-1)[:k] = acc
    return atoms


_KINDS = [(64, "none"), (64, "block"), (640, "auto"), (1152, "hartley"), (1536, "auto"), (2048, "block")]


@pytest.mark.parametrize("k,c2", [(7, 16), (640, 16), (1000, 16), (2048, 32), (37, 8)])
def test_codes_into_atoms_are_quantize_rows(k, c2):
    """quantize_into_atoms (the int8 out edges' codes) gives jit.quantize_rows'
    codes and scales in the atoms, pad channels and rows zero, over rows with
    their largest magnitude negative, an infinity, a NaN (the scale then 1),
    all zeros, and subnormals only."""
    from rkc.runtime.llm.prefill_fused import quantize_into_atoms

    rng = np.random.default_rng(k)
    x = (rng.standard_normal((6, k)) * 30).astype(F32)
    x[0, k // 2] = -1e4
    x[1, k - 1] = np.inf
    x[2, k // 3] = np.nan
    x[3] = 0
    x[4] = rng.standard_normal(k).astype(F32) * F32(1e-40)
    want_q, want_s = np.empty((6, k), np.int8), np.empty(6, F32)
    jit.quantize_rows(x, want_q, want_s)
    c1 = -(-k // c2)
    q, s = np.full((c1, 8, c2), 7, np.int8), np.full(6, np.nan, F32)
    quantize_into_atoms(x, q, s)
    np.testing.assert_array_equal(s.view(np.uint32), want_s.view(np.uint32))
    got = q.transpose(1, 0, 2).reshape(8, -1)
    np.testing.assert_array_equal(got[:6, :k], want_q)
    assert not got[:, k:].any() and not got[6:].any()
    assert want_s[2] == 1 and want_s[3] == 1 and want_s[0] == F32(1e4) / F32(127)


@pytest.mark.parametrize("k,kind", _KINDS)
def test_rotate_quantize_row_is_the_float64_rotation(k, kind):
    """rotate_row (signs, butterflies, a block-mixing factor or none) and its
    codes against float64 over widths of one block, a Paley or Hartley factor,
    Gemma 3's 640 and 2048."""
    rng = np.random.default_rng(k)
    rot, (signs, block, norm, factor) = _rotation(k, kind)
    x = (rng.standard_normal((1, k)) * rng.uniform(0.1, 40)).astype(F32)
    work = np.full((4, k), np.nan, F32)
    want = _rotated64(x[0].astype(np.float64), rot)
    got = jit.rotate_row(x, signs, block, norm, factor, work)
    assert np.all(np.abs(got[0] - want) <= ROT_TOL * np.abs(want).max())
    codes, scale = np.full((-(-k // 16), 3, 16), 7, np.int8), np.empty(1, F32)
    jit.rotate_quantize_row(x, signs, block, norm, factor, work, codes, scale)
    _check_codes(codes, scale, want)


@pytest.mark.parametrize("k,kind", _KINDS)
@pytest.mark.parametrize("first_norm,has_scale,last_norm,has_bias", [(True, False, True, False),
                                                                     (False, True, True, True),
                                                                     (True, False, False, False)])
def test_residual_row_is_the_float64_formula(k, kind, first_norm, has_scale, last_norm, has_bias):
    """residual_row: dequantized int32 row, [norm1], + residual, [scale],
    [norm2], rotated and quantized, every row it writes against float64."""
    rng = np.random.default_rng([k, first_norm, has_scale, last_norm, has_bias])
    rot, (signs, block, norm, factor) = _rotation(k, kind)
    acc = rng.integers(-2 ** 20, 2 ** 20, k).astype(np.int32)
    rs, ch, bias = F32(rng.uniform(1e-4, 1e-2)), rng.uniform(0.001, 0.01, k).astype(F32), rng.standard_normal(k).astype(F32)
    res = (rng.standard_normal((1, k)) * 10).astype(F32)
    w1, w2 = (rng.standard_normal(k).astype(F32) for _ in range(2))
    scale = rng.uniform(0.05, 2.0, 1).astype(F32)
    x, n1, total, scaled, n2 = (np.full((1, k), np.nan, F32) for _ in range(5))
    work, codes, qs = np.empty((4, k), F32), np.full((-(-k // 16), 2, 16), 7, np.int8), np.empty(1, F32)
    jit.residual_row(_atoms_of(acc), k, rs, ch, bias, has_bias, x.reshape(-1), x, w1, F32(1e-6), first_norm, res,
                     scale, has_scale, w2, F32(1e-6), last_norm, n1, total, scaled, n2, signs, block, norm, factor,
                     work, codes, qs)
    x64 = acc * np.float64(rs) * ch.astype(np.float64) + (bias.astype(np.float64) if has_bias else 0)
    _close(x, x64[None], 1e-7)
    t64 = (_rms(x64[None], w1, 1e-6) if first_norm else x64[None]) + res
    _close(total, t64, 2 * NORM_TOL)
    if has_scale:
        t64 = t64 * np.float64(scale[0])
    y64 = _rms(t64, w2, 1e-6) if last_norm else t64
    _close(n2 if last_norm else (scaled if has_scale else total), y64, 2 * NORM_TOL)
    _check_codes(codes, qs, _rotated64(y64[0], rot))
    # the decode step's form (fused._residual_int8): the row scale's [1] array, eps and norm as floats
    outs = [np.full((1, k), np.nan, F32) for _ in range(5)]
    codes2, qs2 = np.full_like(codes, 7), np.empty(1, F32)
    jit.residual_row(_atoms_of(acc), k, np.array([rs]), ch, bias, has_bias, outs[0].reshape(-1), outs[0], w1, 1e-6,
                     first_norm, res, scale, has_scale, w2, 1e-6, last_norm, *outs[1:], signs, block, float(norm),
                     factor, np.empty((4, k), F32), codes2, qs2)
    for got, want in zip(outs + [codes2, qs2], [x, n1, total, scaled, n2, codes, qs]):
        np.testing.assert_array_equal(got, want)


def _gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("k,kind", _KINDS)
@pytest.mark.parametrize("act", ["GeluTanh", "SiLU"])
def test_gated_row_is_the_float64_formula(k, kind, act):
    """gated_row: gate and up dequantized, act(gate) * up (GELU's tanh form,
    SiLU), rotated and quantized, against float64; gate values out to +-30
    (the exp's clamped tails)."""
    rng = np.random.default_rng([k, act == "SiLU"])
    rot, (signs, block, norm, factor) = _rotation(k, kind)
    accs = [rng.integers(-2 ** 20, 2 ** 20, k).astype(np.int32) for _ in range(2)]
    rss = [F32(rng.uniform(1e-5, 3e-5)) for _ in range(2)]
    chs = [rng.uniform(0.1, 1.0, k).astype(F32) for _ in range(2)]
    bias = rng.standard_normal(k).astype(F32)
    g, u, a, hidden = (np.full((1, k), np.nan, F32) for _ in range(4))
    work, codes, qs = np.empty((4, k), F32), np.full((-(-k // 16), 2, 16), 7, np.int8), np.empty(1, F32)
    kind_id = ACT_GELU_TANH if act == "GeluTanh" else ACT_SILU
    jit.gated_row(_atoms_of(accs[0]), rss[0], chs[0], bias, True, _atoms_of(accs[1]), rss[1], chs[1], bias, False, k,
                  kind_id, g.reshape(-1), u.reshape(-1), g, u, a, hidden, signs, block, norm, factor, work, codes, qs)
    g64 = accs[0] * np.float64(rss[0]) * chs[0] + bias
    u64 = accs[1] * np.float64(rss[1]) * chs[1]
    _close(g, g64[None], 1e-7)
    _close(u, u64[None], 1e-7)
    a64 = _gelu64(g64) if act == "GeluTanh" else g64 / (1 + np.exp(-g64))
    _close(a, a64[None], 2e-6)
    h64 = a64 * u64
    _close(hidden, h64[None], 2e-6)
    _check_codes(codes, qs, _rotated64(h64, rot))
    # the decode step's form (fused_gate): the row scales' [1] arrays, norm as a float
    outs = [np.full((1, k), np.nan, F32) for _ in range(4)]
    codes2, qs2 = np.full_like(codes, 7), np.empty(1, F32)
    jit.gated_row(_atoms_of(accs[0]), np.array([rss[0]]), chs[0], bias, True, _atoms_of(accs[1]), np.array([rss[1]]),
                  chs[1], bias, False, k, kind_id, outs[0].reshape(-1), outs[1].reshape(-1), *outs, signs, block,
                  float(norm), factor, np.empty((4, k), F32), codes2, qs2)
    for got, want in zip(outs + [codes2, qs2], [g, u, a, hidden, codes, qs]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cols,kind", [(64, "none"), (640, "auto"), (1152, "hartley"), (2048, "block")])
@pytest.mark.parametrize("token", [0, 37, 99])
def test_embedding_row_is_the_float64_formula(cols, kind, token):
    """embedding_row: a token's row of the packed int8 head (kernels.packed_rows'
    layout) times its row scale, rotated back, scaled, normed, then rotated and
    quantized, against float64 over the rotations the compiler makes and rows
    of a kernel group's first, middle and last kernels."""
    from rkc.runtime.llm.kernels import packed_rows, packed_view

    rows, rng = 100, np.random.default_rng([cols, token])
    rot, (signs, block, norm, factor) = _rotation(cols, kind)
    factor_t = np.ascontiguousarray(factor.T)
    view, kg, cp = packed_view(np.zeros(1 << 20, np.uint8), rows, cols, np.int8)
    raw = rng.integers(-128, 128, view.size).astype(np.int8).view(np.uint8)
    view, kg, cp = packed_view(raw, rows, cols, np.int8)
    row_scale = rng.uniform(0.001, 0.01, rows).astype(F32)
    w = rng.standard_normal(cols).astype(F32)
    work, out_work = np.empty((4, cols), F32), np.empty((4, cols), F32)
    embd, scaled, normed = (np.full((1, cols), np.nan, F32) for _ in range(3))
    codes, qs = np.full((-(-cols // 16), 2, 16), 7, np.int8), np.empty(1, F32)
    jit.embedding_row(view, token, kg, cols, row_scale, signs, block, norm, factor_t, np.ones(cols, F32), F32(25.3),
                      w, F32(1e-6), work, embd, scaled, normed, signs, block, norm, factor, out_work, codes, qs)
    from rkc.runtime.kernels.hadamard import unrotate

    e64 = packed_rows(raw, np.array([token]), rows, cols, np.int8).astype(np.float64) * np.float64(row_scale[token])
    if rot is not None:
        e64 = unrotate(e64, rot)
    _close(embd, e64, ROT_TOL)
    _close(scaled, e64 * np.float64(F32(25.3)), ROT_TOL)
    n64 = _rms(e64 * np.float64(F32(25.3)), w, 1e-6)
    _close(normed, n64, 2 * NORM_TOL)
    _check_codes(codes, qs, _rotated64(n64[0], rot))


def _half_atoms_of(x: np.ndarray) -> np.ndarray:
    """A row's fp16 bits as an NPU output's [C1, 8] atoms (pad channels a NaN's bits: never read)."""
    k = x.shape[0]
    atoms = np.full((-(-k // 8), 8), 0x7E00, np.uint16)
    atoms.reshape(-1)[:k] = x.astype(np.float16).view(np.uint16)
    return atoms


@pytest.mark.parametrize("k", [1, 7, 64, 640, 1155, 2048])
@pytest.mark.parametrize("first_norm,has_scale,last_norm", [(True, False, True), (False, False, True),
                                                            (True, False, False), (True, True, True)])
def test_residual_half_row_is_the_float64_formula(k, first_norm, has_scale, last_norm):
    """residual_half_row: a fp16 row widened (exactly), [norm1], + residual,
    [scale], [norm2], rounded to fp16 into the next segment's atoms (within
    one fp16 step of float64; pad channels and rows zero), every row it
    writes against float64."""
    rng = np.random.default_rng([k, first_norm, has_scale, last_norm])
    x16 = (rng.standard_normal(k) * rng.uniform(0.1, 40)).astype(np.float16)
    res = (rng.standard_normal((1, k)) * 10).astype(F32)
    w1, w2 = (rng.standard_normal(k).astype(F32) for _ in range(2))
    scale = rng.uniform(0.05, 2.0, 1).astype(F32)
    x, n1, total, scaled, n2 = (np.full((1, k), np.nan, F32) for _ in range(5))
    half = np.full((-(-k // 8), 2, 8), 0x3C00, np.uint16)  # (1.0's bits: what must be zeroed past the row)
    jit.residual_half_row(_half_atoms_of(x16), k, x.reshape(-1).view(np.uint32), x, w1, F32(1e-6), first_norm, res,
                          scale, has_scale, w2, F32(1e-6), last_norm, n1, total, scaled, n2, half)
    x64 = x16.astype(np.float64)[None]
    np.testing.assert_array_equal(x, x64)  # (fp16 -> float32 is exact)
    t64 = (_rms(x64, w1, 1e-6) if first_norm else x64) + res
    _close(total, t64, 2 * NORM_TOL)
    if has_scale:
        t64 = t64 * np.float64(scale[0])
    y64 = _rms(t64, w2, 1e-6) if last_norm else t64
    _close(n2 if last_norm else (scaled if has_scale else total), y64, 2 * NORM_TOL)
    got = half[:, 0, :].reshape(-1)
    assert not got[k:].any() and not half[:, 1, :].any()
    assert np.all(np.abs(got[:k].view(np.float16).astype(np.float64) - y64[0]) <= _fp16_step(y64[0]))


@pytest.mark.parametrize("widths", [(1024, 256, 256), (640, 1, 7), (2048, 512, 0)])
def test_half_three_widens_each_row(widths):
    """half_three: two or three fp16 rows (an attention stretch's q, k, v in
    edges) widened exactly into their float32 rows; a width of 0 leaves the
    third untouched."""
    rng = np.random.default_rng(list(widths))
    rows = [(rng.standard_normal(max(n, 1)) * 5).astype(np.float16) for n in widths]
    outs = [np.full(max(n, 1), np.nan, F32) for n in widths]
    args = [a for n, r, o in zip(widths, rows, outs) for a in (_half_atoms_of(r), n, o.view(np.uint32))]
    jit.half_three(*args)
    for n, r, o in zip(widths, rows, outs):
        if n:
            np.testing.assert_array_equal(o[:n], r[:n].astype(F32))
        else:
            assert np.isnan(o).all()
