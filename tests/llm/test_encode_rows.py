"""The row-block encoder (compiler/llm/build.encode_rows) gives the bits of the
whole matrix encoded at once, for a matrix of more rows than one block (a
262k-row head is never whole in fp32): fp16, and int8 under every rounding and
scale choice, rotated or not, from memory and from the mapped GGUF."""

import numpy as np
import pytest

from rkc.compiler.llm.build import ENCODE_ROWS, encode_rows
from rkc.compiler.llm.quantize import quantize_matrix
from rkc.compiler.llm.rotate import rotate_matrix, rotation_for
from rkc.compiler.llm.weights import ArrayRows

ROWS, K = ENCODE_ROWS + 1000, 64  # two blocks, the second a partial one


@pytest.fixture(scope="module")
def matrix():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((ROWS, K)).astype(np.float32)
    w[:, 5] *= 20  # an outlier column, so rotation and clipping matter
    x = rng.standard_normal((256, K))
    return w, x.T @ x


@pytest.mark.parametrize("rounding, scales", [("rtn", "max"), ("rtn", "mse"), ("gptq", "max")])
@pytest.mark.parametrize("rotation", ["kron", "none"])
def test_int8_row_blocks_equal_whole_matrix(matrix, rounding, scales, rotation):
    w, h = matrix
    rot = rotation_for(K, rotation)
    whole = w if rot is None else rotate_matrix(w, rot)
    if rot is not None:
        from rkc.compiler.llm.rotate import rotate_hessian
        h = rotate_hessian(h, rot)
    q, scale = quantize_matrix(whole, rounding, h, scales)
    enc = encode_rows(ArrayRows(w), "int8", rot, rounding, h, scales)
    assert enc.rotation is rot
    assert np.array_equal(enc.data, q) and np.array_equal(enc.scale, scale)


def test_fp16_row_blocks_equal_whole_matrix(matrix):
    w, _ = matrix
    enc = encode_rows(ArrayRows(w), "fp16")
    assert enc.scale is None and np.array_equal(enc.data, w.astype(np.float16))


def test_rows_from_the_mapped_file_equal_the_dequantized_matrix(tmp_path):
    """A Q8_0 head of more rows than a block, read in rows (RowTable) from the
    GGUF, encodes as its whole dequantized copy does."""
    import gguf

    from rkc.compiler.frontend.gguf import GgufFile
    from rkc.compiler.llm.weights import LazyWeights

    rng = np.random.default_rng(4)
    w = rng.standard_normal((ROWS, K)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("head.weight", gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gf = GgufFile(tmp_path / "m.gguf")
    lazy = LazyWeights(gf, ["head.weight"])
    dense = gf.dequantize("head.weight")
    rot = rotation_for(K, "kron")
    fp16 = encode_rows(lazy.source("head.weight"), "fp16")
    assert np.array_equal(fp16.data, dense.astype(np.float16))
    int8 = encode_rows(lazy.source("head.weight"), "int8", rot)
    q, scale = quantize_matrix(rotate_matrix(dense, rot))
    assert np.array_equal(int8.data, q) and np.array_equal(int8.scale, scale)
