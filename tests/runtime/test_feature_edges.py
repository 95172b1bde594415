"""CPU steps on the NPU's native layout (runtime/feature_edges.py and the
compiled kernels it calls): each gives what the interpreter's generic path
gives (unpack, numpy kernel, pack), over channel counts that leave padded
atoms; and a model whose input, outputs, max pools and upsampling all take
these paths gives, end to end, the interpreter's result bit for bit and
onnxruntime's within the precision's bound."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.ir.npu import geometry, layout
from rkc.runtime import feature_edges, half, logits_edges, native_maps
from rkc.runtime.kernels import gather_jit, nn, quant, quant_jit, run_kernel
from onnx_models import compile_calibrated, cosine, cpu_max_pools, onnxruntime_outputs, save
from onnx_models import example as example_module

@pytest.fixture(autouse=True)
def _max_pools_on_the_cpu(monkeypatch):
    """MaxPool stands for a CPU op in these tests (a small fp16 pool's DPU taps would otherwise
    model less NPU time than its CPU kernel takes)."""
    cpu_max_pools(monkeypatch)


SHAPES = [(3, 5, 7), (8, 4, 9), (19, 3, 2), (33, 2, 17), (16, 3, 8),  # the last: whole 4-atom words
          (21, 4, 6), (64, 6, 5),  # contiguous maps of several groups, the last part padding or whole
          (1000, 1, 1), (37, 1, 1), (8, 1, 1)]  # one pixel (logits): half.one_pixel_lanes


def _fm(x: np.ndarray) -> np.ndarray:
    """[C, H, W] packed by the one reference layout code, as [C1, H, W, C2] (a strided
    view of a map of fewer than 4 rows, stored over zero rows)."""
    c, h, w = x.shape
    raw = geometry.pack(x[None], "native").reshape(-1).view(np.uint8).copy()
    rows = geometry.feature_map(x[None].shape, "native")[2]
    return layout.feature_view(raw, c, rows, w, x.dtype)[:, :h]


@pytest.mark.parametrize("shape", SHAPES)
def test_fp16_edges_are_numpys_cast_and_the_layout(shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 1e3).astype(np.float32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, 1e-7, -0.0]
    want = _fm(x.astype(np.float16))
    got = np.full(want.shape, 0x5555, np.uint16)  # stale bytes, padding lanes included
    half.narrow_into_feature(x.view(np.uint32), got)
    np.testing.assert_array_equal(got, want.view(np.uint16))
    for fm, back in ((want, np.empty(shape, np.float32)), _long_lines_of(want, np.empty(shape, np.float32))):
        half.widen_feature(fm.view(np.uint16), back.view(np.uint32))
        np.testing.assert_array_equal(back.reshape(shape), x.astype(np.float16).astype(np.float32))
    for fm, out in ((want, np.empty(shape, np.float16)), _long_lines_of(want, np.empty(shape, np.float16))):
        half.unpack_feature_bits(fm.view(np.uint16), out.view(np.uint16))  # the fp16 values as they are
        np.testing.assert_array_equal(out.reshape(shape).view(np.uint16), x.astype(np.float16).view(np.uint16))


def test_a_one_pixel_map_widens_every_fp16_pattern_as_numpy():
    """The logits' path (half.one_pixel_lanes): every fp16 bit pattern, NaN payloads and
    signalling bits included, widened as numpy's cast and handed over as it is, from atoms
    stored next to each other and spaced out (a GEMM's rows stored padded)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    spaced = np.full((bits.size // 8, 4, 1, 8), 0x5A5A, np.uint16)
    spaced[:, 0, 0] = bits.reshape(-1, 8)
    for fm in (bits.reshape(-1, 1, 1, 8), spaced[:, :1]):
        _widened_and_kept_as_numpy(bits, fm)


@pytest.mark.parametrize("stored", [(8, 1, 1024, 8), (9, 1, 1021, 8), (9, 4, 257, 8)])
def test_a_map_widens_every_fp16_pattern_as_numpy(stored):
    """Lines of eight-channel atoms (eight atoms at a time by half's shuffles, a line's last
    atoms one by one): every fp16 bit pattern, NaN payloads and signalling bits included,
    widened as numpy's cast and handed over as it is, channel by channel."""
    fm = np.resize(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16), stored)
    c1, h, w, c2 = stored
    want = fm.transpose(0, 3, 1, 2).reshape(c1 * c2, h, w)
    wide, kept = np.empty(want.shape, np.uint32), np.empty(want.shape, np.uint16)
    half.widen_feature(fm, wide)
    half.unpack_feature_bits(fm, kept)
    np.testing.assert_array_equal(kept, want)
    np.testing.assert_array_equal(wide, want.view(np.float16).astype(np.float32).view(np.uint32))


def test_a_one_pixel_map_narrows_float32_patterns_as_numpy():
    """The one-pixel path of half.narrow_into_feature (a classifier's features): random
    float32 bit patterns (NaN payloads, signalling ones, infinities, subnormals, values
    past fp16's range) rounded as numpy's cast, into atoms stored next to each other and
    spaced out (a map of one row stored over four), stale lanes past C zeroed, the
    spacing rows untouched."""
    rng = np.random.default_rng(7)
    for c in (4096, 1000, 37, 8, 1):
        bits = rng.integers(0, 1 << 32, c, dtype=np.uint64).astype(np.uint32)
        bits[:6] = [0x7F800001, 0xFF800000, 0x7FC00000, 0x00000001, 0x477FF000, 0x80000000][:c] if c >= 6 \
            else bits[:6]
        with np.errstate(over="ignore"):  # (values past fp16's range: inf, as the cast)
            want = bits.view(np.float32).astype(np.float16).view(np.uint16)
        c1 = -(-c // 8)
        lanes = np.zeros(c1 * 8, np.uint16)
        lanes[:c] = want
        spaced = np.full((c1, 4, 1, 8), 0x5555, np.uint16)
        for fm in (np.full((c1, 1, 1, 8), 0x5555, np.uint16), spaced[:, :1]):
            half.narrow_into_feature(bits.reshape(c, 1, 1), fm)
            np.testing.assert_array_equal(fm[:, 0, 0].reshape(-1), lanes)
        assert (spaced[:, 1:] == 0x5555).all()


def _widened_and_kept_as_numpy(bits, fm):
    assert half.one_pixel_lanes(fm, np.empty((bits.size, 1, 1), np.uint32)) is not None
    out = np.empty((bits.size, 1, 1), np.uint32)
    half.widen_feature(fm, out)
    np.testing.assert_array_equal(out.reshape(-1), bits.view(np.float16).astype(np.float32).view(np.uint32))
    kept = np.empty((bits.size - 3, 1, 1), np.uint16)  # channels past C are the padding lanes
    half.unpack_feature_bits(fm, kept)
    np.testing.assert_array_equal(kept.reshape(-1), bits[:-3])


def _long_lines_of(fm, out):
    """fm and a row-major out as feature_edges' edges see them: one line per channel group."""
    return native_maps.long_lines(np.ascontiguousarray(fm), out)


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_edges_are_the_quantize_kernels_and_the_layout(shape):
    rng = np.random.default_rng(len(shape) + shape[0])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:2] = [0.5 * 0.05, 1.5 * 0.05]  # ties: rounded half to even
    scale, zp = np.float32(0.05), np.int8(-3)
    q = quant.quantize_linear(x, scale, zp)
    want = _fm(q)
    got = np.full(want.shape, 77, np.int8)
    quant_jit.quantize_into_feature(x, float(scale), int(zp), got)
    np.testing.assert_array_equal(got, want)
    back = np.empty(shape, np.float32)
    quant_jit.dequantize_feature(want, float(scale), int(zp), back)
    np.testing.assert_array_equal(back, quant.dequantize_linear(q, scale, zp))


@pytest.mark.parametrize("shape", SHAPES)
def test_int8_fp16_recodings_are_the_reference_kernels_composed(shape):
    """An int8 map to fp16 (DequantizeLinear, Cast) and back (Cast, QuantizeLinear)
    in one pass between feature maps of 16- and 8-lane atoms."""
    rng = np.random.default_rng(shape[0] * 7)
    scale, zp = np.float32(0.037), np.int8(5)
    q = rng.integers(-128, 128, shape).astype(np.int8)
    want = _fm(quant.dequantize_linear(q, scale, zp).astype(np.float16))
    got = np.full(want.shape, 0x7777, np.uint16)
    quant_jit.recode_feature(_fm(q).view(np.uint8), quant_jit.int8_to_fp16_table(float(scale), int(zp)), got,
                             shape[0])
    np.testing.assert_array_equal(got, want.view(np.uint16))
    h = (rng.standard_normal(shape) * 4).astype(np.float16)
    h.reshape(-1)[:3] = [np.inf, -np.inf, 0.5 * 0.037]
    want = _fm(quant.quantize_linear(h.astype(np.float32), scale, zp))
    got = np.full(want.shape, 99, np.uint8)
    quant_jit.recode_feature(_fm(h).view(np.uint16), quant_jit.fp16_to_int8_table(float(scale), int(zp)), got,
                             shape[0])
    np.testing.assert_array_equal(got.view(np.int8), want)


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
@pytest.mark.parametrize("c", [5, 16, 24])
def test_plane_kernels_on_a_feature_map_are_the_logical_kernels(dtype, c):
    """MaxPool and nearest Resize on the planes [C1, C2, H, W] of a feature map
    give the feature map of their logical result (padding lanes are not compared)."""
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((1, c, 9, 11)) * 40).astype(dtype)
    if dtype == np.float16:
        x[0, 1, 2, 3], x[0, 2, 0, 0], x[0, 0, 4, 4] = np.nan, -np.inf, -0.0
    planes = _fm(x[0]).transpose(0, 3, 1, 2)
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    for op, inputs, attrs in [("MaxPool", [], pool),
                              ("Resize", [None, np.array([1, 1, 2, 3], np.float32)], {"mode": "nearest"})]:
        (logical,) = run_kernel(op, [x, *inputs], attrs, 1)
        (native,) = run_kernel(op, [planes, *inputs], attrs, 1)
        got = native.reshape(-1, *native.shape[2:])[:c]  # planes [C1, C2, ...] -> channels
        np.testing.assert_array_equal(got, logical[0])


@pytest.mark.parametrize("dtype", [np.float16, np.int8])
@pytest.mark.parametrize("c, scales, attrs", [(5, [1, 1, 2, 3], {}), (24, [1, 1, 8, 8], {}),
                                              (16, [1, 1, 0.5, 1.7], {"coordinate_transformation_mode": "asymmetric",
                                                                      "nearest_mode": "floor"})])
def test_nearest_resize_gathers_the_feature_map_atoms(dtype, c, scales, attrs):
    """A nearest Resize straight between feature maps (16-byte atoms moved whole) gives
    the feature map of the logical kernel's result, padding lanes included."""
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((1, c, 7, 6)) * 40).astype(dtype)
    inputs = [None, np.array(scales, np.float32)]
    (logical,) = run_kernel("Resize", [x, *inputs], {"mode": "nearest", **attrs}, 1)
    fm = _fm(x[0])
    planes = (fm.shape[0], fm.shape[3], *fm.shape[1:3])
    picks = nn.nearest_picks(planes, *inputs, **attrs)
    assert set(picks) <= {2, 3}
    rows, cols = picks.get(2, np.arange(7)), picks.get(3, np.arange(6))
    got = np.full((fm.shape[0], len(rows), len(cols), fm.shape[3]), 3, dtype)
    gather_jit.gather_atoms(fm, rows, cols, got)
    np.testing.assert_array_equal(got, _fm(logical[0]))


def test_fp16_max_pool_keys_order_every_value_as_numpy():
    """Every fp16 pattern pooled against every other (a 1x2 window over pairs)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    rng = np.random.default_rng(0)
    pairs = np.stack([bits, rng.permutation(bits)], axis=-1).view(np.float16)  # [65536, 2]
    x = pairs.reshape(1, 1, -1, 2)
    (got,) = run_kernel("MaxPool", [x], {"kernel_shape": [1, 2]}, 1)
    with np.errstate(invalid="ignore"):
        want = pairs.max(axis=1)
    np.testing.assert_array_equal(got.reshape(-1), want)  # NaN == NaN here, -0.0 == 0.0


def _detector_like(c: int, h: int = 12):
    """Conv -> ReLU -> Conv -> SiLU -> a strided max pool -> SPPF's 5x5 pools -> conv -> nearest
    x2 upsampling -> conv, two outputs (the input edge, an int8 -> fp16 edge in an
    int8 build, the plane ops and the output edges), on a [1, 3, h, 14] image."""
    rng = np.random.default_rng(c)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["x1"]),  # an int8 group before the fp16 (SiLU) ones
             helper.make_node("Conv", ["x1", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["a1"]),
             helper.make_node("MaxPool", ["a1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["p1"], ["p2"], kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
             helper.make_node("Conv", ["p2", "w2"], ["c2"]), helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Resize", ["r2", "", "scales"], ["u"], mode="nearest"),
             helper.make_node("Conv", ["u", "w3"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p2", "w4"], ["z"])]
    inits = {"w0": rng.standard_normal((6, 3, 3, 3)) / 4,
             "w1": rng.standard_normal((c, 6, 3, 3)) / 4, "b1": rng.standard_normal(c) * 0.1,
             "w2": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c),
             "w3": rng.standard_normal((5, c, 3, 3)) / np.sqrt(9 * c),
             "w4": rng.standard_normal((7, c, 1, 1)) / np.sqrt(c), "scales": [1, 1, 2, 2]}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, 14])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("h", [12, 4])  # 4: the pools' maps of 2 rows, stored over zero rows (pooled in place)
def test_a_model_through_the_native_steps_is_the_interpreters(tmp_path, precision, h, monkeypatch):
    path = save(_detector_like(12, h), tmp_path / "m.onnx")
    _, rng = compile_calibrated(tmp_path, path, (1, 3, h, 14), precision, 3)
    x, x2 = rng.standard_normal((2, 1, 3, h, 14)).astype(np.float32)
    taken, pairs = [], []
    real_step, real_chain = feature_edges.run_step, feature_edges.run_chain

    def counted(run, step):
        done = real_step(run, step)
        taken.append((step.op, done))
        return done

    def counted_chain(run, steps, plan=None):
        done = real_chain(run, steps, plan)
        if done:
            pairs.append(tuple(s.op for s in steps))
        return done
    looked_at = []  # (planner, step index): each fused pass is worked out once, taken or declined
    for module, name in ((feature_edges, "chain_end"), (logits_edges, "logits_chain_end")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda steps, i, *rest, real=real, name=name:
                            looked_at.append((name, i)) or real(steps, i, *rest))
    monkeypatch.setattr(feature_edges, "run_step", counted)
    monkeypatch.setattr(feature_edges, "run_chain", counted_chain)
    with runtime.load(tmp_path / "m.rkbin") as model:
        fast = model.run({"x": x})
        again = model.run({"x": x2})  # the second run takes the paths (closures) the first prepared
    assert looked_at and len(set(looked_at)) == len(looked_at), looked_at
    assert all(done for op, done in taken if op in ("MaxPool", "Resize", "Cast", "QuantizeLinear")), taken
    assert {op for op, done in taken if done} >= {"MaxPool", "Resize"}
    assert pairs == ([("DequantizeLinear", "Cast")] * 2 if precision == "int8" else []), pairs
    monkeypatch.setattr(feature_edges, "run_step", lambda run, step: False)
    monkeypatch.setattr(feature_edges, "run_chain", lambda run, steps, plan=None: False)
    monkeypatch.setattr(feature_edges, "run_pair", lambda run, step, following: False)
    with runtime.load(tmp_path / "m.rkbin") as model:
        slow, slow2 = model.run({"x": x}), model.run({"x": x2})
    want = onnxruntime_outputs(path, {"x": x})
    for name in ("y", "z"):
        np.testing.assert_array_equal(fast[name], slow[name])
        np.testing.assert_array_equal(again[name], slow2[name])
        assert cosine(fast[name], want[name]) >= (0.999 if precision == "fp16" else 0.99), name


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_fp16_outputs_are_the_npus_values_as_they_are(tmp_path, precision, monkeypatch):
    """run(..., fp16_outputs=True): an output the NPU computed in fp16 comes back as that
    float16 array, whose widening is the default run's float32 output bit for bit (any other
    output stays float32); the interpreter's path gives the same."""
    path = save(_detector_like(12), tmp_path / "m.onnx")
    _, rng = compile_calibrated(tmp_path, path, (1, 3, 12, 14), precision, 4)
    x = rng.standard_normal((1, 3, 12, 14)).astype(np.float32)
    edges = []  # outputs kept or widened on the native layout (an edge prepared at its first run from then on)
    real_step = feature_edges.run_step

    def counted(run, step):
        done = real_step(run, step)
        if step.outputs[0] in ("y", "z"):
            edges.append((run.fp16_outputs, done))
        return done
    monkeypatch.setattr(feature_edges, "run_step", counted)
    with runtime.load(tmp_path / "m.rkbin") as model:
        wide = model.run({"x": x})
        kept = model.run({"x": x}, fp16_outputs=True)
        kept_again = model.run({"x": x}, fp16_outputs=True)
        wide_again = model.run({"x": x})
        steps, tensors = model.module.program("main").steps, model.tensors
        made_by = {out: step for step in steps for out in step.outputs}
        half_made = {n for n in ("y", "z") if made_by[n].op == "Cast" and tensors[made_by[n].inputs[0]].dtype == "fp16"}
        direct = model.schedules[id(model.module.program("main"))].direct
        edge_steps = {i for i, step in enumerate(steps) if step.outputs[0] in ("y", "z")}
    assert half_made == {"y", "z"}, half_made  # int8: the mixed plan holds the SiLU group's successors in fp16
    # both outputs at each form's first run; the later runs call the edges prepared then straight (_Schedule.direct)
    assert sorted(edges) == [(False, True)] * 2 + [(True, True)] * 2, edges
    assert edge_steps <= set(direct[False]) and edge_steps <= set(direct[True]), (edge_steps, direct)
    assert all(direct[False][i] is not direct[True][i] for i in edge_steps)  # a form's own closure
    monkeypatch.setattr(feature_edges, "run_step", lambda run, step: False)
    with runtime.load(tmp_path / "m.rkbin") as model:
        interpreted = model.run({"x": x}, fp16_outputs=True)
    for name in ("y", "z"):
        assert wide[name].dtype == wide_again[name].dtype == np.float32
        want = np.float16 if name in half_made else np.float32
        for got in (kept[name], kept_again[name], interpreted[name]):
            assert got.dtype == want and got.shape == wide[name].shape, name
            np.testing.assert_array_equal(got.astype(np.float32), wide[name])


def test_rkrun_fp16_outputs_writes_the_npus_float16_values(tmp_path):
    """`rkrun --fp16-outputs` writes the fp16 outputs as float16, equal to the default run's
    float32 values once widened."""
    import subprocess
    import sys
    from pathlib import Path

    path = save(_detector_like(12), tmp_path / "m.onnx")
    build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16"))
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(5).standard_normal((1, 3, 12, 14)).astype(np.float32))
    rkrun = str(Path(sys.executable).parent / "rkrun")
    got = {}
    for flag in ((), ("--fp16-outputs",)):
        out = tmp_path / f"out{len(flag)}.npz"
        r = subprocess.run([rkrun, str(tmp_path / "m.rkbin"), "--inputs", str(tmp_path / "in.npz"), "--outputs",
                            str(out), "--device", "sim", *flag], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with np.load(out) as data:
            got[bool(flag)] = {k: data[k] for k in data.files}
    for name in ("y", "z"):
        assert got[False][name].dtype == np.float32 and got[True][name].dtype == np.float16, name
        np.testing.assert_array_equal(got[True][name].astype(np.float32), got[False][name])


class _Bytes:
    def __init__(self, nbytes: int) -> None:
        self.host = np.zeros(nbytes, np.uint8)


class _Run:
    """What run_pair reads of the interpreter's run: tensors, BOs, a device, host values
    (each a constant in a host region), the first run's plans."""

    def __init__(self, tensors, bos, values) -> None:
        from rkc.ir.program import TensorInfo

        no_op = staticmethod(lambda bo: None)
        device = type("Device", (), {"prepare_cpu_access": no_op, "finish_cpu_access": no_op})()
        tensors = {t.name: t for t in tensors}
        for name, value in values.items():
            if value is not None:
                tensors[name] = TensorInfo(name, list(np.shape(value)), "fp32", "row", "consts", 0, 0)
        self.model = type("Model", (), {"tensors": tensors, "bos": bos, "device": device,
                                        "host_regions": {"consts": None}})()
        self.values = values
        self.schedule = type("Schedule", (), {"native_plans": {}})()  # what the first run works out

    def read(self, name):
        return self.values[name]


@pytest.mark.parametrize("to_half", [True, False])
@pytest.mark.parametrize("shift", [0, 32, -32])
def test_a_recoding_pair_whose_maps_share_bytes_reads_a_copy(to_half, shift):
    """The memory plan may put the second map over the first's bytes (the float32
    tensor between them is all that reads it): the recoding is still the reference."""
    from rkc.ir.program import Step, TensorInfo

    shape = [1, 20, 5, 6]
    rng = np.random.default_rng(shift + 40)
    scale, zp = np.float32(0.05), np.int8(-3)
    src_dtype, dst_dtype = ("int8", "fp16") if to_half else ("fp16", "int8")
    sizes = {d: geometry.nbytes(shape, "native", 1 if d == "int8" else 2) for d in ("int8", "fp16")}
    base = 64
    src = TensorInfo("a@npu", shape, src_dtype, "native", "scratch", base, sizes[src_dtype])
    dst = TensorInfo("b@npu", shape, dst_dtype, "native", "scratch", base + shift, sizes[dst_dtype])
    mid = TensorInfo("a", shape, "fp32")
    bo = _Bytes(base + 64 + sizes["fp16"])
    if to_half:
        value = rng.integers(-128, 128, shape[1:]).astype(np.int8)
        want = _fm(quant.dequantize_linear(value, scale, zp).astype(np.float16))
        first, second = Step("cpu", "dq", op="DequantizeLinear", inputs=["a@npu", "s", "z"], outputs=["a"]), \
            Step("cpu", "cast", op="Cast", inputs=["a"], outputs=["b@npu"], attrs={"to": "fp16"})
    else:
        value = (rng.standard_normal(shape[1:]) * 3).astype(np.float16)
        want = _fm(quant.quantize_linear(value.astype(np.float32), scale, zp))
        first, second = Step("cpu", "cast", op="Cast", inputs=["a@npu"], outputs=["a"], attrs={"to": "fp32"}), \
            Step("cpu", "q", op="QuantizeLinear", inputs=["a", "s", "z"], outputs=["b@npu"])
    packed = geometry.pack(value[None], "native").reshape(-1).view(np.uint8)
    bo.host[src.offset:src.offset + packed.size] = packed
    run = _Run([src, dst, mid], {"scratch": bo},
               {"s": np.array([scale], np.float32), "z": np.array([zp], np.int8)})
    assert feature_edges.run_pair(run, first, second)
    got = native_maps.feature(bo.host[dst.offset:dst.offset + dst.nbytes], dst)
    np.testing.assert_array_equal(got[..., :want.shape[-1]].view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("x_shape, m, kernel, bias", [((1, 24, 6, 5), 24, (2, 2), True),
                                                    ((1, 5, 3, 4), 20, (3, 2), False), ((1, 3, 2, 7), 1, (2, 2), True)])
def test_a_learned_upsampling_quantizes_its_taps_into_the_feature_map(x_shape, m, kernel, bias):
    """ConvTranspose (stride = kernel) then QuantizeLinear into a feature map, as
    one pair: the feature map the two reference kernels and the layout give."""
    from rkc.ir.program import Step, TensorInfo

    rng = np.random.default_rng(sum(x_shape) + m)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal((x_shape[1], m, *kernel)) / 2).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    scale, zp = np.float32(0.04), np.int8(-5)
    out_shape = [1, m, x_shape[2] * kernel[0], x_shape[3] * kernel[1]]
    attrs = {"strides": list(kernel), "kernel_shape": list(kernel)}
    (y,) = run_kernel("ConvTranspose", [x, w, b], attrs, 1)
    want = _fm(quant.quantize_linear(y, scale, zp)[0])
    size = geometry.nbytes(out_shape, "native", 1)
    dst = TensorInfo("y@npu", out_shape, "int8", "native", "scratch", 16, size)
    bo = _Bytes(16 + size)
    bo.host[:] = 0x5A  # what another tensor left there
    run = _Run([dst, TensorInfo("y", out_shape, "fp32")], {"scratch": bo},
               {"x": x, "w": w, "b": b, "s": np.array([scale], np.float32), "z": np.array([zp], np.int8)})
    up = Step("cpu", "up", op="ConvTranspose", inputs=["x", "w", "b" if bias else ""], outputs=["y"], attrs=attrs)
    q = Step("cpu", "q", op="QuantizeLinear", inputs=["y", "s", "z"], outputs=["y@npu"])
    assert feature_edges.run_pair(run, up, q)
    got = native_maps.feature(bo.host[16:16 + size], dst)
    np.testing.assert_array_equal(got.reshape(-1)[:want.size].view(np.int8), want.reshape(-1))
    assert (bo.host[:16] == 0x5A).all()


CHAINS = [  # (source dtype, middle steps (op, attrs, constants), destination dtype)
    ("int8", [("Relu", {}, [])], "int8"),  # a residual ReLU the NPU program left on the CPU
    ("int8", [("Mul", {}, [np.float32(1.7)]), ("Clip", {}, [np.float32(-0.5), np.float32(2.0)])], "fp16"),
    ("fp16", [("LeakyRelu", {"alpha": 0.1}, []), ("Add", {}, [np.float32(-0.25)])], "int8"),
    ("fp16", [("Sigmoid", {}, []), ("Sub", {}, [np.float32(0.5)])], "fp16"),
    ("int8", [], "fp16"), ("fp16", [], "int8"),
]


@pytest.mark.parametrize("src_dtype, middle, dst_dtype", CHAINS)
@pytest.mark.parametrize("shape", [[1, 20, 5, 6], [1, 3, 4, 17], [1, 40, 2, 3]])
def test_a_recoding_chain_is_its_steps_one_by_one(src_dtype, middle, dst_dtype, shape):
    """A conversion out of a feature map, element-wise steps, a conversion into
    another: one table recoding gives what the reference kernels give step by step
    (and the layout's padding lanes zero)."""
    from rkc.ir.program import Step, TensorInfo

    rng = np.random.default_rng(sum(shape) + len(middle))
    scale, zp = np.float32(0.05), np.int8(-3)
    sizes = {d: geometry.nbytes(shape, "native", 1 if d == "int8" else 2) for d in ("int8", "fp16")}
    src = TensorInfo("a@npu", shape, src_dtype, "native", "scratch", 0, sizes[src_dtype])
    dst = TensorInfo("b@npu", shape, dst_dtype, "native", "scratch", sizes[src_dtype], sizes[dst_dtype])
    bo = _Bytes(sizes[src_dtype] + sizes[dst_dtype])
    bo.host[src.nbytes:] = 0x77  # stale bytes under the destination
    if src_dtype == "int8":
        value = rng.integers(-128, 128, shape[1:]).astype(np.int8)
        steps = [Step("cpu", "dq", op="DequantizeLinear", inputs=["a@npu", "s", "z"], outputs=["m0"])]
        x = quant.dequantize_linear(value, scale, zp)
    else:
        value = (rng.standard_normal(shape[1:]) * 3).astype(np.float16)
        value.reshape(-1)[:3] = [np.inf, -np.inf, np.nan]
        steps = [Step("cpu", "cast", op="Cast", inputs=["a@npu"], outputs=["m0"], attrs={"to": "fp32"})]
        x = value.astype(np.float32)
    values = {"s": np.array([scale], np.float32), "z": np.array([zp], np.int8)}
    mids = [TensorInfo("m0", shape, "fp32")]
    with np.errstate(all="ignore"):
        for k, (op, attrs, consts) in enumerate(middle):
            names = [f"k{k}_{j}" for j in range(len(consts))]
            values.update({n: np.array([c], np.float32) for n, c in zip(names, consts)})
            steps.append(Step("cpu", op.lower(), op=op, inputs=[f"m{k}", *names], outputs=[f"m{k + 1}"], attrs=attrs))
            mids.append(TensorInfo(f"m{k + 1}", shape, "fp32"))
            (x,) = run_kernel(op, [x, *[values[n] for n in names]], attrs, 1)
            x = x.astype(np.float32)
        last = f"m{len(middle)}"
        if dst_dtype == "int8":
            steps.append(Step("cpu", "q", op="QuantizeLinear", inputs=[last, "s", "z"], outputs=["b@npu"]))
            want = _fm(quant.quantize_linear(x, scale, zp)).view(np.uint8)
        else:
            steps.append(Step("cpu", "cast16", op="Cast", inputs=[last], outputs=["b@npu"], attrs={"to": "fp16"}))
            want = _fm(x.astype(np.float16)).view(np.uint16)
    packed = geometry.pack(value[None], "native").reshape(-1).view(np.uint8)
    bo.host[:packed.size] = packed
    run = _Run([src, dst, *mids], {"scratch": bo}, values)
    last_use = {s.outputs[0]: i + 1 for i, s in enumerate(steps[:-1])}
    assert feature_edges.chain_end(steps, 0, last_use, ["b@npu"]) == len(steps) - 1
    assert feature_edges.run_chain(run, steps)
    got = native_maps.feature(bo.host[dst.offset:dst.offset + dst.nbytes], dst)
    got = got.view(np.uint8 if dst_dtype == "int8" else np.uint16)
    np.testing.assert_array_equal(got[..., :want.shape[-1]], want)
    assert not got[-1, ..., shape[1] - (got.shape[0] - 1) * got.shape[-1]:].any()  # the last group's padding lanes


def test_a_chain_through_a_per_channel_constant_or_a_reduction_is_declined():
    from rkc.ir.program import Step, TensorInfo

    shape = [1, 4, 3, 3]
    size = geometry.nbytes(shape, "native", 1)
    src = TensorInfo("a@npu", shape, "int8", "native", "scratch", 0, size)
    dst = TensorInfo("b@npu", shape, "int8", "native", "scratch", size, size)
    per_channel = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
    run = _Run([src, dst, TensorInfo("m0", shape, "fp32"), TensorInfo("m1", shape, "fp32")], {"scratch": _Bytes(2 * size)},
               {"s": np.array([0.1], np.float32), "z": np.array([0], np.int8), "k": per_channel})
    steps = [Step("cpu", "dq", op="DequantizeLinear", inputs=["a@npu", "s", "z"], outputs=["m0"]),
             Step("cpu", "mul", op="Mul", inputs=["m0", "k"], outputs=["m1"]),
             Step("cpu", "q", op="QuantizeLinear", inputs=["m1", "s", "z"], outputs=["b@npu"])]
    assert feature_edges.chain_end(steps, 0, {"m0": 1, "m1": 2}, []) == 2
    assert not feature_edges.run_chain(run, steps)  # a table per channel: not this path
    steps[1] = Step("cpu", "sm", op="Softmax", inputs=["m0"], outputs=["m1"])
    assert feature_edges.chain_end(steps, 0, {"m0": 1, "m1": 2}, []) is None
    assert feature_edges.chain_end(steps[:1] + steps[2:], 0, {"m0": 3}, []) is None  # m0 read later too


def test_only_an_fp16_widening_into_an_output_nobody_else_reads_is_kept():
    """fp16_outputs keeps a Cast fp16 -> float32 whose result only the caller reads; not a Cast
    to another dtype, not one a later step reads, and nothing unless asked."""
    from types import SimpleNamespace

    from rkc.ir.program import Program, Step, TensorInfo
    from rkc.runtime.execute import _Run

    infos = [TensorInfo("h", [1, 8, 2, 2], "fp16"), TensorInfo("wide", [1, 8, 2, 2], "fp32"),
             TensorInfo("ids", [1, 8, 2, 2], "int32"), TensorInfo("read", [1, 8, 2, 2], "fp32"),
             TensorInfo("relu", [1, 8, 2, 2], "fp32")]
    steps = [Step("cpu", "a", op="Cast", inputs=["h"], outputs=["wide"], attrs={"to": 1}),
             Step("cpu", "b", op="Cast", inputs=["h"], outputs=["ids"], attrs={"to": 6}),
             Step("cpu", "c", op="Cast", inputs=["h"], outputs=["read"], attrs={"to": 1}),
             Step("cpu", "d", op="Relu", inputs=["read"], outputs=["relu"])]
    program = Program("main", ["h"], ["wide", "ids", "read", "relu"], steps)
    model = SimpleNamespace(tensors={i.name: i for i in infos}, schedules={})
    asked = _Run(model, program, fp16_outputs=True)
    assert [asked.keeps_fp16(s) for s in steps] == [True, False, False, False]
    assert not any(_Run(model, program).keeps_fp16(s) for s in steps)


@pytest.mark.parametrize("example, precision", [("mlp", "fp16"), ("mlp", "int8"), ("small_cnn", "int8"),
                                                ("small_cnn", "fp16")])
def test_gemm_operand_edges_are_the_interpreters(tmp_path, example, precision, monkeypatch):
    """The edges of a GEMM operand in a BO (an fp16 [M, K] Cast into or out of its atoms, a
    [1, K, 1, 1] logits row dequantized or widened out of them) go the native way and give
    the interpreter's generic unpack / pack result bit for bit, and onnxruntime's within the
    precision's bound (the examples' random weights, seeded)."""
    path = save(example_module(example).build_model(), tmp_path / "m.onnx")
    name, shape = ("x", (4, 64)) if example == "mlp" else ("x", (1, 3, 32, 32))
    _, rng = compile_calibrated(tmp_path, path, shape, precision, 5, int8_only=False, name=name)
    x, x2 = rng.standard_normal((2, *shape)).astype(np.float32)
    taken = []
    real_step = feature_edges.run_step

    def counted(run, step):
        done = real_step(run, step)
        tensors = run.model.tensors
        layouts = {tensors[n].layout for n in (step.inputs[0], step.outputs[0]) if n in tensors}
        taken.append((step.op, done, "native-gemm" in layouts))
        return done
    monkeypatch.setattr(feature_edges, "run_step", counted)
    # the edges themselves: small_cnn's logits, Flatten and Softmax would run as one pass (test_logits_edges.py)
    monkeypatch.setattr(logits_edges, "logits_chain_end", lambda *args: None)
    with runtime.load(tmp_path / "m.rkbin") as model:
        fast, again = model.run({name: x}), model.run({name: x2})  # the second run through the prepared edges
    gemm_edges = [(op, done) for op, done, gemm in taken if gemm and op in ("Cast", "DequantizeLinear")]
    assert gemm_edges and all(done for _, done in gemm_edges), taken
    monkeypatch.setattr(feature_edges, "run_step", lambda run, step: False)
    with runtime.load(tmp_path / "m.rkbin") as model:
        slow, slow2 = model.run({name: x}), model.run({name: x2})
    want = onnxruntime_outputs(path, {name: x})
    for out in slow:
        np.testing.assert_array_equal(fast[out], slow[out])
        np.testing.assert_array_equal(again[out], slow2[out])
        assert cosine(fast[out], want[out]) >= (0.999 if precision == "fp16" else 0.99), out
