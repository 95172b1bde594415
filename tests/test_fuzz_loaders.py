"""Fuzzing the three loaders with structured mutations (tests/fuzz.py): every
input is either accepted or refused with one RkcError line; never another
exception (the CLIs' internal error), a MemoryError or a hang (hypothesis'
deadline). Fast by default; `-m slow` runs many more examples (CI's slow run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import mutated_json, mutated_metadata, onnx_model
from hostile import parts, write_raw
from onnx_models import example, save
from rkc import runtime
from rkc.compiler.build import BuildOptions, build
from rkc.ir.errors import RkcError

FAST = settings(max_examples=15, deadline=20_000, suppress_health_check=list(HealthCheck), derandomize=True)
SLOW = settings(max_examples=400, deadline=60_000, suppress_health_check=list(HealthCheck))
X = np.ones((1, 3, 32, 32), np.float32)


def _one_line(exc: RkcError) -> None:
    assert str(exc) and "\n" not in str(exc), repr(exc)


@pytest.fixture(scope="module")
def rkbin_parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("fz")
    build(save(example("small_cnn").build_model(), d / "m.onnx"), d / "m.rkbin", BuildOptions())
    return parts(d / "m.rkbin")


def _load_and_run(tmp_path, module, blobs) -> None:
    try:
        text = json.dumps(module)
    except (ValueError, RecursionError):
        return  # not expressible as JSON: no file to load
    path = write_raw(tmp_path / "f.rkbin", None, blobs, module_text=text)
    try:
        with runtime.load(path, device="sim") as model:
            model.run({"x": X})
    except RkcError as exc:
        _one_line(exc)


def _rkbin_case(rkbin_parts, tmp_path_factory, data):
    module, blobs = rkbin_parts
    _load_and_run(tmp_path_factory.mktemp("c"), data.draw(mutated_json(module)), blobs)


@FAST
@given(data=st.data())
def test_rkbin_module_mutations(rkbin_parts, tmp_path_factory, data):
    _rkbin_case(rkbin_parts, tmp_path_factory, data)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_rkbin_module_mutations_long(rkbin_parts, tmp_path_factory, data):
    _rkbin_case(rkbin_parts, tmp_path_factory, data)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    from llm.synth import write_model

    return write_model(tmp_path_factory.mktemp("g") / "llama.gguf", "llama")


def _gguf_case(gguf_file, data):
    from rkc.compiler.frontend.gguf import GgufFile, graph_from_gguf

    gf = GgufFile(gguf_file)
    gf.kv = data.draw(mutated_metadata(gf.kv))
    try:
        graph_from_gguf(gf)
    except RkcError as exc:
        _one_line(exc)


@FAST
@given(data=st.data())
def test_gguf_metadata_mutations(gguf_file, data):
    _gguf_case(gguf_file, data)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_gguf_metadata_mutations_long(gguf_file, data):
    _gguf_case(gguf_file, data)


def _onnx_case(tmp_path_factory, data):
    import onnx

    _, model = data.draw(onnx_model())
    d = tmp_path_factory.mktemp("o")
    onnx.save(model, str(d / "m.onnx"))
    try:
        build(d / "m.onnx", d / "m.rkbin", BuildOptions())
    except RkcError as exc:
        _one_line(exc)
        assert not (d / "m.rkbin").exists()


@FAST
@given(data=st.data())
def test_onnx_graph_mutations(tmp_path_factory, data):
    _onnx_case(tmp_path_factory, data)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_onnx_graph_mutations_long(tmp_path_factory, data):
    _onnx_case(tmp_path_factory, data)
