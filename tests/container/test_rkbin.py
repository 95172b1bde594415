"""The rkbin container: round trip, and one clear error for every kind of damage."""

import numpy as np
import pytest

from rkc.ir.errors import FormatError
from rkc.ir.npu.regcmd import RegcmdBuilder
from rkc.ir.npu.registers import Block
from rkc.ir.program import Job, Module, Program, Region, Relocation, Step, TaskRef, TensorInfo
from rkc.ir.rkbin import read_rkbin, write_rkbin


def _module_and_blobs():
    b = RegcmdBuilder()
    b.write("DPU_DATA_CUBE_WIDTH", WIDTH=3)
    b.address("DPU_DST_BASE_ADDR", "act", 64)
    # the rest of the write-back's geometry: a load proves the write's whole extent
    b.write("DPU_DATA_CUBE_HEIGHT", HEIGHT=0)
    b.write("DPU_DATA_CUBE_CHANNEL", CHANNEL=0)
    b.write("DPU_DATA_FORMAT", OUT_PRECISION=2)
    b.write("DPU_BS_OW_CFG", SIZE_E_0=1)
    b.write("DPU_DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_0=0)
    b.write("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=1)
    b.finish([Block.DPU, Block.DPU_RDMA])
    regcmd = b.array()
    module = Module(
        regions=[Region("weights", 4096, "weights", "w"), Region("regcmd", 4096, "regcmd", "rc"),
                 Region("act", 8192, "scratch")],
        tensors=[TensorInfo("x", [1, 4], "fp32"), TensorInfo("y", [1, 4], "fp32", "row", "act", 64, 16)],
        relocations=[Relocation("regcmd", 1, "act", 64)],
        programs=[Program("main", ["x"], ["y"], [
            Step("cpu", "to_npu", op="copy", inputs=["x"], outputs=["y"]),
            Step("npu", "seg0", jobs=[Job([TaskRef("regcmd", 0, len(regcmd))], ["act"], ["act"])]),
        ])],
        metadata={"model": "test"},
    )
    return module, {"w": np.arange(100, dtype=np.uint8), "rc": regcmd}


def test_round_trip(tmp_path):
    module, blobs = _module_and_blobs()
    path = tmp_path / "m.rkbin"
    write_rkbin(path, module, blobs)
    back = read_rkbin(path)
    assert back.module == module
    assert bytes(back.blobs["w"]) == bytes(blobs["w"])
    assert bytes(back.blobs["rc"]) == blobs["rc"].tobytes()
    (title, entries), = back.regcmd_streams()
    assert list(entries) == list(blobs["rc"])


def _blob_offsets(path):
    import gguf

    return {t.name: (int(t.data_offset), int(t.n_bytes)) for t in gguf.GGUFReader(path).tensors}


def test_truncated_file_is_one_error(tmp_path):
    module, blobs = _module_and_blobs()
    path = tmp_path / "m.rkbin"
    write_rkbin(path, module, blobs)
    data = path.read_bytes()
    start, size = _blob_offsets(path)["rc"]
    for cut in (10, 100, len(data) // 2, start + size - 8):
        (tmp_path / "cut.rkbin").write_bytes(data[:cut])
        with pytest.raises(FormatError) as info:
            read_rkbin(tmp_path / "cut.rkbin")
        assert "\n" not in str(info.value)


def test_flipped_blob_byte_fails_its_checksum(tmp_path):
    module, blobs = _module_and_blobs()
    path = tmp_path / "m.rkbin"
    write_rkbin(path, module, blobs)
    data = bytearray(path.read_bytes())
    start, size = _blob_offsets(path)["rc"]
    data[start + size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="fails its checksum"):
        read_rkbin(path)


def test_not_an_rkbin(tmp_path):
    (tmp_path / "x.rkbin").write_bytes(b"hello world, not gguf")
    with pytest.raises(FormatError, match="no GGUF magic"):
        read_rkbin(tmp_path / "x.rkbin")


@pytest.mark.parametrize("damage, message", [
    (lambda m: setattr(m.relocations[0], "target", "nowhere"), "targets missing region 'nowhere'"),
    (lambda m: setattr(m.relocations[0], "entry", 10_000), "entry 10000 is outside region"),
    (lambda m: setattr(m.programs[0].steps[1].jobs[0].tasks[0], "count", 10_000), "is outside region"),
    (lambda m: setattr(m.programs[0].steps[1].jobs[0].tasks[0], "entry", 1), "16-byte aligned"),
    (lambda m: m.programs[0].outputs.append("ghost"), "unknown tensor 'ghost'"),
    (lambda m: setattr(m.tensors[1], "offset", 8190), "overruns region 'act'"),
    (lambda m: setattr(m.regions[0], "blob", "nope"), "missing blob 'nope'"),
    (lambda m: setattr(m.programs[0].steps[1], "jobs", []), "has no jobs"),
])
def test_bad_cross_references_are_refused_before_writing(tmp_path, damage, message):
    module, blobs = _module_and_blobs()
    damage(module)
    with pytest.raises(FormatError, match=message):
        write_rkbin(tmp_path / "m.rkbin", module, blobs)
    assert not list(tmp_path.iterdir()), "nothing half-written"


def test_written_file_honours_the_umask(tmp_path):
    import os

    module, blobs = _module_and_blobs()
    old = os.umask(0o022)
    try:
        write_rkbin(tmp_path / "m.rkbin", module, blobs)
    finally:
        os.umask(old)
    assert (tmp_path / "m.rkbin").stat().st_mode & 0o777 == 0o644


def test_spooled_blobs_write_the_same_bytes(tmp_path):
    """A blob spooled to disk as it was made (ir/spool.py) gives the file the
    bytes it has when written from memory: the header, the alignment padding
    and the checksums are the same."""
    from rkc.ir.spool import SpooledBlob

    module, blobs = _module_and_blobs()
    write_rkbin(tmp_path / "memory.rkbin", module, blobs)
    spooled = SpooledBlob(tmp_path)
    for part in np.array_split(blobs["w"], 3):  # appended in pieces, as a builder places weights
        spooled.append(part)
    write_rkbin(tmp_path / "spooled.rkbin", module, {"w": spooled, "rc": blobs["rc"]})
    assert (tmp_path / "spooled.rkbin").read_bytes() == (tmp_path / "memory.rkbin").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.rkbin", "spooled.rkbin"]  # the spool is unnamed
