"""The installed distribution owns exactly one top-level import name, `rkc`.

Built as a user's `pip install` builds it (a regular wheel from this tree), then
unpacked into a bare venv: there `rkc.ir`, `rkc.compiler` and `rkc.runtime` are
found and the folder names `compiler`, `runtime` and `ir` are not importable.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_FILES = ("setup.py", "pyproject.toml", "README.md")
PACKAGE_FOLDERS = ("rkc", "ir", "compiler", "runtime")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a fresh copy of the sources: pip builds in the tree, and a build/ left
    # there by an earlier build ships its stale modules in the wheel (hiding a missing one)
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, src / name)
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, capture_output=True, cwd=out)
    (built,) = out.glob("rkc-*.whl")
    return built


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"rkc"}
    # every subpackage and its data made it in
    for needed in ("rkc/__init__.py", "rkc/ir/__init__.py", "rkc/ir/npu/regcmd.py", "rkc/ir/ir.lark",
                   "rkc/compiler/cli/__init__.py", "rkc/compiler/llm/calibration.txt",
                   "rkc/runtime/sim/__init__.py", "rkc/runtime/llm/engine.py"):
        assert needed in names, needed
    # every module of the tree, not a sample: a folder the package list misses (one
    # without __init__.py, say) would otherwise leave a regular install without it
    sources = {f"rkc/{p.relative_to(ROOT).as_posix()}" for folder in PACKAGE_FOLDERS[1:]
               for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts}
    assert sources - set(names) == set()
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["rkc"]


def test_only_rkc_is_importable_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs by unpacking
    probe = ("import importlib.util as u\n"
             "print([u.find_spec(n) is not None for n in ('rkc.ir', 'rkc.compiler', 'rkc.runtime', "
             "'rkc.ir.npu', 'compiler', 'runtime', 'ir')])")
    # -I: isolated, so neither this checkout (cwd) nor PYTHONPATH is on sys.path
    found = subprocess.run([str(python), "-I", "-c", probe], check=True, capture_output=True, text=True,
                           cwd=tmp_path).stdout.strip()
    assert found == str([True, True, True, True, False, False, False])


def test_wheel_has_the_package_data(wheel: Path) -> None:
    """The built-in chat templates and the chat page are data files: a wheel without them fails at run time."""
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {p.name for p in (ROOT / "runtime/api/chat_templates").glob("*.jinja")}
    assert templates and {f"rkc/runtime/api/chat_templates/{t}" for t in templates} <= names
    assert "rkc/runtime/serve/static/chat.html" in names
