"""Which fa-images a generated workflow installs: the one that wrote it, pinned.

A team's repository is not fa-images, so ``pip install .`` there installs something else (or
nothing). The export knows where its own fa-images came from: its install record (PEP 610's
``direct_url.json``) names a VCS URL and commit; without one, it came from an index, at its
version. ``.`` is right only in the repository this fa-images runs from. Where none of that
tells a runner how to get it (a local path), the export refuses and names ``--install``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from pathlib import Path

from ...builder import untrusted
from ...errors import UsageError

PROJECT = "fa-images"
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}", re.ASCII)  # SHA-1 or SHA-256 repositories
# A repository URL a runner clones: https or ssh, a host, a path; nothing a shell or pip reads as an option.
_REACHABLE = re.compile(r"(?:https|ssh)://(?:git@)?[A-Za-z0-9.-]+(?::\d{1,5})?/[A-Za-z0-9._~/+-]+", re.ASCII)
MAX_RECORD = 64 << 10  # direct_url.json is a few hundred bytes


def this_fa_images(repository: Path) -> str:
    """The ``pip install`` target for the fa-images running now, as a runner of ``repository`` gets it."""
    if _is_own_source(repository):
        return "."
    try:
        dist = importlib.metadata.distribution(PROJECT)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(
            "this fa-images has no install record, so a workflow cannot install the same one",
            hint=_HINT,
        ) from None
    record = _install_record(dist)
    if record is None:  # installed from an index: that index serves the same version
        return f"{PROJECT}=={dist.version}"
    return _from_record(record, dist.version)


def _install_record(dist: importlib.metadata.Distribution) -> str | None:
    """Its PEP 610 ``direct_url.json``, read as untrusted bytes (a regular file, bounded: a FIFO or a
    huge file there is refused, never waited on or read whole); None where it has none."""
    listed = [f for f in dist.files or () if f.name == "direct_url.json" and f.parent.name.endswith(".dist-info")]
    path = Path(str(dist.locate_file(listed[0]))) if listed else None
    if path is None:
        metadata_dir = getattr(dist, "_path", None)  # the stdlib's own PathDistribution: where pip writes it
        path = Path(metadata_dir) / "direct_url.json" if metadata_dir is not None else None
    if path is None or not os.path.lexists(path):
        return None
    try:
        return untrusted.read_file(path, limit=MAX_RECORD, what="install record").decode("utf-8", "replace")
    except untrusted.UntrustedInput as exc:
        raise UsageError(f"this fa-images's {exc}", hint=_HINT) from None


_HINT = "pass --install, e.g. --install 'fa-images==1.2.0' or --install 'git+https://host/org/fa-images@COMMIT'"


def _is_own_source(repository: Path) -> bool:
    """Whether ``repository`` is the source this fa-images runs from (a checkout of fa-images,
    installed editable or run in place): there, ``.`` installs exactly this one."""
    source = Path(__file__).resolve().parents[3]
    return (source / "pyproject.toml").is_file() and source == repository.resolve()


def _from_record(record: str, version: str) -> str:
    """A VCS URL at its commit, from PEP 610's record; a local directory or archive is refused."""
    try:
        data = json.loads(record[:MAX_RECORD])
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise UsageError(f"this fa-images {version}'s install record (direct_url.json) cannot be read", hint=_HINT)
    url, vcs = data["url"], data.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") == "git":
        commit = vcs.get("commit_id")
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
            raise UsageError(
                f"this fa-images's install record names commit {untrusted.shown(repr(commit)[:80])}, "
                "not a full git hash",
                hint=_HINT,
            )
        if not _REACHABLE.fullmatch(url) or untrusted.masked(url) != url:  # a runner clones it, anonymously
            raise UsageError(
                f"this fa-images was installed from {untrusted.shown_url(url)[:200]}, which is not a URL a runner "
                "can clone without a credential (https:// or ssh://, no login or credential in it)",
                hint=_HINT,
            )
        return f"git+{url}@{commit}"
    raise UsageError(
        f"this fa-images {version} was installed from {untrusted.shown_url(url)}, which a runner cannot reach",
        hint=_HINT,
    )
