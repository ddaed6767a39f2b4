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
from pathlib import Path

from ...builder import untrusted
from ...errors import UsageError

PROJECT = "fa-images"
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
    record = dist.read_text("direct_url.json")
    if not record:  # installed from an index: that index serves the same version
        return f"{PROJECT}=={dist.version}"
    return _from_record(record, dist.version)


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
    if isinstance(vcs, dict) and vcs.get("vcs") == "git" and isinstance(vcs.get("commit_id"), str):
        if "@" in url.partition("://")[2].partition("/")[0]:  # a login never goes into a generated file
            raise UsageError(
                f"this fa-images was installed from {untrusted.shown_url(url)}, whose URL holds a login",
                hint=_HINT,
            )
        return f"git+{url}@{vcs['commit_id']}"
    raise UsageError(
        f"this fa-images {version} was installed from {untrusted.shown_url(url)}, which a runner cannot reach",
        hint=_HINT,
    )
