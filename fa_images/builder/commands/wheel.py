"""``wheel``: a flash-attn wheel built here, right for the installed torch, verified before it is kept."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .. import argtypes, build, compiler_cache, environment, generations, scratch, source
from ..errors import UsageError
from ..settings import parse_archs
from ..shards import Shard, parse_shard, require_compiler_cache
from ..timeline import Timeline

EXAMPLES = """\
examples:
  fa-images wheel --flash-attn 2.8.3 --archs 80 --out dist/
      build for A10G/L4/A100 (sm_86 and sm_89 run the sm_80 kernels)
  fa-images wheel --sdist flash_attn-2.8.3.tar.gz --archs 80,90 --ptx --out dist/
  fa-images wheel --flash-attn 2.8.3 --archs 90 --compiler-cache /shared/cache --work-dir /scratch \\
      --shard 2/3 --out /shared/shards      one of three machines' part of the kernels (no wheel)
  fa-images wheel --flash-attn 2.8.3 --archs 90 --compiler-cache /shared/cache --work-dir /scratch \\
      --after-shards /shared/shards --out dist/     link: every kernel from the cache
  fa-images wheel --flash-attn 2.6.3 --archs 90 --out dist/ --prepare-only --json
      fetch, unpack and show the settings without compiling (no GPU, no nvcc needed)

The ABI define comes from the torch installed here (torch._C._GLIBCXX_USE_CXX11_ABI);
MAX_JOBS/NVCC_THREADS are sized from the memory this process may really use (~5 GB per
nvcc thread), so an OOM kill does not waste the build.

protected: the sdist is read as a regular file and sha256-checked; an index page is read with
a size and time cap and its links must keep its scheme and host (never file://); the sdist
unpacks into a fresh directory, regular files only; --out gets the wheel, manifest.json and
simple/ atomically, never through a symlink.
"""


def archs(text: str) -> tuple[str, ...]:
    try:
        return parse_archs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shard(text: str) -> Shard:
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    wheel = sub.add_parser(
        "wheel",
        help="build a flash-attn wheel here, right for the installed torch",
        epilog=EXAMPLES,
        formatter_class=fmt,
    )
    what = wheel.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--flash-attn",
        metavar="VERSION",
        help="fetch this version's sdist from the index; a generation whose source is a pinned archive (made "
        "by `fa-images source`) finds it in --sources-dir",
    )
    what.add_argument(
        "--sdist", type=Path, metavar="PATH", help="build this local sdist, or a source archive `fa-images source` made"
    )
    wheel.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the wheel and manifest.json go")
    wheel.add_argument(
        "--archs",
        type=archs,
        metavar="LIST",
        help="flash-attn 2 archs, e.g. 80 or 80,90 (default: 80); a later generation compiles for archs of its own",
    )
    wheel.add_argument("--ptx", action="store_true", help="also embed PTX of the newest arch, for future GPUs")
    wheel.add_argument(
        "--label-archs",
        action="store_true",
        help="name the archs in the wheel's +label (+cu128torch2.9cxx11abitrue.sm120): one wheel per GPU class "
        "of one torch, side by side in one index",
    )
    wheel.add_argument(
        "--max-jobs", type=argtypes.positive, metavar="N", help="parallel compile jobs (default: sized from memory)"
    )
    wheel.add_argument(
        "--nvcc-threads",
        type=argtypes.positive,
        metavar="N",
        help="threads per nvcc (default: one per arch; nvcc parallelizes over archs only)",
    )
    wheel.add_argument("--sha256", metavar="HEX", help="require the sdist to have this sha256")
    wheel.add_argument(
        "--index-url",
        default=source.PYPI_SIMPLE,
        metavar="URL",
        help="package index (PEP 691) for --flash-attn; user:token@ in the URL is used, never printed",
    )
    wheel.add_argument(
        "--sources-dir",
        type=Path,
        metavar="DIR",
        help="look here for flash_attn-VERSION.tar.gz before the index (offline builds)",
    )
    wheel.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="make the scratch dir (unpacked source, objects) under DIR instead of the temp dir; "
        "it is removed when the command ends (kept with --keep-work, and after a --prepare-only)",
    )
    wheel.add_argument(
        "--compiler-cache",
        type=Path,
        metavar="DIR",
        help="run nvcc through sccache with its cache in DIR: a build for another Python of the same "
        "flash-attn, torch, CUDA and archs takes every kernel from there and compiles only the "
        "Python-specific part (needs sccache on PATH; the scratch dir gets a fixed name)",
    )
    shard = wheel.add_mutually_exclusive_group()
    shard.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="compile only the I-th of N subsets of the kernels (balanced by compile_costs.json, longest "
        "first) into --compiler-cache, and make no wheel: --out gets shard-I-of-N.json once it is done. "
        "Run N of them on N machines with one shared cache and the same --work-dir, then one run with "
        "--after-shards",
    )
    shard.add_argument(
        "--after-shards",
        type=Path,
        metavar="DIR",
        help="the final run after the shards: refuse (exit 5) unless every shard-I-of-N.json is in DIR "
        "and was built from these inputs, then take every kernel from --compiler-cache, compile the "
        "Python-specific part, link and verify",
    )
    wheel.add_argument(
        "--keep-work", action="store_true", help="keep the scratch dir for debugging (its path is printed)"
    )
    wheel.add_argument(
        "--expect-cxx11-abi",
        type=argtypes.boolean,
        metavar="BOOL",
        help="fail unless the installed torch uses this ABI (guards the torch variant)",
    )
    wheel.add_argument("--expect-cuda", metavar="X.Y", help="fail unless the installed torch is built for this CUDA")
    wheel.add_argument(
        "--allow-untested", action="store_true", help="try versions outside " + str(source.SUPPORTED_FLASH_ATTN)
    )
    wheel.add_argument(
        "--prepare-only",
        action="store_true",
        help="fetch, unpack and prepare; do not compile; the work dir is kept, and the source in it named",
    )
    wheel.add_argument("--json", action="store_true", help="with --prepare-only: print the settings as JSON")
    for gen in generations.GENERATIONS:  # each generation's own settings, as flags
        gen.steps().add_wheel_flags(wheel)
    wheel.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json and not args.prepare_only:
        raise UsageError("--json goes with --prepare-only")
    if args.prepare_only and args.compiler_cache and args.work_dir is None:
        # The cache's work dir has one fixed name (compiler_cache); kept in the default parent, it
        # would stop every later cached build there. A --work-dir of its own keeps it out of their way.
        raise UsageError(
            "--prepare-only keeps its work dir, and with --compiler-cache that dir has the one name every build uses",
            hint="give it a --work-dir of its own, or prepare without --compiler-cache",
        )
    require_compiler_cache(args.shard, args.after_shards, args.compiler_cache)
    if args.work_dir is not None:
        try:
            args.work_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--work-dir {args.work_dir} cannot be a directory: {exc.strerror}") from None

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    timeline = Timeline()  # from here: the phases of this build, logged at its end
    knobs, archs = generation_args(args)
    torch = environment.probe_torch()  # once for both steps: each probe imports torch
    timeline.mark("torch probe")

    # A compiler cache keys on the source's path: the same one on every build (compiler_cache).
    kind, fixed = (compiler_cache.STABLE_WORK_NAME, True) if args.compiler_cache else ("wheel", False)
    # --prepare-only keeps what it prepared (the source, the fetched sdist): its output names them.
    log: Callable[[str], None] = (lambda _: None) if args.prepare_only else say  # it says so itself, below
    with scratch.scratch_dir(
        kind, parent=args.work_dir, keep=args.keep_work, keep_on_success=args.prepare_only, fixed_name=fixed, log=log
    ) as work:
        settings = build.prepare(
            version=args.flash_attn,
            sdist=args.sdist,
            work_dir=work,
            archs=archs,
            ptx=args.ptx,
            max_jobs=args.max_jobs,
            nvcc_threads=args.nvcc_threads,
            sha256=args.sha256,
            index_url=args.index_url,
            sources_dir=args.sources_dir,
            allow_untested=args.allow_untested,
            expect_cxx11_abi=args.expect_cxx11_abi,
            expect_cuda=args.expect_cuda,
            torch=torch,
            timeline=timeline,
            knobs=knobs,
            label_archs=args.label_archs,
        )
        for warning in settings.warnings:
            say(f"warning: {warning}")
        if args.prepare_only:
            say(f"kept the work dir: {work} (the prepared source and its sdist; remove it when done)")
            print(settings.to_json() if args.json else f"prepared {settings.source_dir}")
            return 0
        build.compile_wheel(
            settings,
            args.out,
            cache_dir=args.compiler_cache and args.compiler_cache.resolve(),
            shard=args.shard,
            after_shards=args.after_shards,
            torch=torch,
            timeline=timeline,
        )
    return 0


def generation_args(args: argparse.Namespace) -> tuple[dict | None, tuple[str, ...]]:
    """(the generation's knobs, the archs to compile) from its flags, each refused before anything is
    probed where the generation cannot take it, and another generation's flags refused."""
    gen = (
        generations.of_version(args.flash_attn, untested=args.allow_untested)
        if args.flash_attn is not None
        else generations.of_archive(args.sdist.name)
    )
    for other in generations.GENERATIONS:
        given = [f"--{flag.replace('_', '-')}" for flag in other.steps().FLAGS if getattr(args, flag, None) is not None]
        if other is not gen and given:
            raise UsageError(f"{', '.join(given)}: for a {other.name} build, not {gen.name}")
    return gen.steps().from_flags(args)
