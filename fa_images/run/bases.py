"""The base images, before any build: pulled as the pull policy says, then checked for what the
build needs, so a missing image or a base without the Python asked for fails in seconds, with
its fix, not at step 3 of a compile.

The SDK's legacy builder pulls a missing ``FROM`` image silently, even with ``pull=False``; so
every base is provided here, explicitly and visibly (a line per layer, a line per image, the
time taken), or refused with the ways to provide it.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from ..builder.wording import counted
from ..config.grammar import PullPolicy
from ..errors import EnvironmentProblem, StepFailed
from .engine import Engine, PullProgress, registry_of
from .logger import Console, duration
from .plan import EntryPlan

_PROBE = "fa-images-probe"
OFFLINE_BASES = (
    "`docker save IMAGE -o base.tar` where a registry is reachable, `docker load -i base.tar` here, and "
    "point bases.devel / bases.runtime in the matrix at that local tag (or at a registry mirror)"
)


@dataclass(frozen=True)
class BaseNeeds:
    """What the build asks of one base image: the Pythons it must ship, the CUDA its nvcc must be."""

    ref: str
    pythons: tuple[str, ...] = ()
    cuda: tuple[str, ...] = ()  # the entries' CUDA versions ("12.8"); nvcc's major must match


def needs(plans: list[EntryPlan], python_from: str) -> list[BaseNeeds]:
    """Per base image of the plans: the Pythons (``bases.python: system``: the python stage runs
    on the runtime base and the builder copies its venv onto the devel base, so both need
    ``python3.X``) and, on the devel base of an entry that compiles, nvcc of its CUDA."""
    pythons: dict[str, set[str]] = {}
    cudas: dict[str, set[str]] = {}
    for plan in plans:
        entry = plan.entry
        for ref in plan.bases:
            pythons.setdefault(ref, set())
            cudas.setdefault(ref, set())
            if python_from == "system":
                pythons[ref].add(entry.python)
        if not plan.around_wheel and entry.devel_image in plan.bases:
            cudas[entry.devel_image].add(entry.cuda)
    return [
        BaseNeeds(ref, tuple(sorted(pythons[ref], key=Version)), tuple(sorted(cudas[ref], key=Version)))
        for ref in pythons
    ]


def provide(
    engine: Engine,
    refs: list[str],
    policy: PullPolicy,
    console: Console,
    *,
    what: str = "base image",
    offline: str = OFFLINE_BASES,
) -> None:
    """Every image of ``refs`` in the engine, as ``policy`` says: ``missing`` pulls what the engine
    lacks, ``always`` pulls every one (a moving tag is refreshed), ``never`` refuses a missing one.
    ``build`` provides its bases so, and ``check`` the images it checks (``what``, and ``offline``:
    how to provide them without a registry).

    Every pull is tried before a failure is reported, and every failure is named in one error:
    an offline user learns of all the images to provide in one run, not one per run."""
    missing = engine.missing_images(refs)
    if policy == "never" and missing:
        raise EnvironmentProblem(
            f"{counted(len(missing), what)} not in the engine: {', '.join(missing)}; --pull never forbids pulling",
            hint=provide_hint(missing, policy, offline),
        )
    wanted = refs if policy == "always" else missing
    if not wanted:
        return
    started = time.monotonic()
    failed: dict[str, str] = {}
    for ref in wanted:
        try:
            _pull(engine, ref, console)
        except StepFailed as exc:
            failed[ref] = str(exc)
    took = duration(time.monotonic() - started)
    pulled = len(wanted) - len(failed)
    if pulled:
        console.line(f"pulled {counted(pulled, what)} in {took} (--pull {policy})")
    if failed:
        message = provide_failures_message(failed, what)
        raise EnvironmentProblem(message, hint=provide_hint(list(failed), policy, offline))


def provide_failures_message(failed: dict[str, str], what: str) -> str:
    """One line per cause, with the images it hit: four bases that fail for one DNS reason are
    one cause, not four copies of it."""
    if len(failed) == 1:
        ((ref, why),) = failed.items()
        return f"cannot pull {what} {ref}: {why}"
    causes: dict[str, list[str]] = {}
    for ref, why in failed.items():
        cause = why.removeprefix(f"pull of {ref} failed: ").removeprefix(f"pull of {ref}: ").replace(ref, "IMAGE")
        causes.setdefault(cause, []).append(ref)
    if len(causes) == 1:
        ((cause, refs),) = causes.items()
        return f"cannot pull {counted(len(refs), what)} ({', '.join(refs)}): {cause}"
    lines = [f"  {', '.join(refs)}: {cause}" for cause, refs in causes.items()]
    return f"cannot pull {counted(len(failed), what)}, for {len(causes)} causes:\n" + "\n".join(lines)


def provide_hint(missing: list[str], policy: PullPolicy, offline: str = OFFLINE_BASES) -> str:
    """The ways to give the engine its images that ``policy`` did not already try: from a
    registry, or (``offline``) from a file saved elsewhere."""
    pulls = " && ".join(f"docker pull {ref}" for ref in missing)
    them = "them" if len(missing) > 1 else "it"
    if policy == "never":
        first = f"let fa-images pull {them} (--pull missing), or {pulls}"
    else:  # the pull was tried and failed: the registry, not the policy, is what to fix
        registries = list(dict.fromkeys(registry_of(ref) for ref in missing))
        one = len(registries) == 1
        logins = " / ".join(f"`docker login {r}`" for r in registries)
        first = (
            f"check that {', '.join(registries)} {'is' if one else 'are'} reachable from the engine and "
            f"{'has' if one else 'have'} {'this tag' if len(missing) == 1 else 'these tags'} "
            f"({logins} for a private one)"
        )
    return f"{first}; offline: {offline}"


def _pull(engine: Engine, ref: str, console: Console) -> None:
    """Pulls one base, a line per layer's status and one for the image; raises StepFailed."""

    def on_progress(update: PullProgress) -> None:
        size = f" {update.current / 1e6:.1f}/{update.total / 1e6:.1f} MB" if update.current and update.total else ""
        layer = f" · {update.layer}" if update.layer else ""
        console.progress(f"    pull {ref}{layer} · {update.status}{size}", key=(ref, update.layer, update.status))

    with console.step(f"pull {ref}") as shown:
        info = engine.pull(ref, on_progress)
        shown.update(note=f"{info.id[:19]}, {info.size / 1e9:.2f} GB")


def preflight(engine: Engine, wants: list[BaseNeeds], console: Console) -> None:
    """Runs one short container per base and refuses, before any compile, a base that lacks a
    Python the entries ask for (``bases.python: system``) or whose nvcc is of another CUDA major."""
    for want in wants:
        if not want.pythons and not want.cuda:
            continue
        with console.step(f"preflight {want.ref}") as shown:
            shown.update(note=_check(engine, want))


def _probe_script(want: BaseNeeds) -> str:
    """POSIX sh: where each python3.X is, and the release of the nvcc the builder would find
    ($CUDA_HOME/bin, then PATH, then /usr/local/cuda/bin, as torch's cpp_extension looks)."""
    lines = [f'p=$(command -v {shlex.quote("python" + v)}) && echo "{_PROBE} python{v}=$p"' for v in want.pythons]
    if want.cuda:
        lines.append(
            'for n in "${CUDA_HOME:-/nonexistent}/bin/nvcc" "$(command -v nvcc)" /usr/local/cuda/bin/nvcc; do '
            f'if [ -x "$n" ]; then echo "{_PROBE} nvcc=$("$n" --version | tr "\\n" " ")"; break; fi; done'
        )
    return "\n".join(lines) + "\ntrue"


def _check(engine: Engine, want: BaseNeeds) -> str:
    try:
        result = engine.run(want.ref, ["sh", "-c", _probe_script(want)], gpu=False, keep=False, on_line=lambda _: None)
    except StepFailed as exc:
        raise EnvironmentProblem(
            f"base image {want.ref} cannot run a shell: {exc}",
            hint="the Dockerfile's RUN lines need /bin/sh in the base; use a distribution base image",
        ) from None
    found = dict(
        line.removeprefix(_PROBE + " ").split("=", 1) for line in result.output if line.startswith(_PROBE + " ")
    )
    problems, notes = [], []
    for version in want.pythons:
        where = found.get(f"python{version}")
        if where:
            notes.append(f"python{version} {where}")
        else:
            problems.append(f"has no python{version} on its PATH, which bases.python: system needs")
    if want.cuda:
        problems += _nvcc_problems(found.get("nvcc"), want.cuda, notes)
    if problems:
        raise EnvironmentProblem(
            f"base image {want.ref} {'; and '.join(problems)}",
            hint=_fix_hint(want, problems),
        )
    return "; ".join(notes)


def _nvcc_problems(version_text: str | None, cudas: tuple[str, ...], notes: list[str]) -> list[str]:
    """nvcc's release against each entry's CUDA: the builder refuses another major (torch's
    cpp_extension does too); another minor of the same major builds, and is named in the note."""
    release = version_text.split("release ", 1)[1].split(",", 1)[0].strip() if version_text else None
    try:
        have = Version(release) if release else None
    except InvalidVersion:
        have = None
    wanted = " or ".join(cudas)
    if have is None:
        looked = "$CUDA_HOME/bin, PATH and /usr/local/cuda/bin"
        return [f"has no nvcc (looked in {looked}); the compile needs CUDA {wanted}"]
    wrong = [c for c in cudas if Version(c).major != have.major]
    if wrong:
        return [f"has nvcc {release}, but the entries need CUDA {' or '.join(wrong)} (another major version)"]
    other = [c for c in cudas if Version(c).release[:2] != have.release[:2]]
    notes.append(f"nvcc {release}" + (f" (the entries name CUDA {', '.join(other)}: same major)" if other else ""))
    return []


def _fix_hint(want: BaseNeeds, problems: list[str]) -> str:
    fixes = []
    if any("python" in p for p in problems):
        wanted = ", ".join(f"python{v}" for v in want.pythons)
        fixes.append(
            f"use a base that ships {wanted}, or set bases.python: uv in the matrix (fa-images then "
            "installs the exact Python itself)"
        )
    if any("nvcc" in p for p in problems):
        fixes.append(
            "point bases.devel at a CUDA devel image of the entry's CUDA version, "
            'e.g. "nvidia/cuda:{cuda_release}-devel-ubuntu22.04" (the default)'
        )
    return "; ".join(fixes)
