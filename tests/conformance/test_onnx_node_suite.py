"""The ONNX backend node suite, for every case whose ops rkc claims, in both
modes (inputs as given; weights bound so the NPU runs them): each case passes,
or it is listed with its reason in docs/onnx-conformance.md."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import onnx_conformance as conformance  # noqa: E402


@pytest.mark.parametrize("mode", list(conformance.MODES))
def test_every_claimed_case_passes_or_is_documented(mode):
    results = conformance.run_suite("fp16", bind_weights=conformance.MODES[mode])
    text = (ROOT / "docs/onnx-conformance.md").read_text()
    documented = {case: why for (m, case), why in conformance.documented_failures(text).items() if m == mode}
    failing = {r.name: r.reason for r in results if not r.ok}
    undocumented = {n: r for n, r in failing.items() if n not in documented}
    fixed = sorted(set(documented) - set(failing))
    assert not undocumented, f"new failures (fix them or document them): {undocumented}"
    assert not fixed, f"these now pass; regenerate docs/onnx-conformance.md: {fixed}"
    passed = len(results) - len(failing)
    assert f"**{mode}: {passed} of {len(results)} cases pass**" in text
    if mode == "weights bound":
        assert sum(bool(r.npu_ops) for r in results) >= 10, "the NPU path is not exercised"
