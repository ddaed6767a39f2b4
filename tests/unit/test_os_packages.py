"""The install command of a few OS packages picks the base's own package manager.

The apt-get branch runs for real in the Python 3.9 builder stage (tests/builder), whose base
lacks git; no RHEL-family base can be had here, so the dnf and microdnf branches run against
stand-ins that record their arguments, and a base with neither is one clear error.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fa_images.config.matrix import load
from fa_images.outputs import os_packages, render

RECORDER = '#!/bin/sh\necho "${0##*/} $*" >> "$CALLS"\n'


def _run(command: str, tmp_path: Path, managers: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in managers:
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    # Only the stand-ins on PATH (sh resolves `command`, `echo` and `exit` itself).
    env = {"PATH": str(bin_dir), "CALLS": str(calls)}
    proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    return proc, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    ("managers", "expected"),
    [
        (("dnf",), ["dnf install -y git-core", "dnf clean all"]),
        (("microdnf",), ["microdnf install -y git-core", "microdnf clean all"]),
        (("dnf", "microdnf"), ["dnf install -y git-core", "dnf clean all"]),  # the full one first
    ],
)
def test_a_rhel_family_base_installs_with_its_own_manager(tmp_path: Path, managers, expected) -> None:
    proc, calls = _run(os_packages.install_command(os_packages.GIT), tmp_path, managers)
    assert proc.returncode == 0, proc.stderr
    assert calls == expected


def test_a_base_without_a_known_manager_is_one_clear_error(tmp_path: Path) -> None:
    proc, calls = _run(os_packages.install_command(os_packages.PIP, os_packages.GIT), tmp_path, ("zypper",))
    assert proc.returncode == 1 and calls == []
    assert proc.stderr.strip() == (
        "fa-images: the base has no apt-get, dnf or microdnf to install ca-certificates python3-pip git; add them to it"
    )


def test_the_dockerfile_runs_the_same_command_over_several_lines(tmp_path: Path) -> None:
    """The rendered RUN lines, joined as the shell reads them, are the command the tests run."""
    (tmp_path / "matrix.yaml").write_text(
        "image: acme/fa\nbases: {python: uv}\n"
        'entries: [{python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", archs: ["90"]}]\n'
    )
    m = load(tmp_path / "matrix.yaml")
    text = render.render_entry(m, m.entries[0], builder="sdk").replace(" \\\n", " ")
    squeezed = " ".join(text.split())
    git = os_packages.install_command(os_packages.GIT)
    assert f"RUN if ! command -v git >/dev/null; then {git}; fi && pip install --target" in squeezed
    assert f"RUN {os_packages.install_command(os_packages.PIP)} && PIP_BREAK_SYSTEM_PACKAGES=1" in squeezed
    assert subprocess.run(["/bin/sh", "-n", "-c", git], timeout=30).returncode == 0
