"""A few OS packages installed in a base image, whichever family it is.

NVIDIA publishes its CUDA images for both families: Ubuntu (apt-get) and the RHEL 8/9 family
(Rocky, UBI: dnf, or microdnf in the minimal images). A RHEL 8 family devel base has glibc
2.28, the floor a wheel needs for the manylinux_2_28 tag. So what a stage installs on a base
is one shell command that asks whichever package manager the base has, and fails naming the
packages when it has none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Packages:
    """One need, by its package names in each family (they differ)."""

    deb: tuple[str, ...]
    rpm: tuple[str, ...]


GIT = Packages(deb=("git",), rpm=("git-core",))
# pip for the base's own python3, to install uv; CA certificates for its downloads.
PIP = Packages(deb=("ca-certificates", "python3-pip"), rpm=("ca-certificates", "python3-pip"))


def install_lines(*needs: Packages) -> list[str]:
    """One shell command, as lines to join with `` \\`` + newline (a Dockerfile RUN) or with a
    space (a script line). Each manager's cache is emptied in the same command, out of the layer."""
    deb = " ".join(p for need in needs for p in need.deb)
    rpm = " ".join(p for need in needs for p in need.rpm)
    return [
        "if command -v apt-get >/dev/null; then",
        f"  apt-get update && apt-get install -y --no-install-recommends {deb} && rm -rf /var/lib/apt/lists/*;",
        "elif command -v dnf >/dev/null; then",
        f"  dnf install -y {rpm} && dnf clean all;",
        "elif command -v microdnf >/dev/null; then",
        f"  microdnf install -y {rpm} && microdnf clean all;",
        "else",
        f'  echo "fa-images: the base has no apt-get, dnf or microdnf to install {deb}; add them to it" >&2; exit 1;',
        "fi",
    ]


def install_command(*needs: Packages) -> str:
    """:func:`install_lines` on one line."""
    return " ".join(line.strip() for line in install_lines(*needs))
