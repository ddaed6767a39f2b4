"""The builder stage's environment in a CI job's container, for jobs that compile outside a Docker build.

``export github --shards`` compiles each shard, and links each entry, in a job that runs in the
entry's devel base as its container, not in a Docker build. So the job installs what the
builder stage holds: the exact Python in ``/opt/venv`` (uv's, or the base's own with
``bases.python: system``), the exact torch there, and the build tools beside it in
``/opt/build-tools``. Each install comes from ``wheelhouse.installs``, the list the
Dockerfile's ``pip install`` lines are made from, so pins and indexes cannot drift from it,
and the paths are the Dockerfile's, so the compile sees what a Docker build of the entry sees.

A workflow is a file in a repository and its jobs run elsewhere: a source that needs
credentials (a private index) or that exists only on this host (a file:// URL, a directory)
cannot serve them, and is refused rather than written.

Where a job fetches the flash-attn sdist (``sdist_fetch``) is the one answer every export that
compiles outside a Docker build writes, the GitHub workflow and the Slurm scripts alike: the
matrix's ``packages.flash_attn_index`` (the builder checks the sdist against the pinned sha256),
after a folder of sdists when there is one.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...config import grammar
from ...config.matrix import Entry, Matrix
from ...errors import UsageError
from .. import os_packages, wheelhouse
from ..render import BUILD_TOOLS_DIR, pip_args

VENV = "/opt/venv"
PYTHON_DIR = "/opt/python"  # uv's CPython, as the uv-python stage installs it
FA_IMAGES_DIR = "/opt/fa-images"  # the builder package, as the builder stage copies it
PYTHON = f"{VENV}/bin/python"


def _sources(matrix: Matrix, entries: tuple[Entry, ...]) -> Iterator[tuple[str, str]]:
    """(setting, URL or path) of every place a job would fetch from."""
    packages = matrix.packages
    if packages.index:
        yield "packages.index", packages.index
    for link in packages.find_links:
        yield "packages.find_links", link
    yield "packages.flash_attn_index", packages.flash_attn_index
    if matrix.bases.python_mirror:
        yield "bases.python_mirror", matrix.bases.python_mirror
    for entry in entries:
        if entry.torch_index:
            yield "packages.torch_index", entry.torch_index


def _refuse_source(setting: str, where: str, flag: str, instead: str) -> None:
    """A UsageError when ``where`` cannot go into a generated file for jobs that run elsewhere:
    its grammar, credentials (a file never holds one), a place on this host."""
    problem = grammar.index_url(where) if setting != "packages.find_links" else grammar.find_links(where)
    if problem:
        raise UsageError(f"{flag}: {setting} {problem}")
    if grammar.has_credentials(where):
        shown = grammar.without_credentials(where)
        raise UsageError(
            f"{flag}: {setting} {shown} carries credentials, and a generated file never holds one; its jobs "
            f"install from it themselves (use an index that needs none, {instead})"
        )
    problem = grammar.generated_value(where)
    if problem:
        raise UsageError(f"{flag}: {setting} {problem}")
    if where.startswith(("/", "file:")):
        raise UsageError(
            f"{flag}: {setting} {where} is on this host, which the jobs cannot reach (use an http(s) index, {instead})"
        )


def refuse_what_a_job_cannot_reach(matrix: Matrix, entries: tuple[Entry, ...], flag: str) -> None:
    """A UsageError for the first source a job cannot use, and for settings its container cannot take."""
    for setting, where in _sources(matrix, entries):
        _refuse_source(setting, where, flag, "or export without --shards")
    if matrix.build.network:
        raise UsageError(
            f"{flag}: build.network {matrix.build.network} cannot be given to a job's container "
            "(GitHub sets its network); remove it from the matrix, or export without --shards"
        )


@dataclass(frozen=True, kw_only=True)
class SdistFetch:
    """Where a job that compiles outside a Docker build gets the flash-attn sdist (``wheel``'s
    ``--index-url`` and ``--sources-dir``), checked against their grammar."""

    index_url: str  # packages.flash_attn_index
    sources_dir: str | None  # a folder searched first, as the job names it; None: the index only


def sdist_fetch(matrix: Matrix, flag: str, *, sources_dir: str | None, instead: str) -> SdistFetch:
    """The one answer to "where does a job fetch the sdist", for every export: the matrix's
    flash-attn index (refused when it holds credentials or is on this host; ``instead`` says
    what to do then), and ``sources_dir``, the farm's name for its folder of sdists."""
    index = matrix.packages.flash_attn_index
    _refuse_source("packages.flash_attn_index", index, flag, instead)
    if sources_dir is not None:
        problem = grammar.repo_path(sources_dir) or grammar.generated_value(sources_dir)
        if problem:
            raise UsageError(f"{flag}: the sources dir {problem}")
    return SdistFetch(index_url=index, sources_dir=sources_dir)


def sources_dir(matrix: Matrix, flag: str) -> str | None:
    """``packages.sdists`` as the job's checkout names it: relative to this directory, the
    repository's root, as ``--matrix`` is; a folder outside the repository is refused."""
    if not matrix.packages.sdists:
        return None
    relative = os.path.relpath(matrix.packages.sdists, Path.cwd())
    if relative.split(os.sep)[0] == ".." or grammar.repo_path(relative):
        raise UsageError(
            f"{flag}: packages.sdists {matrix.packages.sdists} is not a plain path inside the repository the "
            "jobs check out (put the sdists there, or leave packages.sdists out: the jobs "
            "then fetch each sdist from packages.flash_attn_index, checked by its sha256)"
        )
    return relative


def container(matrix: Matrix, entry: Entry) -> dict:
    """The job's container: the entry's devel base, with the matrix's memory limit (the builder
    reads it from its cgroup and sizes its nvcc jobs by it)."""
    problem = grammar.image_reference(entry.devel_image) or grammar.generated_value(entry.devel_image)
    if problem:
        raise UsageError(f"entry {entry.id!r}: its devel base {problem}")
    spec: dict = {"image": entry.devel_image}
    if matrix.build.memory_bytes:
        spec["options"] = f"--memory {matrix.build.memory_bytes}"
    return spec


def _python_lines(matrix: Matrix, entry: Entry, uv_install: str) -> list[str]:
    """The exact Python and an empty venv, as the Dockerfile's uv-python (or python) stage makes them."""
    python = shlex.quote(entry.python)
    if matrix.bases.python == "system":
        return [
            f"command -v git >/dev/null || {{ {os_packages.install_command(os_packages.GIT)}; }}",
            f"python{python} -m venv {VENV}",
        ]
    mirror = matrix.bases.python_mirror
    install = f"UV_PYTHON_INSTALL_MIRROR={shlex.quote(mirror)} " if mirror else ""
    return [
        os_packages.install_command(os_packages.PIP, os_packages.GIT),
        f"PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install {uv_install}",
        f"export UV_PYTHON_INSTALL_DIR={PYTHON_DIR}",
        f"{install}uv python install {python}",
        f"uv venv --python {python} {VENV}",
        f"{PYTHON} -m ensurepip --upgrade",
    ]


def setup_script(matrix: Matrix, entry: Entry, install: str) -> str:
    """Installs the builder stage's Python, torch and build tools, and ``install`` (fa-images) for
    the builder package alone, into the job's container."""
    installs = {i.name: pip_args(i) for i in wheelhouse.installs(matrix, entry)}
    lines = [
        "export DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        *_python_lines(matrix, entry, installs["uv"]),
        f"{PYTHON} -m pip install {installs['torch']}",
        f"{PYTHON} -m pip install --target {BUILD_TOOLS_DIR} {installs['build tools']}",
        # The builder needs only its own package (stdlib, packaging, torch), as in the image.
        f"{PYTHON} -m pip install --no-deps --target {FA_IMAGES_DIR} {shlex.quote(install)}",
    ]
    for line in lines:
        problem = grammar.generated_value(line)
        if problem:
            raise UsageError(f"entry {entry.id!r}: a setup line {problem}")
    return "\n".join(lines) + "\n"


def builder_command(arguments: str) -> str:
    """``python -m fa_images.builder ARGUMENTS`` (shell words) as the builder stage runs it: the
    build tools seen by the compile only, the venv active."""
    return (
        f"export VIRTUAL_ENV={VENV} PYTHONPATH={BUILD_TOOLS_DIR}:{FA_IMAGES_DIR} "
        f'PATH="{BUILD_TOOLS_DIR}/bin:{VENV}/bin:$PATH"\n'
        f"{PYTHON} -m fa_images.builder {arguments}\n"
    )
