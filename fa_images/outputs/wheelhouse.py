"""Where the builder stage's Python packages come from, and the host-side wheelhouse.

Each ``pip install`` of the builder stage has one source: ``packages.index`` for the build
tools (and uv), ``packages.torch_index`` (else the index) for torch and its CUDA libraries, plus any
``find_links``. A source whose URL carries ``user:token@`` is never written into a
Dockerfile: the host downloads that install's packages with the credentials, into a
wheelhouse inside the build context, and the Dockerfile installs them with ``--no-index``.
So a private index works, and its token reaches no file, build arg, layer or log. The
same path serves air-gapped sites that want no index at all inside the build.

The wheelhouse has two parts: ``torch/`` for the torch stage, which installs it in a stage of
its own so that no image carries the wheels, and ``tools/`` for everything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..builder import untrusted
from ..builder.errors import SourceError
from ..config import grammar
from ..config.compat import merged_pins
from ..config.matrix import Entry, Matrix

# Inside the image; the context's inputs/wheels/<kind>/ is copied to WHEELHOUSE/<kind>.
WHEELHOUSE = "/opt/fa-images/wheels"
Kind = Literal["torch", "tools"]


def dir_in_image(kind: Kind) -> str:
    return f"{WHEELHOUSE}/{kind}"


# Binary wheels for the image's platform: glibc x86_64, as manylinux tags name it.
PLATFORMS = ["linux_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{minor}_x86_64" for minor in range(5, 40)
]


@dataclass(frozen=True)
class PipSource:
    """One ``pip install``'s source: an index (or none) and find-links locations."""

    index: str | None
    find_links: tuple[str, ...]
    kind: Kind = "tools"  # which part of the wheelhouse holds it when private

    @property
    def private(self) -> bool:
        """Credentials in a URL: this install is fetched on the host."""
        return any(grammar.has_credentials(u) for u in (self.index, *self.find_links) if u)

    def flags(self) -> list[str]:
        """pip's flags inside the image: never a credential."""
        if self.private:
            return ["--no-index", "--find-links", dir_in_image(self.kind)]
        return self.host_flags()  # no credential in them to leave out

    def host_flags(self) -> list[str]:
        """pip's flags on the host, credentials included: only ever passed as arguments, never printed."""
        out = ["--index-url", self.index] if self.index else ["--no-index"]
        for link in self.find_links:
            out += ["--find-links", link]
        for host in trusted_hosts((self.index, *self.find_links)):
            out += ["--trusted-host", host]
        return out


def trusted_hosts(urls: tuple[str | None, ...]) -> list[str]:
    """The ``host[:port]`` of each plain-http URL off loopback. pip ignores such an index or
    find-links page unless told to trust its host; a matrix that names one has chosen it, so the
    host it names, and no other, is trusted."""
    hosts: list[str] = []
    for url in urls:
        parts = urllib.parse.urlsplit(url or "")
        if parts.scheme.lower() != "http" or not parts.hostname or untrusted.is_loopback(parts.hostname):
            continue
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6
        host = f"{host}:{parts.port}" if parts.port else host
        if host not in hosts:
            hosts.append(host)
    return hosts


@dataclass(frozen=True)
class Install:
    """One ``pip install`` of the builder stage: what it installs, and from where."""

    name: str
    requirements: tuple[str, ...]
    source: PipSource


def installs(matrix: Matrix, entry: Entry) -> tuple[Install, ...]:
    """The builder stage's installs, in Dockerfile order."""
    links = matrix.packages.find_links
    tools = PipSource(matrix.packages.index, links)
    uv = (f"uv=={matrix.bases.uv_version}",) if matrix.bases.python == "uv" else ()
    return (
        Install("uv", uv, tools),
        *library_installs(matrix, entry),
        Install("torch", (f"torch=={entry.torch}",), _torch_source(matrix, entry)),
        Install("build tools", matrix.compat.tools_for(entry.python), tools),
        Install("runtime deps", runtime_deps(matrix, entry), tools),
    )


def _torch_source(matrix: Matrix, entry: Entry) -> PipSource:
    return PipSource(entry.torch_index or matrix.packages.index, matrix.packages.find_links, kind="torch")


def library_installs(matrix: Matrix, entry: Entry) -> tuple[Install, ...]:
    """torch's CUDA libraries, installed before it a layer each where the table knows their pins;
    torch then finds them in place. None from a private index: its wheels, fetched on the host with
    every dependency, are installed in a stage of their own and copied on as one layer anyway."""
    source = _torch_source(matrix, entry)
    layers = () if source.private else entry.torch_libraries
    return tuple(Install(f"CUDA libraries of torch, layer {i}", pins, source) for i, pins in enumerate(layers, 1))


def runtime_deps(matrix: Matrix, entry: Entry) -> tuple[str, ...]:
    """What the entry's flash-attn needs besides torch, pinned: the table's, and its generation's own
    (a generation that is Python from the index is itself one of them, with its resolved set)."""
    return merged_pins(matrix.compat.runtime_deps_for(entry.python), entry.recipe.runtime_pins())


def private_kinds(matrix: Matrix, entry: Entry) -> frozenset[Kind]:
    """The parts of the wheelhouse this entry's build needs: those with a private install."""
    return frozenset(i.source.kind for i in installs(matrix, entry) if i.source.private and i.requirements)


def _cache_key(entry: Entry, install: Install) -> str:
    """Names a download by what it holds, not by the credentials used to fetch it."""
    what = {
        "python": entry.python,
        "requirements": install.requirements,
        "index": grammar.without_credentials(install.source.index or ""),
        "find_links": [grammar.without_credentials(u) for u in install.source.find_links],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def download(install: Install, python: str, dest: Path) -> None:
    """``pip download`` of one install's packages for the image's Python and platform."""
    nodot = python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-cache-dir"]
    cmd += ["--dest", str(dest), "--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    cmd += ["--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += install.source.host_flags() + list(install.requirements)
    # No credential in the environment of a child that might print it; pip itself redacts URLs.
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    if proc.returncode != 0:
        # pip redacts the logins of its http(s) URLs, not those of every message (a file:// URL's).
        said = grammar.scrubbed(proc.stderr, (u for u in (install.source.index, *install.source.find_links) if u))
        tail = "\n  ".join(said.strip().splitlines()[-6:])
        raise SourceError(
            f"downloading the {install.name} for Python {python} on this host failed:\n  {tail}",
            hint="the index is private, so fa-images fetches from it on the host; check its URL and credentials",
        )


def fill(matrix: Matrix, entry: Entry, dest: Path, cache: Path) -> int:
    """Puts the wheels of every private install into ``dest/<kind>``; returns how many files."""
    count = 0
    for install in installs(matrix, entry):
        if not (install.source.private and install.requirements):
            continue
        part = dest / install.source.kind
        part.mkdir(parents=True, exist_ok=True)
        cached = cache / _cache_key(entry, install)
        if not (cached / ".complete").is_file():
            staging = cached.with_name(cached.name + ".partial")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            download(install, entry.python, staging)
            (staging / ".complete").write_text("")
            shutil.rmtree(cached, ignore_errors=True)
            staging.rename(cached)
        for wheel in cached.glob("*.whl"):
            target = part / wheel.name
            if not target.exists():
                try:
                    os.link(wheel, target)  # same filesystem: no copy of gigabytes
                except OSError:
                    shutil.copy2(wheel, target)
                count += 1
    return count
