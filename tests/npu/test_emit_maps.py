"""The NPU emitters' map operations on the simulator against numpy: nearest
upsampling, transposed convolutions whose stride equals the kernel, maps of
fewer than 4 rows stored over zero rows, depthwise weights from a run-time
buffer. The rest of the emitters: test_emit_sim.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

from rkc.compiler.npu import api, epilogue
from rkc.compiler.npu.dispatch import emit
from rkc.compiler.npu.conv_core import kernel_group
from rkc.ir.errors import UnsupportedError

from npu.emit_cases import conv_reference, fp16_data, int8_data, needs_fp16_depthwise_writer, run_sim  # noqa: E402


# -- nearest x2 upsampling ------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(["int8", "fp16"]), k=st.integers(2, 8), atoms=st.integers(1, 9), h=st.integers(4, 16),
       w=st.integers(1, 12), slice_at=st.integers(0, 1), seed=st.integers(0, 999), cores=st.sampled_from([1, 3]))
@example("fp16", 8, 3, 15, 15, 1, 0, 3)  # PP-OCRv4 det's x8 of 24 channels into its Concat slice
@example("int8", 4, 3, 8, 6, 1, 1, 3)  # 48 int8 channels: a 32-channel copy and an overlapping one
def test_upsample(dtype, k, atoms, h, w, slice_at, seed, cores):
    """Nearest xk as a 1 x k window and k copies a line apart (compiler/npu/upsample.py),
    exact against numpy (maps of 4+ rows: the row copies read the map, Q2), over channel
    counts that fill the depthwise writer's groups and counts that do not (identity
    copies, the last overlapping its predecessor); its output a channel slice of a wider
    map (a Concat's piece) or a map of its own; the surfaces around the slice stay untouched."""
    c2 = 16 if dtype == "int8" else 8
    c = atoms * c2
    if c < kernel_group(dtype) and c % (64 if dtype == "int8" else 32):
        with pytest.raises(UnsupportedError, match="channels"):  # one direct task would write past C
            emit(api.Upsample(api.Feature("x", 0, c, h, w, dtype, api.Quant(0.1) if dtype == "int8" else None),
                              api.Feature("y", 0, c, k * h, k * w, dtype,
                                          api.Quant(0.1) if dtype == "int8" else None), "up", k))
        return
    q = api.Quant(0.1, int(np.random.default_rng(seed).integers(-20, 20))) if dtype == "int8" else None
    x = int8_data((c, h, w), seed) if dtype == "int8" else fp16_data((c, h, w), seed)
    X = api.Feature("x", 0, c, h, w, dtype, q)
    wide = api.Feature("y", 0, c + 2 * c2, k * h, k * w, dtype, q)  # one surface either side of the slice
    Y = wide.view(channel0=c2, channels=c) if slice_at else api.Feature("y", 0, c, k * h, k * w, dtype, q)
    fill = np.full(wide.shape, 7, x.dtype)
    r = emit(api.Upsample(X, Y, "up", k), api.EmitOptions(cores=cores))
    event(f"{len(r.jobs)} band(s), {len(r.tasks)} task(s)")
    assert len(r.jobs) == min(cores, h // 4) and len({j.lane for j in r.jobs}) == len(r.jobs)
    assert r.extents().get("y", 0) <= (Y.offset + Y.nbytes if slice_at else Y.nbytes)  # nothing past its channels
    # a band's job reads only what it writes itself: fp16 runs it as one chained kick per core
    out = run_sim(r, {"x": (X, x), **({"y": (wide, fill)} if slice_at else {})}, chained=dtype == "fp16")
    np.testing.assert_array_equal(out.feature(Y), x.repeat(k, axis=1).repeat(k, axis=2))
    if slice_at:
        around = out.feature(wide)
        np.testing.assert_array_equal(around[:c2], fill[:c2])
        np.testing.assert_array_equal(around[c2 + c:], fill[c2 + c:])


def test_upsample_refusals():
    x8 = api.Feature("x", 0, 16, 4, 4, "int8", api.Quant(0.1))
    with pytest.raises(UnsupportedError, match="32\\+ channels"):  # the writer's extra channels
        emit(api.Upsample(x8, api.Feature("y", 0, 16, 8, 8, "int8", api.Quant(0.1))))
    with pytest.raises(UnsupportedError, match="over the CNA's 15"):  # the window's padding
        emit(api.Upsample(x8, api.Feature("y", 0, 16, 68, 68, "int8", api.Quant(0.1)), "up", 17))
    x = api.Feature("x", 0, 64, 4, 4, "int8", api.Quant(0.1))
    with pytest.raises(UnsupportedError, match="at least 4"):  # the row copies read a 2-row map (Q2)
        emit(api.Upsample(api.Feature("x", 0, 64, 2, 8, "int8", api.Quant(0.1)),
                          api.Feature("y", 0, 64, 4, 16, "int8", api.Quant(0.1))))
    with pytest.raises(UnsupportedError, match="one quantization"):
        emit(api.Upsample(x, api.Feature("y", 0, 64, 8, 8, "int8", api.Quant(0.2))))
    with pytest.raises(UnsupportedError, match="is \\(64, 8, 8\\)"):
        emit(api.Upsample(x, api.Feature("y", 0, 64, 8, 9, "int8", api.Quant(0.1))))
    with pytest.raises(UnsupportedError, match="dense rows"):  # only a DPU destination has a line stride
        emit(api.Conv2D(api.Feature("x", 0, 16, 4, 4, "fp16", line_stride=128), np.ones((16, 1, 1, 16), np.float16),
                        api.Feature("y", 0, 16, 4, 4, "fp16")))
    with pytest.raises(UnsupportedError, match="line stride"):
        api.Feature("x", 0, 16, 4, 4, "fp16", line_stride=48)


# -- transposed convolution, stride = kernel ------------------------------------------------
def _conv_transpose_ref(x, wt, k):
    """out[o, k*y + i, k*x + j] = sum_c wt[o, i, j, c] x[c, y, x], in float64 / int64."""
    c, h, w = x.shape
    acc = np.einsum("oijc,cyx->oyixj", wt, x)
    return acc.reshape(wt.shape[0], k * h, k * w)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(["int8", "fp16"]), k=st.sampled_from([2, 2, 3]), c=st.integers(1, 40),
       o=st.integers(1, 40), h=st.integers(4, 14), w=st.integers(1, 14), act=st.sampled_from([None, "relu"]),
       slice_at=st.integers(0, 1), seed=st.integers(0, 999), cores=st.sampled_from([1, 3]))
def test_conv_transpose_stride_equals_kernel(dtype, k, c, o, h, w, act, slice_at, seed, cores):
    """A k x k / k transposed convolution as per-row-tap 1 x k windows over the one-pixel
    rows and copies k lines apart (compiler/npu/conv_transpose.py), against numpy:
    fp16 to fp16 tolerance, int8 bit for bit against the DPU's requantization of the
    accumulator numpy computes (and within a step of the real result); its output a
    channel slice of a wider map or a map of its own, the surfaces around the slice
    untouched."""
    if dtype == "fp16":
        x, wt, xq, wq, yq = fp16_data((c, h, w), seed), fp16_data((o, k, k, c), seed + 1, 1 / np.sqrt(c)), None, None, None
        bias = np.random.default_rng(seed).standard_normal(o).astype(np.float32)
        group = 8
    else:
        zx = int(np.random.default_rng(seed).integers(-10, 10))
        x, wt = int8_data((c, h, w), seed), int8_data((o, k, k, c), seed + 1)
        xq, wq, yq = api.Quant(0.05, zx), api.Quant(0.02), api.Quant(0.05 * 0.02 * np.sqrt(c) * 30, 3)
        bias = np.random.default_rng(seed).integers(-2000, 2000, o).astype(np.int32)
        group = 16
    X = api.Feature("x", 0, c, h, w, dtype, xq)
    written = -(-o // kernel_group(dtype)) * kernel_group(dtype)  # a direct convolution's whole kernel groups
    wide = api.Feature("y", 0, group + written + group, k * h, k * w, dtype, yq)
    Y = wide.view(channel0=group, channels=o) if slice_at else api.Feature("y", 0, o, k * h, k * w, dtype, yq)
    fill = np.full(wide.shape, 7, x.dtype)
    epi = api.Epilogue(bias=bias, activation=act)
    r = emit(api.ConvTranspose2D(X, wt, Y, wq, epi, "ct"), api.EmitOptions(cores=cores))
    event(f"{len(r.jobs)} band(s), {len(r.tasks)} task(s)")
    assert len(r.jobs) == min(cores, h // 4) and len({j.lane for j in r.jobs}) == len(r.jobs)
    touched = r.extents()
    assert all(touched[s.name] <= s.size for s in r.scratch)  # the row maps hold what the convolutions write
    out = run_sim(r, {"x": (X, x), **({"y": (wide, fill)} if slice_at else {})}, chained=dtype == "fp16")
    got = out.feature(Y)
    if dtype == "fp16":
        ref = _conv_transpose_ref(x.astype(np.float64), wt.astype(np.float64), k) + bias[:, None, None]
        if act:
            ref = np.maximum(ref, 0)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=3e-3, atol=3e-3 * max(1.0, np.abs(ref).max()))
    else:
        acc = _conv_transpose_ref(x.astype(np.int64) - zx, wt.astype(np.int64), k)
        # the DPU's plan takes the raw accumulator, which holds zx times its weight sums (the
        # padding reads the zero point) and removes them in its bias term, whatever the sums
        sums = wt.astype(np.int64).sum(axis=(1, 2, 3))
        plan = epilogue.plan(epilogue.DpuRequest("int8", Y, o, xq, wq, sums, epi))
        np.testing.assert_array_equal(got, plan.apply(acc + zx * sums[:, None, None]))
        real = (acc + bias[:, None, None]) * 0.05 * 0.02
        if act:
            real = np.maximum(real, 0)
        ideal = np.clip(np.rint(real / yq.scale) + yq.zero_point, -128, 127)
        assert np.abs(got.astype(np.int64) - ideal).max() <= 1
    if slice_at:
        around = out.feature(wide)
        np.testing.assert_array_equal(around[:group], fill[:group])
        np.testing.assert_array_equal(around[group + written:], fill[group + written:])


# -- maps of few rows stored over zero rows: the flat DPU paths skip the zero rows -------------
@pytest.mark.parametrize("kind", ["sigmoid", "add", "mul"])
@pytest.mark.parametrize("c, h, w", [(16, 3, 40), (24, 2, 13), (40, 1, 30)])
def test_flat_ops_on_maps_over_zero_rows_leave_them_alone(kind, c, h, w):
    """A LUT activation and an element-wise op over maps of h < 4 rows stored in 4-row
    surfaces (ir/npu/geometry.py): one run per surface over its h rows; the zero rows
    below stay as they were (sigmoid(0) would be 0.5). Against numpy."""
    from rkc.compiler.npu import lut

    rows = 4
    full = {n: api.Feature(n, 0, c, rows, w, "fp16") for n in ("a", "b", "y")}
    padded = {n: replace(f, height=h, surface_stride=f.dense_surface_bytes, row_padded=True) for n, f in full.items()}
    data = {n: np.zeros((c, rows, w), np.float16) for n in ("a", "b")}
    for i, n in enumerate(data):
        data[n][:, :h] = fp16_data((c, h, w), c + h + i)
    canary = np.full((c, rows, w), 3, np.float16)
    if kind == "sigmoid":
        r = emit(api.Activation(padded["a"], padded["y"], kind))
        plan = lut.plan(kind)
        ref, tol = plan.function(data["a"][:, :h].astype(np.float64)), plan.tolerance()
    else:
        r = emit(api.Elementwise(padded["a"], padded["b"], padded["y"], kind, "e"))
        ref = {"add": np.add, "mul": np.multiply}[kind](*(data[n][:, :h].astype(np.float64) for n in "ab"))
        tol = 3e-3 * max(1.0, np.abs(ref).max())
    got = run_sim(r, {n: (full[n], v) for n, v in (*data.items(), ("y", canary))}).feature(full["y"])
    assert np.abs(got[:, :h].astype(np.float64) - ref).max() <= tol
    np.testing.assert_array_equal(got[:, h:], canary[:, h:])


# -- a depthwise convolution whose weights are written at run time ----------------------------
@pytest.mark.parametrize("c, h, w", [(24, 6, 5), (96, 12, 12), (40, 30, 30)])
def test_depthwise_weights_from_a_run_time_buffer(c, h, w):
    """x * s for a per-channel vector s the host writes at run time (a squeeze-excite
    gate): a 1x1 fp16 depthwise convolution whose weights are the buffer holding s as a
    native [C, 1, 1] map, which is byte for byte the 1x1 depthwise weight layout."""
    needs_fp16_depthwise_writer()
    X = api.Feature("x", 0, c, h, w, "fp16")
    S = api.Feature("s", 0, c, 1, 1, "fp16")
    Y = api.Feature("y", 0, c, h, w, "fp16")
    stand_in = np.zeros((1, 1, c), np.float16)
    r = emit(api.Conv2D(X, stand_in, Y, depthwise=True, name="mul", weights_buffer="s"))
    assert not r.constants or all(k.name != "mul.weights" for k in r.constants)
    x, s = fp16_data((c, h, w), c), fp16_data((c, 1, 1), c + 1)
    got = run_sim(r, {"x": (X, x), "s": (S, s)}).feature(Y).astype(np.float64)
    np.testing.assert_allclose(got, x.astype(np.float64) * s.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_run_time_weights_are_fp16_depthwise_only():
    X = api.Feature("x", 0, 16, 4, 4, "fp16")
    with pytest.raises(UnsupportedError, match="fp16 depthwise only"):
        emit(api.Conv2D(X, np.zeros((16, 1, 1, 16), np.float16), api.Feature("y", 0, 16, 4, 4, "fp16"),
                        weights_buffer="w"))


# -- a depthwise convolution over a map of fewer than 4 rows, stored with zero rows below ------
@pytest.mark.parametrize("c, h, w, k, stride, pad", [
    (32, 3, 6, 5, (1, 1), 2), (96, 2, 12, 5, (1, 1), 2), (64, 3, 24, 5, (2, 1), 2), (32, 2, 5, 5, (2, 2), 2),
    (40, 3, 7, 3, (1, 1), 1), (24, 3, 9, 3, (2, 2), 1), (16, 1, 10, 5, (1, 1), 4), (48, 2, 6, 3, (1, 1), 2),
    (448, 2, 48, 5, (1, 1), 2)])  # 448 x 48: five rows of the map would not fit CBUF, its four do
def test_few_row_depthwise_reads_zero_rows_below_the_map(c, h, w, k, stride, pad):
    """PP-OCR cls's 5x5 depthwise convolutions over 2- and 3-row maps (pad 2), and 3x3
    ones: a task reads 4+ rows (Q2), so the map is stored in 4-row surfaces whose rows
    past h are zero, and the task reads those 4 rows with its bottom padding 4 - h rows
    smaller (a zero row and a zero-padded row are the same sum: documented behaviour
    only). Its result is written into 4-row surfaces too, the rows past it left as they
    were, so the next such convolution can read it the same way. Against numpy over
    the h rows."""
    needs_fp16_depthwise_writer()
    rows, pads = 4, (pad, pad, pad, pad)
    x = fp16_data((c, h, w), c + h)
    wt = fp16_data((k, k, c), c + 1, 0.2)
    want = conv_reference(x, wt, stride, pads, True, 0)
    oh, ow = want.shape[1:]
    stored = np.zeros((c, rows, w), np.float16)
    stored[:, :h] = x
    X = api.Feature("x", 0, c, rows, w, "fp16")
    Y4 = api.Feature("y", 0, c, max(rows, oh), ow, "fp16")  # the result's own 4-row surfaces
    Y = replace(Y4, height=oh, surface_stride=Y4.dense_surface_bytes, row_padded=True)
    op = api.Conv2D(replace(X, height=h), wt, Y, stride=stride, padding=pads, depthwise=True, name="dw")
    with pytest.raises(UnsupportedError, match="at least 4"):  # the map as it is: refused (Q2)
        emit(op)
    r = emit(replace(op, input=X, padding=(pad, pad - (rows - h), pad, pad)))
    canary = np.full(Y4.shape, 3, np.float16)
    got = run_sim(r, {"x": (X, stored), "y": (Y4, canary)}).feature(Y4)
    np.testing.assert_allclose(got[:, :oh].astype(np.float64), want, rtol=3e-3, atol=3e-3)
    np.testing.assert_array_equal(got[:, oh:], canary[:, oh:])  # the rows below it stay as they were
