"""One cold compile split over several machines, as every build farm's export writes it.

``export slurm --shards N`` and ``export github --shards N`` run the same plan: each compile
group's kernels compiled in N shards (``wheel --shard I/N``) by the group's first entry (any
Python of a group compiles the same kernels), every shard into a compiler cache of its own
that reaches the link; then each entry linked from that cache (``wheel --after-shards``),
which refuses unless every shard finished from the same inputs. What differs between the
farms is only how the cache travels: shared storage on Slurm, artifacts on GitHub.
"""

from __future__ import annotations

from ...builder.shards import MAX_SHARDS
from ...config import grammar, groups
from ...config.matrix import Entry
from ...errors import UsageError
from .builder_env import SdistFetch


def check_count(shards: int, *, most: int = MAX_SHARDS, why: str = "") -> None:
    """``--shards N``: 1 (no split) to ``most``; ``why`` says where a farm's lower bound comes from."""
    if not 1 <= shards <= most:
        raise UsageError(f"--shards {shards} must be between 1 and {most}{why}")


def check_entry(entry: Entry, where: str, *, shards: int = 1) -> None:
    """What reaches a script from a matrix entry was checked when the matrix loaded; again, cheaply.
    A generation whose setup.py compiles its kernels in one run is never split (its shard_problem)."""
    for value in (entry.id, entry.flash_attn, entry.cuda, entry.python, entry.torch, *entry.archs):
        problem = grammar.generated_value(value) or (None if grammar.REPO_PATH.fullmatch(value) else "unsafe")
        if problem:
            raise UsageError(f"entry {entry.id!r}: {value!r} cannot go into {where}")
    if shards > 1 and (why := entry.recipe.shard_problem()):
        raise UsageError(f"entry {entry.id!r}: {why}; export its entries without --shards, or --only the others")


def wheel_args(
    entry: Entry,
    *,
    compiler_cache: str,
    work_dir: str,
    fetch: SdistFetch,
) -> list[str]:
    """The builder's ``wheel`` arguments of an entry, shard and link alike (without ``--shard``,
    ``--after-shards`` and ``--out``): the command every consumer of the plan shares
    (``groups.wheel_command``), the sdist fetched as ``builder_env.sdist_fetch`` says, for every farm."""
    if entry.recipe.source == "archive" and not fetch.sources_dir:  # no index serves it
        raise UsageError(
            f"entry {entry.id!r}: {entry.generation.name}'s source archive is on no index; put "
            f"{entry.recipe.source_name(entry.flash_attn)} (`fa-images source fa{entry.generation.number}`) "
            "in packages.sdists"
        )
    command = groups.wheel_command(
        entry, index_url=fetch.index_url, sources_dir=fetch.sources_dir, compiler_cache=compiler_cache
    )
    return [*groups.flat(command), "--work-dir", work_dir]
