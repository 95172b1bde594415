"""`rkc disasm` on a golden capture: one line per entry, names as Mesa's decoder."""

import subprocess
import sys
from pathlib import Path

from golden_cases import case_files


def test_disasm_of_a_golden_case_names_every_entry():
    case = next(p for p in case_files("mesa-rocket") if p.name == "conv_k3_s1_same_ic16_oc16_8x8.json")
    r = subprocess.run([str(Path(sys.executable).parent / "rkc"), "disasm", str(case)],
                       capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    assert lines[0] == "# submit 0 job 0 task 0: 130 entries"
    body = lines[1:]
    assert len(body) == 130
    assert "CNA_CBUF_CON0" in body[0] and "DATA_BANK=1" in body[0] and "WEIGHT_BANK=11" in body[0]
    assert "CNA_DATA_SIZE0" in body[9] and "DATAIN_WIDTH=8" in body[9]
    assert body[-1].split()[3:6] == ["OPERATION_ENABLE", "0x0000001d", "CNA"]
    assert not [l for l in body if "!!" in l]


def test_disasm_flags_what_the_hardware_would_not_understand(tmp_path):
    import numpy as np

    from rkc.ir.npu.regcmd import encode

    raw = np.array([encode(0x0201, 0x1FF0, 1), encode(0x0801, 0x1040, 0xB1), encode(0x0301, 0x1040, 0)],
                   dtype="<u8")
    (tmp_path / "bad.regcmd").write_bytes(raw.tobytes())
    r = subprocess.run([str(Path(sys.executable).parent / "rkc"), "disasm", str(tmp_path / "bad.regcmd")],
                       capture_output=True, text=True, check=True)
    body = r.stdout.splitlines()[1:]
    assert "!! no register at 0x1ff0" in body[0]
    assert "!! CNA_CBUF_CON0 belongs to CNA, written with target 0x0801" in body[1]
    assert "!! unknown target 0x0301" in body[2]
