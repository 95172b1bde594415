"""Locate the captured golden cases (../shared/golden) for tests.

The folder sits beside the checkout in this workspace (or at /work/shared/golden);
RKC_GOLDEN overrides it. On a machine without the captures the tests that need
them are skipped with that reason (.ci/run prints whether it found them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def golden_dir() -> Path:
    env = os.environ.get("RKC_GOLDEN")
    candidates = [Path(env)] if env else []
    candidates += [ROOT.parent / "shared" / "golden", ROOT.parent.parent / "shared" / "golden",
                   Path("/work/shared/golden")]
    for c in candidates:
        if (c / "mesa-rocket").is_dir():
            return c
    pytest.skip(f"golden cases not found (looked in {', '.join(map(str, candidates))}); set RKC_GOLDEN")


def case_files(kind: str) -> list[Path]:
    """All case files of one capture ('mesa-rocket' or 'gemm-rocket-userspace')."""
    return sorted(p for p in (golden_dir() / kind).glob("*.json") if p.name != "index.json")
