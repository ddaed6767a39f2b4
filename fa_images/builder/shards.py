"""One cold compile over several machines: ``wheel --shard I/N`` and the final run after them.

A shard compiles the I-th of N subsets of the kernels (the ``.cu`` sources) into a compiler
cache that every machine shares, and makes no wheel. The subsets are balanced by the cost
model (``compile_costs.json``), longest first: each kernel goes to the shard with the least
expected work so far (LPT), so N machines finish close to ``sum / N``. The final ``wheel`` run
(``--after-shards DIR``) takes every kernel from that cache, compiles the Python-specific part
(``flash_api.cpp``, which is never sharded), links and verifies.

Every shard and the final run must see the same paths wherever they reach a cache key: they
run in the same fixed-name work dir (``compiler_cache.STABLE_WORK_NAME``) under the same
``--work-dir``, as two Pythons of a compile group do.

Each shard that finishes writes ``shard-I-of-N.json`` into its ``--out``; the final run refuses
to link unless all N are there and were built from the same inputs, so a killed shard fails the
link with its name instead of a slow recompile or a wheel nobody asked for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import safe_io, untrusted
from .errors import BuildFailed, UsageError
from .settings import BuildSettings

MAX_SHARDS = 1000  # far above any cluster's use; bounds the records the final run reads
_SHARD = re.compile(r"([1-9][0-9]{0,3})/([1-9][0-9]{0,3})", re.ASCII)
_RECORD = re.compile(r"shard-([1-9][0-9]{0,3})-of-([1-9][0-9]{0,3})\.json", re.ASCII)
KERNEL_SUFFIX = ".cu"  # what a shard compiles; the C++ sources include Python.h and stay with the link


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as users and Slurm array tasks count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def record_name(self) -> str:
        return f"shard-{self.index}-of-{self.count}.json"


def parse_shard(text: str) -> Shard:
    """'2/3' -> Shard(2, 3); 1 <= I <= N <= MAX_SHARDS, or a ValueError that says why."""
    match = _SHARD.fullmatch(text.strip())
    if not match:
        raise ValueError(f"--shard {text!r} is not I/N (two whole numbers from 1, e.g. 2/3)")
    index, count = int(match.group(1)), int(match.group(2))
    if count > MAX_SHARDS:
        raise ValueError(f"--shard {text!r}: at most {MAX_SHARDS} shards")
    if index > count:
        raise ValueError(f"--shard {text!r}: shard {index} of {count} does not exist (I must be 1 to N)")
    return Shard(index, count)


def require_compiler_cache(shard: Shard | None, after_shards: Path | None, cache_dir: Path | None) -> None:
    """A shard's kernels reach the final run only through the shared compiler cache: the one place
    ``--shard`` and ``--after-shards`` are refused without ``--compiler-cache`` (the CLI and compile_wheel)."""
    if (shard or after_shards) and not cache_dir:
        flag = "--shard" if shard else "--after-shards"
        raise UsageError(f"{flag} needs --compiler-cache: the kernels reach the final run through it")


def partition(sources: Sequence[str], count: int, cost) -> list[list[str]]:
    """``sources`` in ``count`` subsets of near-equal expected cost, each in longest-first order.

    ``cost(source)`` is the expected seconds. Longest first, each to the lightest subset so far
    (ties to the lowest index): deterministic, so every shard and the final run agree on it.
    """
    ordered = sorted(sources, key=lambda s: -cost(s))  # stable: equal costs keep their order
    loads = [0.0] * count
    subsets: list[list[str]] = [[] for _ in range(count)]
    for source in ordered:
        lightest = min(range(count), key=lambda i: (loads[i], i))
        subsets[lightest].append(source)
        loads[lightest] += cost(source)
    return subsets


def kernels_of(sources: Sequence[str], shard: Shard, cost) -> list[str]:
    """The kernels shard ``shard`` compiles out of an extension's ``sources``."""
    kernels = [s for s in sources if s.endswith(KERNEL_SUFFIX)]
    return partition(kernels, shard.count, cost)[shard.index - 1]


def inputs_of(settings: BuildSettings) -> dict:
    """What a shard's kernels were compiled from: the final run must match all of it."""
    return {
        "flash_attn": settings.flash_attn,
        "sdist_sha256": settings.sha256,
        "torch": settings.torch,
        "cuda": settings.cuda,
        "cxx11_abi": settings.cxx11_abi,
        "archs": list(settings.archs),
        "ptx": settings.ptx,
    }


@dataclass(frozen=True)
class ShardRecord:
    index: int
    count: int
    kernels: tuple[str, ...]
    inputs: dict

    def to_json(self) -> str:
        data = asdict(self)
        data["kernels"] = list(self.kernels)
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_record(out_dir: Path, shard: Shard, kernels: Sequence[str], settings: BuildSettings) -> Path:
    """``shard-I-of-N.json`` in ``out_dir``, written atomically: present only once the shard is done."""
    record = ShardRecord(shard.index, shard.count, tuple(kernels), inputs_of(settings))
    return safe_io.OutputDir(out_dir, what="--out").write_text(shard.record_name, record.to_json())


def _read_record(path: Path) -> dict:
    data = untrusted.parse_json(untrusted.read_file(path, limit=1 << 20, what="shard record"), what=str(path))
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict):
        raise BuildFailed(f"{path} is not a shard record of fa-images")
    return data


def check_shards_done(shards_dir: Path, settings: BuildSettings) -> int:
    """The number of shards, once every one of them finished from these inputs; else BuildFailed.

    A killed or failed shard leaves no record (it is written last, atomically).
    """
    try:
        names = sorted(p.name for p in shards_dir.iterdir())
    except OSError as exc:
        raise BuildFailed(
            f"--after-shards {shards_dir}: {exc.strerror}; no shard finished there, so nothing to link"
        ) from None
    found = {(int(m.group(1)), int(m.group(2))) for m in map(_RECORD.fullmatch, names) if m}
    counts = {count for _i, count in found}
    if not counts:
        raise BuildFailed(f"--after-shards {shards_dir}: no shard-I-of-N.json; no shard finished, nothing to link")
    if len(counts) > 1:
        raise BuildFailed(f"--after-shards {shards_dir} mixes shard counts {sorted(counts)}; use one dir per split")
    (count,) = counts
    missing = [i for i in range(1, count + 1) if (i, count) not in found]
    if missing:
        which = ", ".join(f"{i}/{count}" for i in missing)
        raise BuildFailed(
            f"shard {which} did not finish (no {', '.join(Shard(i, count).record_name for i in missing)} in "
            f"{shards_dir}): it failed or was killed; see its log. No wheel was built"
        )
    expected = inputs_of(settings)
    for index in range(1, count + 1):
        path = shards_dir / Shard(index, count).record_name
        inputs = _read_record(path)["inputs"]
        if inputs != expected:
            differ = sorted(k for k in set(inputs) | set(expected) if inputs.get(k) != expected.get(k))
            raise BuildFailed(
                f"shard {index}/{count} was built from other inputs than this run ({', '.join(differ)} differ, "
                f"{path}); its kernels cannot be linked here. No wheel was built"
            )
    return count
