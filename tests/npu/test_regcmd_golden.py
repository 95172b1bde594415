"""The register table and entry codec agree with two independent captures: every
entry Mesa's rocket driver and the rocket matmul library emitted decodes to a
known register of the right block, with the same name their decoder printed, no
reserved bits set, and re-encodes from its fields to the same 64 bits."""

import json
from functools import lru_cache

import pytest

from golden_cases import case_files
from rkc.ir.npu.regcmd import EntryKind, decode, encode, write_entry
from rkc.ir.npu.registers import register


@lru_cache(maxsize=None)
def _streams(kind: str):
    out = []
    for path in case_files(kind):
        case = json.loads(path.read_text())
        for submit in case.get("submits", []):
            for job in submit["jobs"]:
                for task in job["tasks"]:
                    out.append((path.name, task["regcmd"], task["regcmd_decoded"]))
    return out


def _golden_name(text: str) -> str | None:
    # "CNA:CNA_CBUF_CON0=0x000000b1" -> "CNA_CBUF_CON0"
    if ":" not in text or "=" not in text or text.startswith("tgt="):
        return None
    return text.split(":", 1)[1].split("=", 1)[0]


@pytest.mark.parametrize("kind", ["mesa-rocket", "gemm-rocket-userspace"])
def test_every_golden_entry_decodes_and_reencodes(kind):
    streams = _streams(kind)
    assert streams, f"no {kind} streams"
    seen = 0
    for case, regcmd, decoded_text in streams:
        for d, text in zip(decode(int(h, 16) for h in regcmd), decoded_text):
            where = f"{case} entry {d.index} ({text})"
            assert d.kind not in (EntryKind.UNKNOWN_TARGET, EntryKind.UNKNOWN_REGISTER), where
            assert not d.problems, f"{where}: {d.problems}"
            if d.kind is EntryKind.WRITE:
                assert d.register.name == _golden_name(text), where
                repacked = d.register.pack(d.fields)
                assert write_entry(d.register, repacked) == d.raw, where
            seen += 1
    assert seen > 1000


def test_vendor_blob_worked_example_fields():
    """hw-rocket-and-mesa.md 4.5: the vendor blob for an 8x8x1 -> 6x6x1 3x3 conv."""
    assert register("CNA_DATA_SIZE0").unpack(0x00080008) == {"DATAIN_WIDTH": 8, "DATAIN_HEIGHT": 8}
    assert register("CNA_WEIGHT_SIZE2").unpack(0x03030002) == {
        "WEIGHT_WIDTH": 3, "WEIGHT_HEIGHT": 3, "WEIGHT_KERNELS": 2}
    assert register("CNA_CBUF_CON0").pack(DATA_BANK=1, WEIGHT_BANK=11) == 0xB1
    assert register("DPU_BS_OW_CFG").pack(SIZE_E_2=1, SIZE_E_1=1, SIZE_E_0=1) == 0x124
    assert register("DPU_OUT_CVT_SCALE").unpack(0x5325)["OUT_CVT_SCALE"] == 0x5325


def test_packing_refuses_values_that_do_not_fit():
    from rkc.ir.errors import RegisterError

    with pytest.raises(RegisterError, match="DATAIN_WIDTH=0x800 does not fit 11 bits"):
        register("CNA_DATA_SIZE0").pack(DATAIN_WIDTH=2048)
    with pytest.raises(RegisterError, match="no field 'WIDTH'"):
        register("CNA_DATA_SIZE0").pack(WIDTH=1)
    with pytest.raises(RegisterError, match="unknown NPU register"):
        register("CNA_NOPE")
    assert register("DPU_OUT_CVT_OFFSET").pack(OUT_CVT_OFFSET=-128) == 0xFFFFFF80


def test_entry_codec_layout():
    assert encode(0x0201, 0x1040, 0xB1) == 0x0201000000B11040
    assert write_entry("PC_REGISTER_AMOUNTS", 0) == 0x0101000000000014
    assert write_entry("DPU_S_POINTER", 0xE) == 0x10010000000E4004
