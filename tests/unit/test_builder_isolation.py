"""fa_images.builder is copied into every image, where only the stdlib, packaging and torch exist.

Every module of it must import, and its command line must run, with the host's own
dependencies (yaml, jinja2, docker) made unimportable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCKER = """
import importlib.abc, pkgutil, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"yaml", "jinja2", "docker", "requests"}:
            raise ImportError(f"{name} is not available inside an image")
        return None

sys.meta_path.insert(0, Blocked())
import fa_images.builder as builder
modules = pkgutil.walk_packages(builder.__path__, "fa_images.builder.")
names = [m.name for m in modules if not m.name.endswith("__main__")]  # __main__ would run the CLI
for name in names:
    __import__(name)
print(len(names))
"""


def test_every_builder_module_imports_without_host_dependencies() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCKER], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 10  # the blocker really walked the package


def test_the_blocker_can_fail() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER.replace("import fa_images.builder as builder", "import yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "not available inside an image" in proc.stderr


def test_the_builder_command_line_runs_without_host_dependencies() -> None:
    script = BLOCKER.split("import fa_images.builder")[0] + (
        "import runpy; sys.argv = ['x', 'inspect', '--help']\n"
        "runpy.run_module('fa_images.builder', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--no-import" in proc.stdout


def test_the_host_command_line_parses_without_host_dependencies() -> None:
    """`python -m fa_images wheel ...` runs in a torch venv without yaml, jinja2 or docker (the builder
    tier's toolchain venv, a node): building the parser must import none of them, whatever a
    subcommand's own code imports once it runs."""
    script = BLOCKER.replace(
        "import fa_images.builder as builder",
        "from fa_images import cli\ncli.build_parser()\nimport fa_images.builder as builder",
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
