"""The project's own promises: the README's commands are what CI runs, and the code lints."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_COMMAND = ".ci/setup && python -m pytest"
MAIN_COMMAND = "pip install . && fa-images build --matrix matrix.yaml"


def code_blocks(markdown: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```\n(.*?)```", markdown, re.DOTALL)]


def test_readme_holds_the_two_setup_commands() -> None:
    blocks = code_blocks((REPO / "README.md").read_text())
    assert MAIN_COMMAND in blocks and TEST_COMMAND in blocks


def test_ci_runs_exactly_the_readme_test_command() -> None:
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[-1] == TEST_COMMAND


def test_ruff_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.fail(f"{name} is not installed: it is in the test extras")
    return found


def test_ruff_format_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "format", "--check", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_mypy_is_clean() -> None:
    """Configured in pyproject.toml: the whole fa_images package."""
    proc = subprocess.run([_tool("mypy")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_shell_scripts_pass_shellcheck() -> None:
    scripts = sorted([*(REPO / ".ci").iterdir(), *(REPO / "bench").rglob("*.sh")])
    proc = subprocess.run([_tool("shellcheck"), *map(str, scripts)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_the_version_is_written_once() -> None:
    """pyproject reads it from the package; `fa-images --version` prints the same."""
    import fa_images

    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.MULTILINE)
    assert not re.search(r"^version\s*=", pyproject.split("[project.optional-dependencies]")[0], re.MULTILINE)
    proc = subprocess.run([sys.executable, "-m", "fa_images", "--version"], capture_output=True, text=True, cwd=REPO)
    assert proc.stdout.strip() == f"fa-images {fa_images.__version__}"
