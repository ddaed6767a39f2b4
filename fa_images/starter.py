"""``fa-images init``: a commented starter ``matrix.yaml``, so a first run can start anywhere.

The entry is the one ``doctor`` suggests for this machine (its Python, its torch's CUDA build,
its GPUs' archs) or, with ``--target``, the same Python and torch for a named target of the
compat table (``aws``) or a GPU (``L4``, ``H100``, ``sm_90``). The text is loaded as ``plan``
would load it before it is written, and it is written only where no file is (``--force``
replaces one), never through a symlink.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from packaging.version import Version

from . import doctor
from .builder import safe_io
from .config import compat as compat_mod
from .config import matrix
from .config.grammar import PULL_POLICIES
from .config.model import DEFAULT_IMAGE, Bases
from .errors import ConfigError, EnvironmentProblem, UsageError

# A target as the command line may give it: a name of the compat table, a GPU, sm_XY or X.Y.
_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9_. -]{0,39}", re.ASCII)


def _target_problem(target: str, table: compat_mod.Compat) -> str | None:
    if not _TARGET.fullmatch(target):
        return f"--target {target!r} is not a target name or a GPU"
    if target in table.targets:
        return None
    capability = table.capability_of(target)
    if capability and table.arch_for_capability(capability) and Version(capability) >= Version("8.0"):
        return None
    if capability:
        return f"--target {target} (compute capability {capability}) cannot run flash-attn 2, which needs 8.0 or newer"
    known = sorted(table.targets) + sorted(table.gpus)
    return (
        f"--target {target!r} is neither a target nor a GPU fa-images knows ({compat_mod.did_you_mean(target, known)})"
    )


def starter_text(*, python: str = sys.executable, target: str | None = None) -> str:
    """The starter matrix for this machine, or for ``target``; refused when nothing fits."""
    table = compat_mod.load()
    if target is not None:
        problem = _target_problem(target, table)
        if problem:
            raise UsageError(
                problem,
                hint=f"e.g. --target aws, --target L4, --target H100 (targets: {', '.join(sorted(table.targets))})",
            )
    report = doctor.run(python=python)
    if report.entry is None:
        why = "; ".join(f.detail for f in report.findings if f.name == "matrix entry") or "no Python doctor can read"
        raise EnvironmentProblem(f"no entry fits this machine: {why}", hint="run `fa-images doctor` to see why")
    entry = dict(report.entry)
    if target is not None:
        entry.pop("archs")
        entry["target"] = [target]
    facts = report.facts
    version = (facts.get("torch") or {}).get("version")
    torch = f"torch {version}" if version else "no torch"
    gpus = ", ".join(g["name"] for g in facts.get("gpus") or []) or "no GPU seen"
    made_for = f"target {target}" if target else f"this machine: Python {facts.get('python')}, {torch}, {gpus}"
    return _render(entry, made_for)


def _flow(entry: dict) -> str:
    """The entry as one flow mapping, every string quoted (a version must never be read as a number)."""
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in entry.items()) + "}"


def _render(entry: dict, made_for: str) -> str:
    bases = Bases()
    return f"""\
# The flash-attn images and wheels to build, written by `fa-images init` for {made_for}.
#   fa-images plan     what this expands to (every mistake at once, with its line)
#   fa-images build    builds, checks and exports each entry; wheels in dist/ (needs Docker)
# What fa-images knows (torch releases and their CUDA builds, GPUs, flash-attn sdists) is its
# compat table; `plan` names the supported versions when one is wrong.

# Where the images go; tags are <image>:fa<flash-attn>-py<python>-torch<torch>-cu<cuda>.
# Use your registry (e.g. ghcr.io/you/flash-attn) to `build --push`.
image: {DEFAULT_IMAGE}

entries:
  # Without `cuda`, torch's PyPI default CUDA build. `target` names GPUs or a target (aws: A10G
  # and L4, which both run the sm_80 kernels); `archs: [80, 90]` gives the archs directly.
  - {_flow(entry)}

# More Pythons or torch versions: axes that expand into every combination, as in CI.
# matrix:
#   python: ["3.11", "3.12"]
#   torch: ["{entry["torch"]}"]
#   flash_attn: ["{entry["flash_attn"]}"]
#   target: [aws]

# Optional sections, with their defaults:
# bases:
#   devel: "{bases.devel}"
#   runtime: "{bases.runtime}"
#   python: {bases.python}  # system: the bases ship python3.X already (a preflight checks it)
# build:
#   pull: {PULL_POLICIES[0]}  # or {" or ".join(PULL_POLICIES[1:])}: when the bases are pulled, before any build
#   # offline: `docker load -i base.tar`, name its tag under bases:, and set pull: never
#   memory: 16g  # a memory limit for the compile; the builder sizes its jobs by it
"""


def _check(text: str) -> None:
    """Loads the text as ``plan`` would: a starter that does not validate is never written."""
    with tempfile.TemporaryDirectory(prefix="fa-init-") as tmp:
        path = Path(tmp) / "matrix.yaml"
        path.write_text(text)
        try:
            matrix.load(path)
        except ConfigError as exc:  # a bug here, not the user's input
            raise EnvironmentProblem(f"the starter matrix does not validate: {exc}") from None


def write(out: Path, *, force: bool, python: str = sys.executable, target: str | None = None) -> Path:
    if out.name in ("", ".", ".."):
        raise UsageError(f"--out {out} is not a file name")
    folder = safe_io.OutputDir(out.parent, what="--out's folder")
    kind = folder.kind(out.name)
    if kind not in (None, "file"):
        what = "a symlink" if kind == "link" else "not a regular file"
        raise UsageError(f"--out {out} is {what}; fa-images does not write through links or over folders")
    if kind == "file" and not force:
        raise UsageError(
            f"{out} already exists; fa-images init does not overwrite it",
            hint="--force replaces it, or --out another file",
        )
    text = starter_text(python=python, target=target)
    _check(text)
    return folder.write_text(out.name, text) if force else folder.create_text(out.name, text)
