"""Directories for the files a module- or session-scoped fixture shares
(compiled rkbins, written GGUFs), removed when that fixture is torn down.

tmp_path_factory.mktemp alone keeps them until the session ends: the real
models' rkbins (0.5-1 GB each) then add up to ~8 GB over a run, more than
a CI machine's free disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def scratch_dir(request: pytest.FixtureRequest, factory: pytest.TempPathFactory, name: str) -> Path:
    """A fresh directory that lives as long as the fixture whose request this is."""
    path = factory.mktemp(name)
    request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))
    return path
