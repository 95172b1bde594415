"""The many-row fused residual stretch (runtime/llm/prefill_fused.py) computes
what the per-step path computes (the prepared kernels, runtime/llm/prepared.py,
whose float64 dequantization and numpy-ordered sums serve as the reference)
within float32 tolerance (issue 37: the fused stretch's in edge is float32,
its tiles threaded): fp16 and int32 in edges (one K partial or two), with and
without the first norm, fp16 and int8 out edges, rotations with and without a
block-mixing factor (Gemma 3's 640 = 20 x 32), row counts that fill tiles and
that leave a partial one, kept values and the residual row- or column-major,
and padded rows and channels in the atoms.
Tolerances: each stored value within 4e-6 of its row's largest |value|; fp16
halves within that plus their own rounding (a sum that cancels leaves a
small value whose half may be two steps from the reference's); int8
scales within 1e-5 relative, codes within 1 (a value at a rounding tie),
at most 0.5 % of them off; the stand-alone edges against float64."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rkc.ir.npu import geometry
from rkc.ir.program import Step, TensorInfo
from rkc.runtime.execute import to_layout
from rkc.runtime.kernels.hadamard import hartley_matrix, make_rotation, rotate
from rkc.runtime.llm import prefill_fused as pf
from rkc.runtime.llm.fused_rows import block_mix, factor_operands, mix_then_quantize
from rkc.runtime.llm.prefill_kernels import LANES
from rkc.runtime.llm.threads import over_ranges
from rkc.runtime.llm import kernels, prepared
from rkc.runtime.plan import BoTensor

F32 = np.float32


def _mix_then_quantize(rot, rotated: np.ndarray, dst: np.ndarray, scale: np.ndarray) -> None:
    """The factor's product and the codes as fused_rows._OutEdge.finish runs them (mix_into_atoms, one
    call a range of rows on the pool's threads)."""
    mixed, block = np.full_like(rotated, np.nan), rot.block
    args = (rotated, mixed, *factor_operands(rot.factor.astype(F32)), block, dst, scale)
    over_ranges(lambda lo, hi: pf.mix_into_atoms(*args, lo, hi), rotated.shape[1] // block)


@pytest.mark.parametrize("rows", [1, 16, 37, 80])
@pytest.mark.parametrize("k,kind", [(1536, "auto"), (8960, "auto"), (640, "auto"), (3072, "hartley"), (240, "hartley"),
                                    (80, "kron")])
def test_mix_into_atoms_matches_a_float64_reference(rows, k, kind):
    """prefill_fused.mix_into_atoms (the factor's product by slabs of rows, the peaks taken as the last
    pass writes them, then the codes) over disjoint ranges of rows on two threads: the mixed rows F @
    rotated within float32 rounding of float64 (4e-6 of the largest |value|; Paley's 12 and 20, the latter
    on blocks of 4, narrower than an atom; Hartley's C35 and C15 in prime-factor form, C3 by its product),
    each row's scale max|mixed| / 127 exactly (a zero row's 1, a NaN row's 1), codes clip(rint(mixed /
    scale)) exactly; channels past K and the padding rows zeroed."""
    rot = make_rotation(k, kind)
    block, blocks = rot.block, k // rot.block
    rng = np.random.default_rng(rows + k)
    rotated = (rng.standard_normal((blocks, rows * block)) * 3).astype(F32)
    if rows > 3:
        rotated[:, block:2 * block] = 0.0  # row 1: zero
        rotated[blocks // 2, 2 * block + block // 2] = np.nan  # row 2: a NaN, through the product into every block
    out_bt, _, _ = _operand(rows, k, "int8")
    dst, stored = out_bt.atoms, out_bt.atoms.shape[1]
    scale = np.full(rows, -1.0, F32)
    mixed = np.full_like(rotated, np.nan)
    args = (rotated, mixed, *factor_operands(rot.factor.astype(F32)), block, dst, scale)
    over_ranges(lambda lo, hi: pf.mix_into_atoms(*args, lo, hi), rows, threads=2)
    want = rot.factor.astype(np.float64) @ rotated.astype(np.float64)
    finite = np.isfinite(want)
    assert np.all(np.abs(mixed[finite] - want[finite]) <= 4e-6 * np.abs(want[finite]).max())
    y = mixed.reshape(blocks, rows, block).transpose(1, 0, 2).reshape(rows, k)  # rows in channel order
    with np.errstate(invalid="ignore"):
        peak = np.abs(y).max(axis=1)
        want_scale = np.where(peak > 0, peak / F32(127.0), F32(1.0)).astype(F32)
        codes_want = np.clip(np.rint(y / want_scale[:, None]), -127, 127)
    np.testing.assert_array_equal(scale, want_scale)
    if rows > 3:
        assert scale[1] == 1.0 and scale[2] == 1.0
    codes = np.asarray(dst.transpose(1, 0, 2).reshape(stored, -1), np.int32)
    ok = np.isfinite(codes_want)
    np.testing.assert_array_equal(codes[:rows, :k][ok], codes_want[ok])
    assert not codes[:rows, k:].any() and not codes[rows:].any()


@pytest.mark.parametrize("rows", [1, 16, 37, 80])
@pytest.mark.parametrize("k", [640, 8960])
def test_mix_then_quantize_covers_every_row_once_with_the_factors_product(rows, k):
    """fused_rows.mix_then_quantize (the factor's product by slabs of rows on
    the threads, each slab's quantize right after): every row quantized once,
    after its columns' product, which is F @ rotated within float32 rounding
    of float64 (4e-6 of the largest |value|)."""
    rot = make_rotation(k, "auto")
    block, blocks = rot.block, k // rot.block
    rotated = np.random.default_rng(rows + k).standard_normal((blocks, rows * block)).astype(F32)
    mixed = np.full_like(rotated, np.nan)
    seen = np.zeros(rows, np.int64)
    want = rot.factor.astype(np.float64) @ rotated.astype(np.float64)

    def quantize(lo: int, hi: int) -> None:
        cols = slice(lo * block, hi * block)
        assert np.all(np.abs(mixed[:, cols] - want[:, cols]) <= 4e-6 * np.abs(want).max())
        seen[lo:hi] += 1
    mix_then_quantize(block_mix(rot.factor.astype(F32)), rotated, mixed, block, quantize, threads=2)
    assert np.all(seen == 1)


@pytest.mark.parametrize("m", [15, 20, 35, 63, 12, 27])
@pytest.mark.parametrize("cols, lo, hi", [(4096, 0, 4096), (5000, 1000, 4100), (300, 7, 300), (2048, 1024, 2048)])
def test_block_mix_is_the_factors_product(m, cols, lo, hi):
    """fused_rows.block_mix: a Hartley factor of coprime composite order (15, 20, 35, 63:
    prefill_rows.hartley_mix, the prime-factor form; ranges inside and across its 1024-column passes)
    and any other (12: Paley's; 27: a Hartley factor of a prime power, numpy's product) within float32
    rounding of float64 (2e-6 of the largest |value|), only columns lo..hi written."""
    factor = (hartley_matrix(m) if m != 12 else make_rotation(12 * 4, "kron").factor).astype(F32)
    x = np.random.default_rng(m + cols).standard_normal((m, cols)).astype(F32)
    out = np.full_like(x, np.nan)
    block_mix(factor)(x, out, lo, hi)
    want = factor.astype(np.float64) @ x[:, lo:hi].astype(np.float64)
    assert np.all(np.abs(out[:, lo:hi] - want) <= 2e-6 * np.abs(want).max())
    assert np.isnan(out[:, :lo]).all() and np.isnan(out[:, hi:]).all()


def _operand(m: int, k: int, dtype: str):
    itemsize = {"fp16": 2, "int8": 1, "int32": 4}[dtype]
    info = TensorInfo("t", [m, k], dtype, "native-gemm", "r", 0, geometry.nbytes([m, k], "native-gemm", itemsize))
    host = np.random.default_rng(m + k).integers(0, 256, info.nbytes, dtype=np.uint8)  # stale bytes
    return BoTensor(info, host), info, host


def _step(op, n_in, attrs):
    return Step(kind="cpu", name=op.lower(), op=op, inputs=[f"i{j}" for j in range(n_in)], outputs=["o", "s"],
                attrs=attrs)


@pytest.mark.parametrize("rows", [16, 37, 128])
@pytest.mark.parametrize("k,kind", [(640, "kron"), (640, "block"), (256, "kron")])
@pytest.mark.parametrize("edges", [("fp16", "fp16"), ("int32", "int8"), ("int32", "fp16"), ("fp16", "int8")])
@pytest.mark.parametrize("first_norm", [True, False])
def test_residual_tiles_match_the_per_step_kernels(rows, k, kind, edges, first_norm):
    _check_residual_tiles(rows, k, kind, edges, first_norm, None, True)


@pytest.mark.parametrize("rows", [16, 37])
@pytest.mark.parametrize("k,kind", [(640, "kron"), (256, "kron")])
@pytest.mark.parametrize("edges", [("int32", "int8"), ("fp16", "fp16")])
@pytest.mark.parametrize("scale,last_norm", [(0.37, True), (None, False)])
def test_gemma4_residual_bodies_match_the_per_step_kernels(rows, k, kind, edges, scale, last_norm):
    """Gemma 4's bodies: the per-layer projection's norm, Add, ScaleBy by the
    layer output scale, norm; the FFN's norm and Add with no second norm."""
    _check_residual_tiles(rows, k, kind, edges, True, scale, last_norm)


def _check_residual_tiles(rows, k, kind, edges, first_norm, body_scale, last_norm):
    partials = 2 if edges[0] == "int32" and first_norm and rows == 37 else 1
    rng = np.random.default_rng(rows * k)
    src_bt, src_info, src_host = _operand(rows, k, edges[0])
    extra_bt, extra_info, extra_host = _operand(rows, k, "int32")
    res = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)) * 3)).astype(F32)
    res[rows // 2, 5] = 3e4  # Gemma's residual stream reaches 3e4
    w1, w2 = (rng.standard_normal(k).astype(F32) for _ in range(2))
    eps = F32(1e-6)
    rs, ch, bias = (rng.random(rows) * 1e-3).astype(F32), rng.random(k).astype(F32), rng.standard_normal(k).astype(F32)
    if edges[0] == "fp16":
        to_layout((rng.standard_normal((rows, k)) * 40).astype(np.float16), src_info, src_host)
        x = src_bt.reader(np.float32)()  # the per-step in edge: the plan's reader
    else:
        to_layout(rng.integers(-2 ** 20, 2 ** 20, (rows, k)).astype(np.int32), src_info, src_host)
        if partials == 2:
            to_layout(rng.integers(-2 ** 20, 2 ** 20, (rows, k)).astype(np.int32), extra_info, extra_host)
            x = kernels.dequantize_rows([src_bt.reader()(), extra_bt.reader()(), rs, ch, bias], {"partials": 2},
                                        None)[0]
        else:
            dq = prepared.dequantize_rows(_step("DequantizeRows", 4, {}), [None, None, ch, bias], None)
            x = dq([src_bt.reader()(), rs, ch, bias])[0]
    norm = prepared.rms_norm(_step("RMSNorm", 2, {"epsilon": 1e-6}), [None, w1], None)
    n1 = norm([x, w1])[0] if first_norm else x
    total = n1 + res
    if body_scale is not None:
        total = total * F32(body_scale)
    n2 = prepared.rms_norm(_step("RMSNorm", 2, {"epsilon": 1e-6}), [None, w2], None)([total, w2])[0] if last_norm \
        else total

    out_bt, out_info, out_host = _operand(rows, k, edges[1])
    want_host = out_host.copy()
    rot = make_rotation(k, kind)
    if edges[1] == "fp16":
        BoTensor(out_info, want_host).writer()(n2)
    else:
        consts = [rot.signs.astype(F32)] + ([rot.factor.astype(F32)] if rot.factor is not None else [])
        attrs = {"rotation": "hadamard", "block": rot.block}
        q, want_scale = prepared.quantize_rows(_step("QuantizeRows", 1 + len(consts), attrs), [None, *consts], None)(
            [n2, *consts])
        BoTensor(out_info, want_host).writer()(q)

    atoms_in = src_bt.atoms
    atoms_out = out_bt.atoms
    in_kind = pf.IN_HALF if edges[0] == "fp16" else pf.IN_DEQUANT
    src = atoms_in.view(np.uint16) if in_kind == pf.IN_HALF else atoms_in
    order = "C" if rows == 16 else "F"  # the kept values (and the residual read) in either order
    bufs = [np.full((rows, k), np.nan, F32, order=order) for _ in range(4)]
    res = np.asarray(res, order=order)
    scale = np.full(rows, np.nan, F32)
    rotated = np.empty((k // rot.block, rows * rot.block), F32)  # by blocks
    if edges[1] == "fp16":
        out_kind, dst = pf.OUT_HALF, atoms_out.view(np.uint16)
    else:
        out_kind, dst = (pf.OUT_QUANT if rot.factor is None else pf.OUT_ROTATED), atoms_out
    extra = extra_bt.atoms if partials == 2 else np.zeros((0, 0, 0), np.int32)
    has_scale = body_scale is not None
    keep_n2 = last_norm and rows != 37  # not kept: the rotation's signs ride in the norm's weights
    consts = (in_kind, src, extra, rs, ch, bias, True, first_norm, w1, eps, res,
              F32(body_scale if has_scale else 1.0), has_scale, last_norm, w2, eps, True,
              first_norm, True, keep_n2, *bufs, out_kind, dst, rot.signs.astype(F32), rot.block,
              F32(1.0 / np.sqrt(rot.block)), scale, rotated)
    over_ranges(lambda lo, hi: pf.residual_tiles(*consts, lo, hi), -(-rows // LANES))  # two threads
    if out_kind == pf.OUT_ROTATED:  # the factor's product as fused_rows runs it, then the codes
        _mix_then_quantize(rot, rotated, dst, scale)
    for got, want in zip(bufs, [x, n1, total, n2]):
        if (got is bufs[1] and not first_norm) or (got is bufs[3] and not keep_n2):
            continue
        want = np.asarray(want, np.float64)
        assert np.all(np.abs(got - want) <= 4e-6 * np.abs(want).max(axis=1, keepdims=True))
    stored = out_bt.atoms.shape[1]
    if edges[1] == "fp16":
        got = BoTensor(out_info, out_host).reader(np.float32)().astype(np.float64)
        want = np.asarray(n2, np.float64)
        tol = 4e-6 * np.abs(want).max(axis=1, keepdims=True) + np.abs(want) * 2.0 ** -11 + 2.0 ** -25
        assert np.all(np.abs(got - want) <= tol)  # the float32 tolerance, then fp16's rounding
        assert not out_bt.atoms.view(np.uint16)[:, rows:].any()  # padding rows zeroed
        return
    np.testing.assert_allclose(scale, want_scale, rtol=1e-5)
    codes, want_codes = (np.asarray(BoTensor(out_info, h).atoms.transpose(1, 0, 2).reshape(stored, -1), np.int32)
                         for h in (out_host, want_host))
    off = np.abs(codes - want_codes)
    assert off.max() <= 1 and (off > 0).mean() <= 0.005
    assert not codes[rows:].any()  # padding rows zeroed


def _factor_rotation(k: int):
    """A rotation with a block-mixing factor for any K of the sweep: the
    compiler's own where it has one (1536 = C12 (x) H128, 2560, 640), else
    blocks of 256 mixed by a seeded orthogonal factor (2048: a power of two
    has none)."""
    rot = make_rotation(k, "auto")
    if rot.factor is not None:
        return rot
    q, _ = np.linalg.qr(np.random.default_rng(k).standard_normal((k // 256, k // 256)))
    return replace(rot, block=256, factor=q.astype(F32))


_SWEEP = [(rows, k, "add_norm") for rows in (1, 7, 128, 150) for k in (640, 1536, 2048, 2560)]
_SWEEP += [pytest.param(512, k, "add_norm", marks=pytest.mark.slow) for k in (640, 1536, 2048, 2560)]
_SWEEP += [(rows, k, body) for rows in (7, 150) for k in (640, 1536, 2048, 2560)
           for body in ("norm_add_scale_norm", "norm_add")]


@pytest.mark.parametrize("rows,k,body", _SWEEP)
def test_residual_rows_into_a_factors_rotation_match_a_float64_reference(rows, k, body):
    """The int32-in, factor-rotated-out stretch (residual_tiles' row-order
    path, prefill_rows._residual_rotated_rows: Qwen2.5's and Gemma 4's int8
    stretches) against float64 arithmetic over K 640-2560 and 1-512 rows
    (slabs of 16 and a partial one, two threads; 512 rows: slow): Qwen's Add
    and norm (one K partial, or two at odd rows) over every shape, Gemma 4's
    norm, Add, scale, norm (n2 kept at 150 rows: its own pass) and norm, Add
    at 7 and 150 rows. Kept values in C order, the residual in C order or F
    (128 rows). Tolerances (float32 arithmetic, float64 sums of squares):
    kept values within 4e-6 of their row's largest |value|; the rotated rows
    (the factor's product in float64) within 2e-7 of the row's 2-norm
    (measured: <= 2.3e-8)."""
    rng = np.random.default_rng([rows, k, len(body)])
    first_norm, last_norm = body.startswith("norm"), body.endswith("norm")
    body_scale = 0.37 if "scale" in body else None
    partials = 2 if rows % 2 else 1
    src_bt, src_info, src_host = _operand(rows, k, "int32")
    extra_bt, extra_info, extra_host = _operand(rows, k, "int32")
    acc = rng.integers(-2 ** 20, 2 ** 20, (rows, k))
    to_layout(acc.astype(np.int32), src_info, src_host)
    if partials == 2:
        more = rng.integers(-2 ** 20, 2 ** 20, (rows, k))
        to_layout(more.astype(np.int32), extra_info, extra_host)
        acc = acc + more
    rs, ch, bias = (rng.random(rows) * 1e-3).astype(F32), rng.random(k).astype(F32), rng.standard_normal(k).astype(F32)
    res = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)) * 3)).astype(F32)
    res[rows // 2, 5] = 3e4  # Gemma's residual stream reaches 3e4
    w1, w2 = (rng.standard_normal(k).astype(F32) for _ in range(2))
    eps = F32(1e-6)

    def norm(v, w):
        return v / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + float(eps)) * w.astype(np.float64)
    x = acc * rs.astype(np.float64)[:, None] * ch.astype(np.float64) + bias.astype(np.float64)
    n1 = norm(x, w1) if first_norm else x
    total = (n1 + res) * (body_scale if body_scale is not None else 1.0)
    n2 = norm(total, w2) if last_norm else total
    rot = _factor_rotation(k)
    want = rotate(n2, rot)

    keep = [rows == 7, first_norm and rows == 7, True, last_norm and rows == 150]  # x, n1, total, n2
    bufs = [np.full((rows, k), np.nan, F32) if kept else np.zeros((0, 0), F32) for kept in keep]
    rotated = np.full((k // rot.block, rows * rot.block), np.nan, F32)
    extra = extra_bt.atoms if partials == 2 else np.zeros((0, 0, 0), np.int32)
    consts = (pf.IN_DEQUANT, src_bt.atoms, extra, rs, ch, bias, True, first_norm, w1, eps,
              np.asarray(res, order="F" if rows == 128 else "C"),
              F32(body_scale if body_scale is not None else 1.0), body_scale is not None, last_norm, w2, eps, *keep,
              *bufs, pf.OUT_ROTATED, np.zeros((0, 0, 0), np.int8), rot.signs.astype(F32), rot.block,
              F32(1.0 / np.sqrt(rot.block)), np.zeros(0, F32), rotated)
    assert pf.residual_by_rows(pf.IN_DEQUANT, src_bt.atoms, pf.OUT_ROTATED, rot.block)
    over_ranges(lambda lo, hi: pf.residual_tiles(*consts, lo, hi), -(-rows // LANES))  # two threads
    for got, want_kept, kept in zip(bufs, [x, n1, total, n2], keep):
        if kept:
            assert np.all(np.abs(got - want_kept) <= 4e-6 * np.abs(want_kept).max(axis=1, keepdims=True))
    mixed = rot.factor.astype(np.float64) @ rotated.astype(np.float64)  # by blocks
    got = mixed.reshape(k // rot.block, rows, rot.block).transpose(1, 0, 2).reshape(rows, k)
    assert np.all(np.abs(got - want) <= 2e-7 * np.linalg.norm(want, axis=1, keepdims=True))


@pytest.mark.parametrize("rows", [16, 37, 80])
@pytest.mark.parametrize("k", [256, 640])
@pytest.mark.parametrize("kind,partials,bias", [("fp16", 1, False), ("int32", 1, False), ("int32", 1, True),
                                                ("int32", 2, True)])
def test_in_edge_tiles_match_a_float64_reference(rows, k, kind, partials, bias):
    """A stand-alone many-row in edge (fused_rows.edge_rows: attention's q, k
    and v): fp16 atoms widened exactly, int32 accumulators (one K partial or
    two) times the row's and the channel's scale (+ bias) within 4e-6 of the
    row's largest |value|; rows past M in the atoms never read."""
    rng = np.random.default_rng(rows + k + partials)
    src_bt, src_info, src_host = _operand(rows, k, kind)
    extra_bt, extra_info, extra_host = _operand(rows, k, "int32")
    rs, ch, b = (rng.random(rows) * 1e-3).astype(F32), rng.random(k).astype(F32), rng.standard_normal(k).astype(F32)
    if kind == "fp16":
        h = (rng.standard_normal((rows, k)) * 40).astype(np.float16)
        to_layout(h, src_info, src_host)
        want, in_kind, src = h.astype(np.float64), pf.IN_HALF, src_bt.atoms.view(np.uint16)
    else:
        acc = rng.integers(-2 ** 20, 2 ** 20, (rows, k)).astype(np.int64)
        to_layout(acc.astype(np.int32), src_info, src_host)
        if partials == 2:
            more = rng.integers(-2 ** 20, 2 ** 20, (rows, k))
            to_layout(more.astype(np.int32), extra_info, extra_host)
            acc = acc + more
        want = acc * rs.astype(np.float64)[:, None] * ch.astype(np.float64) + (b.astype(np.float64) if bias else 0)
        in_kind, src = pf.IN_DEQUANT, src_bt.atoms
    extra = extra_bt.atoms if partials == 2 else np.zeros((0, 0, 0), np.int32)
    out = np.full((rows, k), np.nan, F32, order="F")  # column-major, given as its transpose
    over_ranges(lambda lo, hi: pf.in_edge_tiles(in_kind, src, extra, rs, ch, b, bias, out.T, lo, hi), -(-rows // LANES))
    assert np.all(np.abs(out - want) <= 4e-6 * np.abs(want).max(axis=1, keepdims=True))


@pytest.mark.parametrize("rows", [16, 37, 80])
@pytest.mark.parametrize("k,kind", [(640, "kron"), (640, "block"), (256, "kron"), (1536, "kron"),
                                    (640, "hartley"), (2048, "auto")])
@pytest.mark.parametrize("out,order", [("fp16", "C"), ("int8", "C"), ("int8", "F")])
def test_out_edge_tiles_match_a_float64_reference(rows, k, kind, out, order):
    """A stand-alone many-row out edge (fused_rows.edge_rows: attention's
    output into the projection's operand): rows into fp16 atoms (the
    reference's half or a neighbour), or rotated (with and without a
    block-mixing factor, its product as fused_rows runs it; Gemma 4 E2B's
    H2048 without) and quantized into int8 atoms: scales within 1e-5
    relative, codes within 1, at most 0.5 % off; the padding rows zeroed.
    Rows in either memory order (fused_rows passes the per-step kernels'
    column-major rows as they are: the tiles; C-order int8 rows go row by
    row, _rows_to_blocks and _rows_into_atoms)."""
    rng = np.random.default_rng(rows * k)
    x = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)) * 2)).astype(F32)
    x[rows // 2, 3] = 300.0  # an outlier channel
    x = np.asarray(x, order=order)
    out_bt, out_info, out_host = _operand(rows, k, out)
    rot = make_rotation(k, kind)
    scale = np.full(rows, np.nan, F32)
    rotated = np.full((k // rot.block, rows * rot.block), np.nan, F32)
    if out == "fp16":
        out_kind, dst = pf.OUT_HALF, out_bt.atoms.view(np.uint16)
    else:
        out_kind, dst = (pf.OUT_QUANT if rot.factor is None else pf.OUT_ROTATED), out_bt.atoms
    consts = (x, out_kind, dst, rot.signs.astype(F32), rot.block, F32(1.0 / np.sqrt(rot.block)), scale, rotated)
    over_ranges(lambda lo, hi: pf.out_edge_tiles(*consts, lo, hi), -(-rows // LANES))
    stored = out_bt.atoms.shape[1]
    if out == "fp16":
        got = BoTensor(out_info, out_host).reader(np.float32)()
        ulps = np.abs(got.astype(np.float16).view(np.int16).astype(np.int32)
                      - x.astype(np.float16).view(np.int16).astype(np.int32))
        assert ulps.max() <= 1
        assert not out_bt.atoms.view(np.uint16)[:, rows:].any()
        return
    if out_kind == pf.OUT_ROTATED:  # the factor's product as fused_rows._OutEdge.finish runs it
        _mix_then_quantize(rot, rotated, dst, scale)
    y = rotate(x.astype(np.float64), rot)
    want_scale = np.abs(y).max(axis=1) / 127.0
    np.testing.assert_allclose(scale, want_scale, rtol=1e-5)
    codes = np.asarray(out_bt.atoms.transpose(1, 0, 2).reshape(stored, -1)[:, :k], np.int32)
    off = np.abs(codes[:rows] - np.clip(np.rint(y / want_scale[:, None]), -127, 127))
    assert off.max() <= 1 and (off > 0).mean() <= 0.005
    assert not codes[rows:].any()  # padding rows zeroed


@pytest.mark.parametrize("rows", [16, 37, 80])
@pytest.mark.parametrize("k", [1024, 640, 20])
def test_half_rows_into_atoms_are_numpys_halves(rows, k):
    """Attention's output (C-order rows) into an fp16 operand
    (fused_rows._out_edge_call): each value numpy's half of it (overflow to
    inf, subnormals, ties to even; a NaN a NaN), channels past K and the
    atoms' rows past M zeroed over stale bytes; tiles past the range given
    (a short chunk's pad rows) left as they were."""
    rng = np.random.default_rng(rows * k)
    x = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)) * 3)).astype(F32)
    x[0, :4] = [np.nan, 7e4, -3e-8, 1.0 + 2.0 ** -11]
    out_bt, out_info, out_host = _operand(rows, k, "fp16")
    dst = out_bt.atoms.view(np.uint16)
    tiles = -(-rows // LANES)
    if tiles > 1:  # the real tokens' tiles only: the last one keeps its stale bytes
        before = dst.copy()
        pf.half_rows_into_atoms(x, dst, 0, tiles - 1)
        np.testing.assert_array_equal(dst[:, (tiles - 1) * LANES:], before[:, (tiles - 1) * LANES:])
    over_ranges(lambda lo, hi: pf.half_rows_into_atoms(x, dst, lo, hi), tiles)
    got = dst.transpose(1, 0, 2).reshape(dst.shape[1], -1)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.isnan(got[:rows, :k].view(np.float16)[nan]).all()
    np.testing.assert_array_equal(got[:rows, :k][~nan], want[~nan])
    assert not got[:rows, k:].any() and not got[rows:].any()


@pytest.mark.parametrize("rows", [1, 16, 37])
@pytest.mark.parametrize("k,block", [(640, 32), (8960, 256), (1536, 128), (96, 16)])
def test_quantize_blocks_into_atoms_scales_and_codes(rows, k, block):
    """The codes after a factor's product (rows given by blocks, x [K / block,
    M x block]): each row's scale max|x| / 127 (its peak an integer maximum of
    the magnitudes' bits), 1 for a zero row and for a row holding a NaN, inf
    for a row holding an inf; codes clip(rint(x / scale)) exactly (float32's
    division, as jit.quantize_rows); rows outside lo..hi untouched, channels
    past K and the padding rows zeroed by the call ending at M."""
    rng = np.random.default_rng(rows + k)
    y = (rng.standard_normal((rows, k)) * np.exp(rng.standard_normal((rows, 1)) * 3)).astype(F32)
    y[0, k - 1] = 3e-40  # a subnormal: below every normal peak
    if rows > 3:
        y[1, 7], y[2] = np.nan, 0.0
        y[3, k // 2] = -np.inf
    x = np.ascontiguousarray(y.reshape(rows, k // block, block).transpose(1, 0, 2).reshape(k // block, rows * block))
    out_bt, _, _ = _operand(rows, k, "int8")
    dst, stored = out_bt.atoms, out_bt.atoms.shape[1]
    scale = np.full(rows, -1.0, F32)
    half = rows // 2
    if half:  # the upper rows first: the lower ones (and the padding) still stale
        pf.quantize_blocks_into_atoms(x, block, dst, scale, half, rows)
        assert np.all(scale[:half] == -1.0)
    pf.quantize_blocks_into_atoms(x, block, dst, scale, 0, half or rows)
    with np.errstate(invalid="ignore"):
        peak = np.abs(y).max(axis=1)  # NaN where a row holds one
        want_scale = np.where(peak > 0, peak / F32(127.0), F32(1.0)).astype(F32)
        want = np.clip(np.rint(y / want_scale[:, None]), -127, 127)
    np.testing.assert_array_equal(scale, want_scale)
    codes = np.asarray(dst.transpose(1, 0, 2).reshape(stored, -1), np.int32)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(codes[:rows, :k][finite], want[finite])
    assert not codes[:rows, k:].any() and not codes[rows:].any()

