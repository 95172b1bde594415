"""Fuzzing the three loaders with structured mutations (tests/fuzz.py): every
input is either accepted or refused with one RkcError line; never another
exception (the CLIs' internal error), a MemoryError or a hang (hypothesis'
deadline). Fast by default; `-m slow` runs many more examples (CI's slow run),
the same ones every run."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import mutated_json, mutated_metadata, mutated_tensor_shapes, onnx_model
from hostile import compiled_small_cnn, parts, write_raw
from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.ir.errors import RkcError

# CI runs the same examples every time (derandomized); RKC_FUZZ_RANDOM=1 makes the slow run an
# exploratory campaign seeded by --hypothesis-seed=N (docs/robustness.md)
EXPLORE = os.environ.get("RKC_FUZZ_RANDOM") == "1"
FAST = settings(max_examples=15, deadline=20_000, suppress_health_check=list(HealthCheck), derandomize=True)
SLOW = settings(max_examples=400, deadline=60_000, suppress_health_check=list(HealthCheck), derandomize=not EXPLORE)
X = np.ones((1, 3, 32, 32), np.float32)


def _one_line(exc: RkcError) -> None:
    assert str(exc) and "\n" not in str(exc), repr(exc)


def fast_and_slow(case):
    """Two tests of one case: 15 examples by default, 400 under -m slow."""
    def run(request, data):
        case(request, data)

    fast = FAST(given(data=st.data())(run))
    slow = pytest.mark.slow(SLOW(given(data=st.data())(run)))
    return fast, slow


@pytest.fixture(scope="module")
def rkbin_parts(tmp_path_factory):
    return parts(compiled_small_cnn(tmp_path_factory.mktemp("fz")))


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    from llm.synth import write_model

    return write_model(tmp_path_factory.mktemp("g") / "llama.gguf", "llama")


@pytest.fixture(scope="module")
def llm_rkbin_parts(gguf_file, tmp_path_factory):
    """A tiny synthetic LLM (tests/llm/synth.py) compiled int8 with one decode program."""
    from rkc.compiler.llm.build import LlmCompileOptions, compile_gguf

    out = tmp_path_factory.mktemp("l") / "llama.rkbin"
    compile_gguf(gguf_file, out, LlmCompileOptions("int8", (1,)))
    return parts(out)


def rkbin_case(request, data) -> None:
    module, blobs = request.getfixturevalue("rkbin_parts")
    tree = data.draw(mutated_json(module))
    try:
        text = json.dumps(tree)
    except (ValueError, RecursionError):
        return  # not expressible as JSON: no file to load
    path = write_raw(request.getfixturevalue("tmp_path_factory").mktemp("c") / "f.rkbin", None, blobs,
                     module_text=text)
    try:
        with runtime.load(path, device="sim") as model:
            model.run({"x": X})
    except RkcError as exc:
        _one_line(exc)


def llm_rkbin_case(request, data) -> None:
    """An LLM rkbin's module (steps, attrs, tensors, metadata) mutated: loaded and
    one token decoded, or refused with one line."""
    from rkc.runtime.llm.engine import LlmEngine

    module, blobs = request.getfixturevalue("llm_rkbin_parts")
    tree = data.draw(mutated_json(module))
    try:
        text = json.dumps(tree)
    except (ValueError, RecursionError):
        return
    path = write_raw(request.getfixturevalue("tmp_path_factory").mktemp("c") / "f.rkbin", None, blobs,
                     module_text=text)
    try:
        engine = LlmEngine(path, device="sim")
        try:
            program = engine.program_for(1, False)
            engine.run(program.name, np.array([1]), np.array([0]), engine.new_cache(4))
        finally:
            engine.close()
    except RkcError as exc:
        _one_line(exc)


def gguf_case(request, data) -> None:
    from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf

    gf = GgufFile(request.getfixturevalue("gguf_file"))
    gf.kv = data.draw(mutated_metadata(gf.kv))
    try:
        graph_from_gguf(gf)
    except RkcError as exc:
        _one_line(exc)


def gguf_tensor_case(request, data) -> None:
    """The tiny llama written with some tensors in another shape: every such file is refused with one line
    (no shape but the architecture's is valid: llama.cpp's loader requires each exactly)."""
    import gguf

    from llm.synth import write_model
    from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf

    good = GgufFile(request.getfixturevalue("gguf_file"))
    shapes = {n: good.shape(n) for n in good.tensors}
    blocks = {n: gguf.GGML_QUANT_SIZES[t.tensor_type][0] for n, t in good.tensors.items()}
    changed = data.draw(mutated_tensor_shapes(shapes, blocks))
    path = write_model(request.getfixturevalue("tmp_path_factory").mktemp("t") / "m.gguf", "llama",
                       tensor_shapes=changed)
    try:
        graph_from_gguf(GgufFile(path))
    except RkcError as exc:
        _one_line(exc)
        return
    assert not changed, f"tensors of the wrong shape accepted: {changed}"


def onnx_case(request, data) -> None:
    import onnx

    op, model = data.draw(onnx_model())
    d = request.getfixturevalue("tmp_path_factory").mktemp("o")
    onnx.save(model, str(d / "m.onnx"))
    try:
        build(d / "m.onnx", d / "m.rkbin", BuildOptions())
    except RkcError as exc:
        _one_line(exc)
        assert not (d / "m.rkbin").exists()
        return
    if op in ("Gather", "Split"):  # constant indices / sizes: what compiles, onnxruntime runs (no wrong success)
        import onnxruntime as ort

        sess = ort.InferenceSession(str(d / "m.onnx"), providers=["CPUExecutionProvider"])
        sess.run(None, {"x": np.ones([dim.dim_value for dim in model.graph.input[0].type.tensor_type.shape.dim],
                                     np.float32)})


test_rkbin_module_mutations, test_rkbin_module_mutations_long = fast_and_slow(rkbin_case)
test_gguf_metadata_mutations, test_gguf_metadata_mutations_long = fast_and_slow(gguf_case)
test_llm_rkbin_module_mutations, test_llm_rkbin_module_mutations_long = fast_and_slow(llm_rkbin_case)
test_onnx_graph_mutations, test_onnx_graph_mutations_long = fast_and_slow(onnx_case)
test_gguf_tensor_shapes, test_gguf_tensor_shapes_long = fast_and_slow(gguf_tensor_case)
