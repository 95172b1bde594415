"""The layers of docs/architecture.md, enforced: rkc.ir at the ground imports no
other rkc package, rkc.runtime stands on rkc.ir only (never rkc.compiler),
rkc.compiler stands on both, and the command-line modules are the top (nothing
below them imports one).

Every import statement of every module is read with `ast` (absolute, relative,
`from rkc import x`), and so are the module names a module spells as strings for
importlib (`import_module("rkc.x")`, dispatch tables of "rkc.x:attr"): a lazy or
string import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"ir": "rkc.ir", "runtime": "rkc.runtime", "compiler": "rkc.compiler"}
MAY_IMPORT = {
    "rkc.ir": ("rkc.ir",),
    "rkc.runtime": ("rkc.ir", "rkc.runtime"),
    "rkc.compiler": ("rkc.ir", "rkc.runtime", "rkc.compiler"),
}
# the top layer: `rkc` and `rkrun` and their subcommands
CLI_MODULES = ("rkc.compiler.cli", "rkc.runtime.cli", "rkc.runtime.run_cli", "rkc.runtime.llm.cli",
               "rkc.runtime.serve.cli")
BARE_NAMES = tuple(FOLDERS)  # the folder names are not import names (rkc.* only)
MODULE_STRING = re.compile(r"(rkc(?:\.\w+)+)(?::\w+)?")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of everything `module`'s source imports."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            found.append((node.lineno, origin))
            found += [(node.lineno, f"{origin}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = MODULE_STRING.fullmatch(node.value)
            if match:
                found.append((node.lineno, match.group(1)))
    return found


def violations(path: Path, source: str | None = None) -> list[str]:
    module = module_name(path)
    layer = next(p for p in MAY_IMPORT if _within(module, p))
    is_cli = any(_within(module, c) for c in CLI_MODULES)
    text = path.read_text() if source is None else source
    out = []
    for line, name in imported_names(text, module, path.name == "__init__.py"):
        where = f"{path.relative_to(ROOT)}:{line}"
        if name.split(".")[0] in BARE_NAMES:
            out.append(f"{where} imports {name!r}: the import name is rkc.{name}")
        elif name.startswith("rkc.") and not any(_within(name, p) for p in MAY_IMPORT[layer]):
            out.append(f"{where} ({layer}) imports {name}")
        elif not is_cli and any(_within(name, c) for c in CLI_MODULES):
            out.append(f"{where} imports the command-line module {name} (the CLIs are the top layer)")
    return out


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_every_package_imports_only_the_layers_below_it():
    files = sources()
    assert len(files) > 100 and any(p.parts[-2:] == ("ir", "graph.py") for p in files)
    found = [v for path in files for v in violations(path)]
    assert not found, "layering violations (docs/architecture.md):\n" + "\n".join(found)


@pytest.mark.parametrize("path,source", [
    ("ir/npu/x.py", "from rkc.runtime.native import geometry\n"),
    ("ir/x.py", "import rkc.compiler.build\n"),
    ("ir/x.py", "from rkc import runtime\n"),
    ("ir/npu/x.py", "from ...runtime import device\n"),
    ("runtime/x.py", "def f():\n    from rkc.compiler.npu import api\n"),
    ("runtime/x.py", "import importlib\nm = importlib.import_module('rkc.compiler.build')\n"),
    ("runtime/x.py", "FACTORIES = {'npu': 'rkc.compiler.npu.api:Quant'}\n"),
    ("runtime/llm/x.py", "from ..cli import main\n"),
    ("compiler/build.py", "from rkc.compiler.cli.compile import compile_cmd\n"),
    ("compiler/x.py", "from compiler.build import build\n"),
])
def test_the_scan_sees_each_form_of_import(path, source):
    assert violations(ROOT / path, source), source


@pytest.mark.parametrize("path,source", [
    ("ir/x.py", "from rkc.ir.npu import layout\nfrom . import graph\n"),
    ("runtime/x.py", "from rkc.ir.graph import Graph\nfrom .device import Device\nx = 'rkc.runtime.sim:SimDevice'\n"),
    ("runtime/cli.py", "from rkc.runtime.run_cli import run\n"),
    ("compiler/cli/x.py", "from rkc.runtime.devices import open_device\nfrom rkc.compiler.cli import main\n"),
])
def test_what_the_layers_allow_passes(path, source):
    assert violations(ROOT / path, source) == []
