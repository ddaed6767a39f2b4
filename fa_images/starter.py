"""``fa-images init``: a commented starter ``matrix.yaml``, so a first run can start anywhere.

The entry is the one ``doctor`` suggests for this machine (its Python, its torch's CUDA build,
its GPUs' archs) or, with ``--target``s, the same Python and torch for each GPU class of the
targets: AWS instance families (``g6e``), targets of the compat table (``aws``) or GPUs (``L4``,
``sm_90``), or one entry for them all (``one_image``). The text is loaded as ``plan``
would load it before it is written, and it is written only where no file is (``--force``
replaces one), never through a symlink.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import doctor
from .builder import generations as builder_generations
from .builder import safe_io
from .config import compat as compat_mod
from .config import generations, matrix, pick
from .config.grammar import PULL_POLICIES
from .config.model import DEFAULT_IMAGE, Bases, Entry
from .errors import ConfigError, EnvironmentProblem, UsageError

# A target as the command line may give it: a name of the compat table, a GPU, sm_XY or X.Y.
_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9_. -]{0,39}", re.ASCII)


def _target_problem(target: str, table: compat_mod.Compat, fa2: bool = True) -> str | None:
    """Why ``target`` cannot be a starter's target, or None: what plan would say of it, in one line.
    Another generation's rules (``fa2`` False) are the resolver's, which loads the starter."""
    if not _TARGET.fullmatch(target):
        return f"--target {target!r} is not a target name, an instance family or a GPU"
    if why := table.unbuilt_family(target):
        return f"--target {why}"
    for gpu in table.target_gpus(target):
        capability = table.capability_of(gpu)
        whose = f"{target}'s {gpu}" if compat_mod.gpu_key(gpu) != compat_mod.gpu_key(target) else target
        if capability is None:
            hint = compat_mod.did_you_mean(target, table.target_names())
            return f"--target {target!r} is neither a target nor a GPU fa-images knows ({hint})"
        if fa2 and not table.fa2_arch(capability):
            return (
                f"--target {whose} (compute capability {capability}) cannot run flash-attn 2, which needs "
                f"{table.fa2_min_capability} or newer"
            )
    return None


@dataclass(frozen=True)
class Starter:
    text: str
    torch_why: str  # why this Python and torch: --python's own, or what the table suggests for it
    archs_why: str  # why its archs, without a target: this machine's GPUs, or none seen


def starter_text(
    *,
    python: str = sys.executable,
    targets: list[str] | None = None,
    one_image: bool = False,
    flash_attn: str | None = None,
) -> Starter:
    """The starter matrix for this machine, or for ``targets``: an entry per GPU class (targets
    whose GPUs need the same kernels share one), or one for all with ``one_image``; refused when
    nothing fits. ``flash_attn``: the version to build (its generation's), not the one doctor suggests."""
    table = compat_mod.load()
    gen = builder_generations.of_version(flash_attn) if flash_attn else builder_generations.FA2
    module = generations.module_of(gen)
    for target in targets or ():
        problem = _target_problem(target, table, fa2=gen is builder_generations.FA2)
        if problem:
            raise UsageError(
                problem,
                hint="e.g. --target g6e, --target L4, --target H100 (`fa-images gpus` lists them all)",
            )
    report = doctor.run(python=python)
    if report.entry is None:
        why = "; ".join(f.detail for f in report.findings if f.name == "matrix entry") or "no Python doctor can read"
        raise EnvironmentProblem(f"no entry fits this machine: {why}", hint="run `fa-images doctor` to see why")
    facts = report.facts
    entries = [dict(report.entry)]
    if gen is not builder_generations.FA2 and not targets:  # its kernels are chosen by GPU: this machine's
        seen = facts.get("gpus") or []
        targets = list(dict.fromkeys(pick.named(table, g["name"], g.get("compute_capability", "")) for g in seen))
        if not targets:
            raise UsageError(f"{gen.name} needs a target, and no GPU is seen here", hint="e.g. --target H100")
    if flash_attn:
        entries = [{**entries[0], "flash_attn": flash_attn}]
    if targets:
        base = {k: v for k, v in entries[0].items() if k not in ("archs", "cuda")}
        groups = [list(dict.fromkeys(targets))] if one_image else _classes(targets, table, module)
        entries = [{**base, "target": group} for group in groups]
    version = (facts.get("torch") or {}).get("version")
    torch = f"torch {version}" if version else "no torch"
    gpus = ", ".join(g["name"] for g in facts.get("gpus") or []) or "no GPU seen"
    here = f"this machine: Python {facts.get('python')}, {torch}, {gpus}"
    made_for = f"{'target' if len(targets or ()) == 1 else 'targets'} {', '.join(targets)}" if targets else here
    chose = report.entry["torch"]
    installed = (version or "").split("+")[0]
    notes = [n for f in report.findings if f.name == "matrix entry" for n in f.detail.split("; ")]
    why = f"the torch of {python}" if installed == chose else "; ".join(n for n in notes if "torch" in n)
    archs = next((n for n in notes if n.startswith("no GPU seen")), f"for this machine's GPUs: {gpus}")
    text = _render(entries, made_for, module.STARTER)
    return Starter(text, f"Python {report.entry['python']}, {torch} here: {why}", archs)


def _classes(targets: list[str], table: compat_mod.Compat, module=generations.fa2) -> list[list[str]]:
    """The targets grouped by the kernels their GPUs need, as the generation's ``module`` says (its
    ``class_of``), in the order given: one entry, one image and one wheel per GPU class."""
    class_of = module.class_of
    groups: dict[tuple[str, ...], list[str]] = {}
    for target in dict.fromkeys(targets):
        key = tuple(sorted({class_of(table, gpu) for gpu in table.target_gpus(target)}))
        groups.setdefault(key, []).append(target)
    return list(groups.values())


def _flow(entry: dict) -> str:
    """The entry as one flow mapping, every string quoted (a version must never be read as a number)."""
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in entry.items()) + "}"


def _render(entries: list[dict], made_for: str, generation_notes: str = "") -> str:
    entry = entries[0]
    lines = "\n".join(f"  - {_flow(e)}" for e in entries)
    bases = Bases()
    return (
        f"""\
# The flash-attn images and wheels to build, written by `fa-images init` for {made_for}.
# yaml-language-server: $schema=matrix.schema.json
#   (editors check this file against `fa-images schema > matrix.schema.json`, the line above)
#   fa-images plan     what this expands to (every mistake at once, with its line)
#   fa-images build    builds, checks and exports each entry; wheels in dist/ (needs Docker)
# What fa-images knows (torch releases and their CUDA builds, GPUs, flash-attn sdists) is its
# compat table; `plan` names the supported versions when one is wrong.

# Where the images go; tags are <image>:fa<flash-attn>-py<python>-torch<torch>-cu<cuda>.
# Use your registry (e.g. ghcr.io/you/flash-attn) to `build --push`.
image: {DEFAULT_IMAGE}

entries:
  # Without `cuda`, torch's PyPI default CUDA build, or the oldest one its archs need. `target`
  # names GPUs, AWS instance families or a target (aws: A10G and L4, which both run the sm_80
  # kernels); `archs: [80, 90]` gives the archs directly. Entries of one torch that differ in
  # their archs alone are one image and one wheel per GPU class (tags end in -sm80, -sm120).
{lines}

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
        + generation_notes
    )


def _check(text: str, flash_attn: str | None = None) -> tuple[Entry, ...]:
    """Loads the text as ``plan`` would, into its entries: a starter that does not validate is never
    written. It is the user's choice that fails where ``flash_attn`` was given (a generation the torch cannot have)."""
    with tempfile.TemporaryDirectory(prefix="fa-init-") as tmp:
        path = Path(tmp) / "matrix.yaml"
        path.write_text(text)
        try:
            return matrix.load(path).entries
        except ConfigError as exc:
            if flash_attn:
                why = "; ".join(p.message for p in exc.problems)
                raise UsageError(f"--flash-attn {flash_attn}: {why}") from None
            raise EnvironmentProblem(f"the starter matrix does not validate: {exc}") from None  # a bug here


@dataclass(frozen=True)
class Written:
    path: Path
    entries: tuple[Entry, ...]  # what `plan` makes of it
    torch_why: str  # why its Python and torch
    archs_why: str  # why its archs, where no target names them


def write(
    out: Path,
    *,
    force: bool,
    python: str = sys.executable,
    targets: list[str] | None = None,
    one_image: bool = False,
    flash_attn: str | None = None,
) -> Written:
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
    starter = starter_text(python=python, targets=targets, one_image=one_image, flash_attn=flash_attn)
    text = starter.text
    entries = _check(text, flash_attn)
    path = folder.write_text(out.name, text) if force else folder.create_text(out.name, text)
    return Written(path, entries, starter.torch_why, starter.archs_why)
