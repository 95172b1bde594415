"""The commands docs/board.md and docs/inspect.md tell a user to type exist,
with the options they show: every `rkc SUB --opt`, `kernel/check-npu --opt`
and `python bench/X.py --opt` on a command line of those pages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rkc.compiler.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/board.md", "docs/inspect.md")
COMMAND = re.compile(r"^\s*(?:sudo )?(rkc \w+|kernel/check-npu|python bench/\w+\.py)(.*)$")


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, tool, options) of each command line, its comment dropped."""
    out = []
    for page in PAGES:
        for line in (ROOT / page).read_text().splitlines():
            m = COMMAND.match(line)
            if m:
                args = m.group(2).split("#", 1)[0]
                out.append((page, m.group(1), re.findall(r"(?<![\w-])--[a-z][\w-]*", args)))
    return out


def _script_options(tool: str) -> str:
    path = ROOT / tool.removeprefix("python ")
    res = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_pages_show_commands():
    tools = {tool for _, tool, _ in commands()}
    assert {"rkc doctor", "rkc probe", "rkc inspect", "kernel/check-npu", "python bench/llm.py"} <= tools


@pytest.mark.parametrize("page,tool,options", commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_command_and_its_options_exist(page, tool, options):
    if tool.startswith("rkc "):
        sub = tool.split()[1]
        assert sub in main.commands, f"{page}: rkc has no command {sub!r}"
        known = {o for p in main.commands[sub].params for o in p.opts}
        unknown = [o for o in options if o not in known]
    else:
        text = _script_options(tool)
        unknown = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not unknown, f"{page}: {tool} does not take {', '.join(unknown)}"
