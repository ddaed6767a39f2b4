"""Wheels that already exist, for ``build --wheels``: the runtime image made around a wheel built
natively, on a Slurm node or by another job, with no compile.

Each entry takes the one wheel, among those given, that is for it: flash-attn of the entry's
version, for its Python, labelled for its torch, CUDA and C++ ABI (``+cu128torch2.9cxx11abitrue``,
as the builder labels every wheel), or recorded for the entry in a ``dist/`` manifest beside it;
an abi3 wheel, for its Python or an older one, labelled for its CUDA major and
build (``+cu13.k1a2b3c4d``): one wheel serves every entry of its compile group.
A wheel found is first opened as pip reads it (``builder.wheelfile``): one pip would refuse, or
one with a member that would install outside its target, is refused here, before any engine is
asked. The executor then verifies the wheel as it verifies a compiled one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ..builder import dist as dist_dir
from ..builder import wheelfile
from ..config.matrix import Entry
from ..errors import UsageError


def _wheels_under(paths: Iterable[Path]) -> list[Path]:
    """The wheel files named, and those directly inside the directories named (a dist/)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.glob("*.whl") if p.is_file() and not p.is_symlink())
        elif path.is_file() and path.suffix == ".whl":
            found.append(path)
        else:
            raise UsageError(f"--wheels {path}: not a wheel file or a directory of wheels")
    return found


def _recorded_for(wheel: Path) -> str | None:
    """The entry a dist/ manifest beside the wheel records it for, if there is one."""
    if not (wheel.parent / dist_dir.MANIFEST).is_file():
        return None
    record = dist_dir.read_manifest(wheel.parent).wheels.get(wheel.name)
    return record.entry if record else None


def _is_for(wheel: Path, entry: Entry) -> bool:
    try:
        name, version, _build, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return False
    python = "cp" + entry.python.replace(".", "")
    if name != canonicalize_name(entry.generation.project) or version.public != Version(entry.flash_attn).public:
        return False
    if entry.generation.abi3:
        return version.local in entry.recipe.wheel_labels(entry) and any(
            t.abi == "abi3" and t.platform.endswith("x86_64") and _serves(t.interpreter, python) for t in tags
        )
    if not any(t.interpreter == python and t.platform.endswith("x86_64") for t in tags):
        return False
    if _recorded_for(wheel) == entry.id:
        return True
    return version.local in entry.recipe.wheel_labels(entry)


def _serves(interpreter: str, python: str) -> bool:
    """Whether an abi3 wheel for ``interpreter`` (cp39) serves ``python`` (cp312): it and every later one."""
    older, newer = interpreter.removeprefix("cp3"), python.removeprefix("cp3")
    return interpreter.startswith("cp3") and older.isdigit() and int(older) <= int(newer)


def _refuse_control_characters(wheels: list[Path]) -> None:
    """A wheel whose name holds a control character is refused, not passed over: packaging
    takes one in a build tag, and the name would reach the terminal and the plan. The wheel
    name rules of dist/ (``check_wheel_name``) refuse it, naming it escaped."""
    for wheel in wheels:
        if not wheel.name.isprintable():
            dist_dir.check_wheel_name(wheel.name, where=f"--wheels {wheel.parent}")
            raise UsageError(f"--wheels {wheel.parent}: {wheel.name!r} holds a control character")


def _read_as_pip_does(wheel: Path) -> None:
    """Refuses a wheel pip would refuse, or one with a member that would install outside its target."""
    try:
        with wheelfile.open_wheel(wheel):
            pass
    except wheelfile.BadWheel as exc:
        raise UsageError(f"--wheels {wheel}: {exc}") from None


def find(entries: tuple[Entry, ...], paths: list[Path]) -> dict[str, Path]:
    """entry id -> the one wheel for it among ``paths``; every entry must have exactly one."""
    wheels = _wheels_under(paths)
    _refuse_control_characters(wheels)
    chosen: dict[str, Path] = {}
    problems = []
    for entry in entries:
        matches = [w for w in wheels if _is_for(w, entry)]
        if len(matches) == 1:
            _read_as_pip_does(matches[0])
            chosen[entry.id] = matches[0].resolve()
        elif not matches:
            problems.append(f"no wheel for {entry.id}")
        else:
            problems.append(f"{len(matches)} wheels for {entry.id}: {', '.join(w.name for w in matches)}")
    if problems:
        names = ", ".join(str(p) for p in paths)
        raise UsageError(
            f"--wheels {names}: " + "; ".join(problems),
            hint="a wheel is for an entry when its version, Python tag and +label (cuDDDtorchX.Ycxx11abiBOOL) "
            "match it, or a dist/ manifest beside it records it for the entry (an abi3 wheel: its abi3 tag "
            "and +cuNN.kXXXXXXXX, one wheel for its compile group); pick entries with --only",
        )
    return chosen
