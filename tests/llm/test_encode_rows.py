"""The row-block encoder (compiler/llm/encode.encode_rows) gives the bits of the
whole matrix encoded at once, for a matrix of more rows than one block (a
262k-row head is never whole in fp32): fp16, and int8 under every rounding and
scale choice, rotated or not, from memory and from the mapped GGUF."""

import numpy as np
import pytest

from rkc.compiler.llm.encode import ENCODE_ROWS, encode_rows
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


def _q8_0_file(path, rows: int = ROWS, k: int = K, seed: int = 4):
    import gguf

    w = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("head.weight", gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_rows_from_the_mapped_file_equal_the_dequantized_matrix(tmp_path):
    """A Q8_0 head of more rows than a block, read in rows (RowTable) from the
    GGUF, encodes as its whole dequantized copy does."""
    from rkc.compiler.frontend.gguf import GgufFile
    from rkc.compiler.llm.weights import LazyWeights

    gf = GgufFile(_q8_0_file(tmp_path / "m.gguf"))
    lazy = LazyWeights(gf, ["head.weight"])
    dense = gf.dequantize("head.weight")
    rot = rotation_for(K, "kron")
    fp16 = encode_rows(lazy.source("head.weight"), "fp16")
    assert np.array_equal(fp16.data, dense.astype(np.float16))
    int8 = encode_rows(lazy.source("head.weight"), "int8", rot)
    q, scale = quantize_matrix(rotate_matrix(dense, rot))
    assert np.array_equal(int8.data, q) and np.array_equal(int8.scale, scale)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_streamed_table_blocks_equal_encode_rows(tmp_path, precision):
    """A Gather-only table left to be encoded as it is written out
    (streamed_rows) yields, block by block, the rows and scales encode_rows
    gives for the whole table; its stand-ins hold no data."""
    from rkc.compiler.frontend.gguf import GgufFile
    from rkc.compiler.llm.encode import streamed_rows
    from rkc.compiler.llm.weights import RowTable

    table = RowTable(GgufFile(_q8_0_file(tmp_path / "m.gguf")), "head.weight")
    whole = encode_rows(table, precision)
    lazy = streamed_rows(table, precision)
    assert lazy.data.shape == whole.data.shape and lazy.data.dtype == whole.data.dtype
    assert lazy.data.strides == (0, 0)
    blocks = list(lazy.blocks())
    assert len(blocks) > 1
    assert np.array_equal(np.concatenate([rows for _, rows, _ in blocks]), whole.data)
    if precision == "int8":
        assert np.array_equal(np.concatenate([s for *_, s in blocks]), whole.scale)
    else:
        assert lazy.scale is None and all(s is None for *_, s in blocks)


def _mapped_kb(path) -> int:
    """The resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split(" ", 1)[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_read_weights_leave_no_resident_file_pages(tmp_path):
    """A weight dequantized from the mapped GGUF, whole or in row blocks, lets
    its file pages go (GgufFile.release): a 5 GB model's pages would otherwise
    count in the compile's RSS. Reading again gives the same values."""
    from rkc.compiler.frontend.gguf import GgufFile
    from rkc.compiler.llm.weights import RowTable

    path = _q8_0_file(tmp_path / "m.gguf", rows=3 * ENCODE_ROWS, k=1024)  # ~6.5 MB of Q8_0
    gf = GgufFile(path)
    raw = np.asarray(gf.raw("head.weight"))
    assert raw.nbytes > 6_000_000
    first = gf.dequantize("head.weight")
    assert _mapped_kb(path) < 256
    assert np.array_equal(np.concatenate([rows for _, rows in RowTable(gf, "head.weight").blocks()]), first)
    assert _mapped_kb(path) < 256
    int(raw.sum())  # touching the view again faults the pages back in: the release is what dropped them
    assert _mapped_kb(path) > raw.nbytes // 1024 // 2
    assert np.array_equal(gf.dequantize("head.weight"), first)
