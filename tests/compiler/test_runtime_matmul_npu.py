"""Products of two run-time tensors on the NPU (compiler/emitter_matmul.py): an
attention head as YOLO11n's C2PSA computes it after its per-head split, end to
end on the simulator against onnxruntime, random weights from a fixed seed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.ir.npu import geometry, layout
from rkc.ir.rkbin import read_rkbin
from onnx_models import NPU_COSINE, cosine, graph_model, onnxruntime_outputs, save

pytest.importorskip("rkc.runtime.sim")
THRESHOLD = NPU_COSINE


@pytest.mark.parametrize("k,n", [(32, 400), (400, 400), (400, 64), (5, 7), (33, 17), (32, 45)])
def test_run_time_b_layout_is_the_gemm_weight_packing(k, n):
    """"native-weights" holds B[K, N] as the GEMM packs a constant B (N kernels of K
    channels, zero kernels up to whole groups), and unpacks to the same values."""
    b = np.random.default_rng(k * n).standard_normal((k, n)).astype(np.float16)
    raw = geometry.pack(b, "native-weights").reshape(-1).view(np.uint8)
    assert raw.size == geometry.nbytes(b.shape, "native-weights", 2)
    kernels = np.zeros((layout.align(n, layout.kernel_group_for(2)), 1, 1, k), np.float16)
    kernels[:n, 0, 0] = b.T
    assert raw.tobytes() == layout.pack_weights(kernels).tobytes()
    assert np.array_equal(geometry.unpack(raw, b.shape, "native-weights", np.float16), b)


def _head(c: int, key: int, h: int, w: int, seed: int):
    """x -> 1x1 conv to q, k, v -> softmax(q^T k * key^-0.5) weighting v -> [1, c, h, w]."""
    rng = np.random.default_rng(seed)
    hw = h * w
    nodes = [helper.make_node("Conv", ["x", "wqkv", "bqkv"], ["qkv"]),
             helper.make_node("Reshape", ["qkv", "rows"], ["r"]),
             helper.make_node("Split", ["r", "parts"], ["q", "k", "v"], axis=0),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0]),
             helper.make_node("MatMul", ["qt", "k"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("Transpose", ["p"], ["pt"], perm=[1, 0]),
             helper.make_node("MatMul", ["v", "pt"], ["o"]),
             helper.make_node("Reshape", ["o", "shape"], ["y"])]
    inits = {"wqkv": rng.standard_normal((2 * key + c, c, 1, 1)) / np.sqrt(c),
             "bqkv": rng.standard_normal(2 * key + c) * 0.1}
    model = graph_model(nodes, inits, [1, c, h, w])
    graph = model.graph
    graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                              (("rows", [2 * key + c, hw]), ("parts", [key, key, c]), ("shape", [1, c, h, w]))])
    graph.initializer.append(numpy_helper.from_array(np.array(key ** -0.5, np.float32), "scale"))
    return model


@pytest.mark.parametrize("precision", ["fp16", "int8"])
@pytest.mark.parametrize("c,key,h,w", [(16, 8, 8, 10), (64, 32, 5, 9)])
@pytest.mark.parametrize("transposed", [True, False])
def test_attention_products_run_on_the_npu(tmp_path, precision, c, key, h, w, transposed):
    """`transposed`: the second product computed transposed (the default), its A the
    probabilities in the scores' layout (ScaledSoftmax); --no-npu-attention keeps V P^T,
    the probabilities written as its run-time weights (SoftmaxTranspose)."""
    path = save(_head(c, key, h, w, c + h), tmp_path / "m.onnx")
    options = BuildOptions(precision=precision, npu_attention=None if transposed else False)
    rng = np.random.default_rng(11)
    if precision == "int8":
        options.calib = tmp_path / "calib.npz"
        np.savez(options.calib, x=rng.standard_normal((2, 1, c, h, w)).astype(np.float32))
    report = build(path, tmp_path / "m.rkbin", options)
    products = [p for p in report.placements if p.op.type == "MatMul"]
    assert [p.device for p in products] == ["npu", "npu"], [p.reason for p in products]
    kinds = [_steps(tmp_path / "m.rkbin", kind) for kind in ("ScaledSoftmax", "SoftmaxTranspose")]
    assert kinds == ([1, 0] if transposed else [0, 1])  # the scores' softmax written as the second A or B
    with runtime.load(tmp_path / "m.rkbin") as m:
        for _ in range(2):  # the second run through the steps' closures prepared at the first
            x = rng.standard_normal((1, c, h, w)).astype(np.float32)
            got = m.run({"x": x})["y"]
            want = onnxruntime_outputs(path, {"x": x})["y"]
            assert cosine(got, want) >= THRESHOLD[precision]


def _steps(path, op: str) -> int:
    return sum(s.op == op for s in read_rkbin(path).module.program("main").steps)


def _gathers(path) -> tuple[int, int]:
    """(Relayout steps, the results they gather): one step gathers every result whose
    sources are all on the NPU by then (program_steps' gather)."""
    steps = [s for s in read_rkbin(path).module.program("main").steps if s.op == "Relayout"]
    return len(steps), sum(len(s.outputs) for s in steps)


def _softmax_steps(path) -> int:
    """The program's ScaledSoftmax steps: scores read from a GEMM's output, the
    probabilities written in the same layout as the next GEMM's A, that product computed
    transposed (compiler/passes/heads.py transposed_product, program_steps.py)."""
    assert _steps(path, "SoftmaxTranspose") == 0
    return _steps(path, "ScaledSoftmax")


def _heads(dim: int, heads: int, h: int, w: int, seed: int, proj: bool = False):
    """bench/zoo_models.py's C2PSA attention core (ultralytics' Attention, attn_ratio
    0.5): batched [1, heads, ...] products the head split (compiler/passes/heads.py)
    cuts into 2-D ones; `proj`: the heads' map read by a 1x1 convolution (Attention.proj),
    not the model's output."""
    rng = np.random.default_rng(seed)
    hw, head_dim = h * w, dim // heads
    key = head_dim // 2
    nodes = [helper.make_node("Conv", ["x", "wqkv", "bqkv"], ["qkv"]),
             helper.make_node("Reshape", ["qkv", "rows"], ["r"]),
             helper.make_node("Split", ["r", "parts"], ["q", "k", "v"], axis=2),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qt", "k"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
             helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["v", "pt"], ["o"]),
             helper.make_node("Reshape", ["o", "shape"], ["att" if proj else "y"])]
    channels = dim + 2 * key * heads
    inits = {"wqkv": rng.standard_normal((channels, dim, 1, 1)) / np.sqrt(dim),
             "bqkv": rng.standard_normal(channels) * 0.1}
    if proj:
        nodes.append(helper.make_node("Conv", ["att", "wproj", "bproj"], ["y"]))
        inits.update(wproj=rng.standard_normal((dim, dim, 1, 1)) / np.sqrt(dim), bproj=rng.standard_normal(dim) * 0.1)
    model = graph_model(nodes, inits, [1, dim, h, w])
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                                    (("rows", [1, heads, 2 * key + head_dim, hw]), ("parts", [key, key, head_dim]),
                                     ("shape", [1, dim, h, w]))])
    model.graph.initializer.append(numpy_helper.from_array(np.array(key ** -0.5, np.float32), "scale"))
    return model


@pytest.mark.parametrize("dim,heads,h,w,q_views", [(128, 2, 20, 20, 2), (64, 1, 4, 4, 1), (96, 3, 3, 5, 0)])
def test_batched_attention_products_run_per_head_on_the_npu(tmp_path, dim, heads, h, w, q_views):
    """YOLO11n's shape at 640 (128 channels, 2 heads, 20x20 positions), one head,
    and three heads over an odd position count. `q_views`: the heads whose Q^T, the
    first product's A ([positions, key] in GEMM atoms), is a view of the qkv map's
    bytes (program_steps' byte_slice): not the 3x5 map's, stored with zero rows below."""
    path = save(_heads(dim, heads, h, w, dim + heads), tmp_path / "m.onnx")
    report = build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16", npu_attention=True))
    products = [p for p in report.placements if p.op.type == "MatMul"]
    assert [p.device for p in products] == ["npu"] * 2 * heads, [p.reason for p in products]
    assert _softmax_steps(tmp_path / "m.rkbin") == heads
    # Q^T, K (scaled) and V of each head gathered from the qkv map (compiler/relayout.py) in one
    # step or Q^T read in place: the map is not converted to float32 on the host
    assert _gathers(tmp_path / "m.rkbin") == (1, 3 * heads - q_views)
    assert not [s for s in read_rkbin(tmp_path / "m.rkbin").module.program("main").steps if s.name == "from_npu:qkv"]
    x = np.random.default_rng(5).standard_normal((1, dim, h, w)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin") as m:
        got = m.run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})["y"]
    assert cosine(got, want) >= THRESHOLD["fp16"]


@pytest.mark.parametrize("dim,heads,h,w,gathers", [(128, 2, 20, 20, (1, 4)), (64, 1, 4, 4, (1, 2)),
                                                   (96, 3, 3, 5, (2, 10))])
def test_heads_products_write_their_channel_slices(tmp_path, dim, heads, h, w, gathers):
    """The second products, computed transposed, come out as the heads' channel slices of
    the map a convolution reads: no Relayout puts them together (program_steps'
    source_slices), but where the map's rows are stored padded (3x5) and a slice is no run
    of the map's bytes. `gathers`: (Relayout steps, results): K and V^T of each head, Q^T and
    the output where no view, those from the qkv map in one step."""
    path = save(_heads(dim, heads, h, w, dim + h, proj=True), tmp_path / "m.onnx")
    build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16"))
    assert _softmax_steps(tmp_path / "m.rkbin") == heads
    assert _gathers(tmp_path / "m.rkbin") == gathers
    x = np.random.default_rng(7).standard_normal((1, dim, h, w)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin") as m:
        got = m.run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})["y"]
    assert cosine(got, want) >= THRESHOLD["fp16"]


def test_relayout_native_gathers_match_the_interpreter(tmp_path, monkeypatch):
    """The Relayout steps' gathers between native layouts (runtime/relayout_edges.py) give
    the interpreter's values bit for bit (its logical arrays through the index map), in the
    first run and in a later one (the step's closure prepared at the first)."""
    from rkc.runtime import relayout_edges

    path = save(_heads(96, 3, 3, 5, 9), tmp_path / "m.onnx")
    build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16", npu_attention=True))
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 96, 3, 5)).astype(np.float32) for _ in range(2)]
    with runtime.load(tmp_path / "m.rkbin") as m:
        native = [m.run({"x": x})["y"] for x in xs]
    monkeypatch.setattr(relayout_edges, "relayout", lambda run, step: False)
    with runtime.load(tmp_path / "m.rkbin") as m:
        interpreted = [m.run({"x": x})["y"] for x in xs]
    assert not np.array_equal(interpreted[0], interpreted[1])
    for got, want in zip(native, interpreted):
        assert np.array_equal(got, want)


def test_relayout_moves_are_made_at_load(tmp_path, monkeypatch):
    """runtime.load makes the Relayout steps' moves (execute.prepare_program): the first run
    makes none and gives the outputs of a run whose moves were made in it."""
    from rkc.runtime import relayout_edges

    path = save(_heads(96, 3, 3, 5, 9), tmp_path / "m.onnx")
    build(path, tmp_path / "m.rkbin", BuildOptions(precision="fp16", npu_attention=True))
    x = np.random.default_rng(6).standard_normal((1, 96, 3, 5)).astype(np.float32)
    with runtime.load(tmp_path / "m.rkbin") as m:
        (schedule,) = m.schedules.values()
        assert [len(plan) for plan in schedule.native_plans.values() if plan] == [3 * 3]  # one step, nine results
        for step in m.module.program("main").steps:  # the plans made at load, dropped: made in the run
            schedule.native_plans.pop(id(step), None)
        in_run = m.run({"x": x})["y"]
    with runtime.load(tmp_path / "m.rkbin") as m:
        def refused(run, step):
            raise AssertionError(f"{step.name}: moves made after load")
        monkeypatch.setattr(relayout_edges, "_relayout_plan", refused)
        at_load = m.run({"x": x})["y"]
    assert np.array_equal(in_run, at_load)


def test_heads_stay_batched_where_their_products_stay_on_the_cpu(tmp_path):
    """The per-head split is the default only where every head's product runs on the NPU
    (compiler/build.py's _place): placed on the CPU, the two batched products stay whole;
    --npu-attention splits them anyway."""
    path = save(_heads(64, 2, 4, 4, 3), tmp_path / "m.onnx")
    auto = build(path, tmp_path / "a.rkbin", BuildOptions(precision="fp16", cpu_only=True))
    assert [p.device for p in auto.placements if p.op.type == "MatMul"] == ["cpu"] * 2
    forced = build(path, tmp_path / "f.rkbin", BuildOptions(precision="fp16", cpu_only=True, npu_attention=True))
    assert [p.device for p in forced.placements if p.op.type == "MatMul"] == ["cpu"] * 4
    default = build(path, tmp_path / "d.rkbin", BuildOptions(precision="fp16"))
    assert [p.device for p in default.placements if p.op.type == "MatMul"] == ["npu"] * 4


@pytest.mark.parametrize("make", [lambda: _head(16, 8, 3, 5, 1), lambda: _heads(96, 3, 3, 5, 2)])
def test_the_second_product_computed_transposed_gives_the_same_values(tmp_path, make):
    """compiler/passes/heads.py transposed_product: V P^T becomes (P V^T)^T, P read straight
    from the Softmax (no Transpose before any product), the graph's values unchanged."""
    from rkc.compiler.frontend import load_graph
    from rkc.compiler.passes import run_passes
    from rkc.compiler.reference import run_graph

    path = save(make(), tmp_path / "m.onnx")
    before, after = load_graph(path), run_passes(load_graph(path), npu_attention=True)
    softmaxes = {o for op in after.ops if op.type == "Softmax" for o in op.outputs}
    a_operands = {op.inputs[0] for op in after.ops if op.type == "MatMul"}
    shaped = {op.outputs[0] for op in after.ops if op.type == "Reshape" and op.inputs[0] in softmaxes}
    heads = len(softmaxes)
    assert heads and len(a_operands & (softmaxes | shaped)) == heads  # each head's P is a product's A
    assert not [op for op in after.ops if op.type == "Transpose" and op.inputs[0] in softmaxes]
    x = np.random.default_rng(4).standard_normal(tuple(before.tensors["x"].type.shape)).astype(np.float32)
    want = run_graph(before, {"x": x})["y"].astype(np.float64)
    got = run_graph(after, {"x": x})["y"].astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
