"""README.md opens with the two newcomer commands, and .ci/run runs the second."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    return [b.strip() for b in blocks[:2]]


def test_readme_opens_with_setup_and_test_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.index("```sh")
    assert text[:first_block].count("\n") <= 2, "the commands must open the README"
    setup, tests = _readme_commands()
    assert "pip install -e '.[test]'" in setup and "examples/" in setup
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    _, tests = _readme_commands()
    ci_lines = [l.strip() for l in (ROOT / ".ci/run").read_text().splitlines()]
    assert tests in ci_lines
    assert ci_lines[-1] == tests, ".ci/run must end with the README's test command"
