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
from ...config import grammar
from ...config.matrix import Entry
from ...errors import UsageError
from .builder_env import SdistFetch


def check_count(shards: int, *, most: int = MAX_SHARDS, why: str = "") -> None:
    """``--shards N``: 1 (no split) to ``most``; ``why`` says where a farm's lower bound comes from."""
    if not 1 <= shards <= most:
        raise UsageError(f"--shards {shards} must be between 1 and {most}{why}")


def group_firsts(entries: tuple[Entry, ...]) -> dict[str, Entry]:
    """Each compile group, in matrix order, with the entry whose Python compiles its shards."""
    firsts: dict[str, Entry] = {}
    for entry in entries:
        firsts.setdefault(entry.compile_group, entry)
    return firsts


def check_entry(entry: Entry, where: str, *, shards: int = 1) -> None:
    """What reaches a script from a matrix entry was checked when the matrix loaded; again, cheaply.
    FlashAttention-3's setup.py compiles its kernels in one run: it is never split into shards."""
    for value in (entry.id, entry.flash_attn, entry.cuda, entry.python, entry.torch, *entry.archs):
        problem = grammar.generated_value(value) or (None if grammar.REPO_PATH.fullmatch(value) else "unsafe")
        if problem:
            raise UsageError(f"entry {entry.id!r}: {value!r} cannot go into {where}")
    if entry.fa3 is not None and shards > 1:
        raise UsageError(
            f"entry {entry.id!r}: FlashAttention-3 is built unsharded (its setup.py compiles every kernel in one "
            "run); export its entries without --shards, or --only the others"
        )


def wheel_args(
    entry: Entry,
    *,
    compiler_cache: str,
    work_dir: str,
    fetch: SdistFetch,
) -> list[str]:
    """The builder's ``wheel`` arguments of an entry, shard and link alike (without ``--shard``,
    ``--after-shards`` and ``--out``): the same flags and the same two paths everywhere, since
    the cache keys on them; the sdist fetched as ``builder_env.sdist_fetch`` says, for every farm."""
    args = ["wheel", "--flash-attn", entry.flash_attn]
    if entry.fa3 is not None:  # no index serves its archive: only a folder of sources does
        if not fetch.sources_dir:
            raise UsageError(
                f"entry {entry.id!r}: FlashAttention-3's source archive is on no index; put "
                f"flash_attn_3-{entry.flash_attn}.tar.gz (`fa-images source fa3`) in packages.sdists"
            )
        args += entry.fa3.arguments()
    else:
        args += ["--archs", ",".join(entry.archs)] + (["--ptx"] if entry.ptx else [])
        args += ["--label-archs"] if entry.gpu_class else []
    args += ["--sha256", entry.sdist_sha256] if entry.sdist_sha256 else []
    args += ["--sources-dir", fetch.sources_dir] if fetch.sources_dir else []
    args += ["--index-url", fetch.index_url] if entry.fa3 is None else []
    args += ["--expect-cuda", entry.cuda]
    args += ["--expect-cxx11-abi", str(entry.cxx11_abi).lower()] if entry.cxx11_abi is not None else []
    args += ["--compiler-cache", compiler_cache, "--work-dir", work_dir]
    return args
