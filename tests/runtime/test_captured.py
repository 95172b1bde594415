"""runtime/captured.py refuses a broken capture with one line naming the file,
before anything is placed on a device."""

import json
from functools import lru_cache

import pytest

from golden_cases import case_files
from rkc.ir.errors import FormatError
from rkc.runtime.captured import load_case


def _smallest(kind: str) -> dict:
    return json.loads(_smallest_text(kind))


@lru_cache(maxsize=None)
def _smallest_text(kind: str) -> str:
    """The smallest capture of `kind` that has something to run."""
    for path in sorted(case_files(kind), key=lambda p: p.stat().st_size):
        text = path.read_text()
        if json.loads(text).get("submits"):
            return text
    raise AssertionError(f"no runnable {kind} capture")


def _gemm_task(case: dict) -> dict:
    return case["submits"][0]["jobs"][0]["tasks"][0]


def _mesa_content(case: dict) -> dict:
    return next(c for c in case["submits"][0]["bo_contents"] if "data" in c)


BREAKAGES = [
    ("mesa-rocket", lambda c: _mesa_content(c).update(sha256="0" * 64), "contents do not match their sha256"),
    ("mesa-rocket", lambda c: _mesa_content(c).update(encoding="gzip"), "unknown encoding 'gzip'"),
    ("mesa-rocket", lambda c: c["submits"][0]["jobs"][0]["out_bo_handles"].append(99), "no buffer with handle 99"),
    ("gemm-rocket-userspace", lambda c: _gemm_task(c)["relocations"][0].update(entry=10_000),
     "relocation of entry 10000 outside its"),
    ("gemm-rocket-userspace", lambda c: _gemm_task(c)["relocations"][0].update(offset_in_bo=1 << 30),
     "are outside buffer"),
    ("gemm-rocket-userspace", lambda c: _gemm_task(c).update(regcmd_offset_in_bo=1 << 20), "regcmd: bytes"),
    ("gemm-rocket-userspace", lambda c: _gemm_task(c).pop("regcmd"), "malformed capture (KeyError"),
    ("gemm-rocket-userspace", lambda c: c.update(schema="rkc-gemm-golden/2"), "not a captured regcmd case"),
]


@pytest.mark.parametrize("kind, breakage, message", BREAKAGES)
def test_broken_captures_are_one_clear_error(tmp_path, kind, breakage, message):
    case = _smallest(kind)
    assert load_case(_write(tmp_path, case)).submits  # intact, it loads
    breakage(case)
    with pytest.raises(FormatError, match="broken.json: ") as exc:
        load_case(_write(tmp_path, case))
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("text", ["[1, 2]", "{", '"x"', "{}"])
def test_not_a_capture(tmp_path, text):
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(FormatError, match="not a (readable JSON capture|captured regcmd case)"):
        load_case(path)


def _write(tmp_path, case: dict):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(case))
    return path
