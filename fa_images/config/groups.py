"""What every consumer of a plan shares: the compile groups, the entry that leads each one, and the
builder's ``wheel`` command line. ``render``, ``build``, its dry run and every export read these,
so a Dockerfile, a Slurm script and a workflow can never disagree on them.
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import Version

from .model import Entry


def leader(members: Iterable[Entry]) -> Entry:
    """The entry of a compile group that compiles for it: the oldest torch, then Python, so a shared
    wheel asks the least of the torch it meets."""
    return min(members, key=lambda e: (Version(e.torch), Version(e.python)))


def by_group(entries: Iterable[Entry]) -> dict[str, list[Entry]]:
    """The entries of each compile group, groups and members in matrix order."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry.compile_group, []).append(entry)
    return groups


def leaders(entries: Iterable[Entry]) -> dict[str, Entry]:
    """Each compile group, in matrix order, with its leader."""
    return {group: leader(members) for group, members in by_group(entries).items()}


def wheel_command(
    entry: Entry, *, index_url: str, sources_dir: str | None, compiler_cache: str
) -> list[tuple[str, ...]]:
    """The builder's ``wheel`` command for the entry, without where it writes (``--out`` in an image,
    ``--work-dir`` on a farm): each tuple a flag and its value, one line of a Dockerfile. The same
    flags everywhere, since the compiler cache keys on them."""
    lines: list[tuple[str, ...]] = [("wheel",), ("--flash-attn", entry.flash_attn)]
    lines += [("--sha256", entry.sdist_sha256)] if entry.sdist_sha256 else []
    lines += [("--sources-dir", sources_dir)] if sources_dir else []
    lines += entry.recipe.wheel_flags(entry, index_url=index_url)
    lines += [("--ptx",)] if entry.ptx else []
    lines += [("--expect-cxx11-abi", str(entry.cxx11_abi).lower())] if entry.cxx11_abi is not None else []
    return lines + [("--expect-cuda", entry.cuda), ("--compiler-cache", compiler_cache)]


def flat(lines: list[tuple[str, ...]]) -> list[str]:
    return [word for line in lines for word in line]
