"""The streamed compile writes the bytes the in-memory one did: the weights and
host regions spooled to disk as they are made (ir/spool.py), the Gather-only
tables encoded in row blocks into the output, the layers encoded on --jobs
threads — the rkbin is the same file whichever way, and with any number of
workers."""

from __future__ import annotations

import pytest

from llm.synth import write_gemma4, write_model
from rkc.compiler.llm import build
from rkc.compiler.llm.build import (MAX_DEFAULT_JOBS, PARALLEL_MIN_GGUF_BYTES, LlmCompileOptions, compile_gguf,
                                    default_jobs)
from rkc.ir.rkbin import read_rkbin
from scratch import scratch_dir

MODELS = {"gemma4": lambda p: write_gemma4(p, "gemma4"),  # per-layer token table: Gather-only
          "llama": lambda p: write_model(p, "llama")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def gguf(request, tmp_path_factory):
    return MODELS[request.param](scratch_dir(request, tmp_path_factory, "m") / f"{request.param}.gguf")


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_workers_and_spooling_leave_the_bytes_alone(gguf, precision, tmp_path, monkeypatch):
    options = LlmCompileOptions(precision=precision, prefill_chunks=(1, 8))
    files = {}
    for jobs in (1, 2, 3):  # 3: more workers than layers in flight on 2 cores
        out = tmp_path / f"j{jobs}.rkbin"
        compile_gguf(gguf, out, LlmCompileOptions(**{**options.__dict__, "jobs": jobs}))
        files[jobs] = out.read_bytes()
    assert files[1] == files[2] == files[3]
    builder = build.ModuleBuilder
    monkeypatch.setattr(build, "ModuleBuilder", lambda metadata, spool_dir: builder(metadata))  # held in memory
    assert options.jobs is None  # the in-memory build runs with the default worker count (by the GGUF's size)
    compile_gguf(gguf, tmp_path / "memory.rkbin", options)
    assert (tmp_path / "memory.rkbin").read_bytes() == files[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j1.rkbin", "j2.rkbin", "j3.rkbin",
                                                          "memory.rkbin"]  # no spool left
    read_rkbin(tmp_path / "j1.rkbin")  # loads: checksums and cross-references hold


@pytest.mark.parametrize("cpus,want", [({0}, 1), ({0, 1}, 2), ({1, 3, 5}, 3), (set(range(8)), MAX_DEFAULT_JOBS)])
def test_the_default_workers_are_the_usable_cores_up_to_the_ceiling(monkeypatch, cpus, want):
    monkeypatch.setattr(build.os, "sched_getaffinity", lambda pid: cpus)
    assert default_jobs(PARALLEL_MIN_GGUF_BYTES) == want
    assert default_jobs(PARALLEL_MIN_GGUF_BYTES - 1) == 1  # a small model: one worker (measured no faster)
    assert LlmCompileOptions().jobs is None  # resolved from the GGUF's size when the compile starts


def test_a_missing_output_folder_is_refused_before_the_work(tmp_path):
    gguf = write_model(tmp_path / "m.gguf", "llama")
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        compile_gguf(gguf, tmp_path / "no-such-folder" / "m.rkbin", LlmCompileOptions())
