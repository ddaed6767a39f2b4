"""Command line of the builder: ``wheel``, ``inspect`` and ``check``.

The same parsers serve ``python -m fa_images.builder`` inside images and ``fa-images``
on the host (which mounts them with ``add_commands``), so the two cannot drift.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from . import argtypes, build, compiler_cache, environment, generations, gpucheck, scratch, source
from .errors import EnvironmentProblem, FatalError, UsageError
from .settings import parse_archs
from .shards import Shard, parse_shard, require_compiler_cache
from .timeline import Timeline
from .untrusted import shown
from .verify import inspect_wheel

WHEEL_EXAMPLES = """\
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

INSPECT_EXAMPLES = """\
examples:
  fa-images inspect dist/flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp312-cp312-linux_x86_64.whl
  fa-images inspect WHEEL --archs 80,90 --json

The import check loads the wheel's compiled extension next to torch: that runs code from
the wheel. Inspect a wheel you do not trust with --no-import (tags, metadata, ABI and GPU
archs are read from the files without running anything), or in a throwaway container.

Exit status: 0 when the wheel is sound, 1 with every reason when it is not, 2 when the
file is not a readable wheel.

protected: the wheel is read as a regular file only (never a FIFO or device); the extension
is extracted bounded by its declared and its real size; its name, METADATA and symbols are
printed escaped. A --python that is missing or lies is a finding, not a crash.
"""


def _archs(text: str) -> tuple[str, ...]:
    try:
        return parse_archs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shard(text: str) -> Shard:
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None


def add_commands(sub: argparse._SubParsersAction, *, check: bool = True) -> None:
    """``check=False``: the host mounts its own ``check`` (images on a node, or this machine's check)."""
    fmt = argparse.RawDescriptionHelpFormatter
    wheel = sub.add_parser(
        "wheel",
        help="build a flash-attn wheel here, right for the installed torch",
        epilog=WHEEL_EXAMPLES,
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
        type=_archs,
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
    wheel.set_defaults(func=cmd_wheel)
    for gen in generations.GENERATIONS:  # the commands a generation adds (compiling ahead)
        gen.steps().add_commands(sub)

    insp = sub.add_parser(
        "inspect",
        help="check that a wheel is sound: tags, extension, ABI, GPU archs, import",
        epilog=INSPECT_EXAMPLES,
        formatter_class=fmt,
    )
    insp.add_argument("wheel", type=Path)
    insp.add_argument("--archs", type=_archs, metavar="LIST", help="require cubins for these archs")
    insp.add_argument(
        "--python",
        default=sys.executable,
        metavar="EXE",
        help="interpreter whose torch the import check uses (default: this one)",
    )
    insp.add_argument(
        "--no-import",
        dest="import_check",
        action="store_false",
        help="skip the import check: importing a wheel runs its code, so use this for a wheel you do not trust",
    )
    insp.add_argument("--json", action="store_true")
    insp.set_defaults(func=cmd_inspect)

    if not check:
        return
    parser = sub.add_parser(
        "check",
        help="import flash-attn and compare it with SDPA on the GPU",
        description=gpucheck.__doc__,
        formatter_class=fmt,
    )
    parser.add_argument("--import-only", action="store_true", help="only the import check (no GPU needed)")
    parser.set_defaults(func=cmd_check)


def cmd_wheel(args: argparse.Namespace) -> int:
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
    knobs, archs = _generation_args(args)
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


def _generation_args(args: argparse.Namespace) -> tuple[dict | None, tuple[str, ...]]:
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


def cmd_inspect(args: argparse.Namespace) -> int:
    report = inspect_wheel(args.wheel, expect_archs=args.archs, python=args.python, import_check=args.import_check)
    print(report.to_json() if args.json else "\n".join(report.lines()))
    return 0 if report.ok else 1


def cmd_check(args: argparse.Namespace) -> int:
    return gpucheck.run(import_only=args.import_only)


def _terminate(signum: int, _frame: object) -> None:
    # SystemExit unwinds through every ``finally``: scratch dirs and containers are removed.
    raise SystemExit(128 + signum)


# Input fa-images refuses without a FatalError of its own: a path of the wrong kind (OSError),
# a value no parser accepts, JSON nested past the stack (RecursionError).
INPUT_ERRORS = (OSError, ValueError, RecursionError)
# Any other exception is a bug in fa-images: shown with its traceback, and this exit code.
INTERNAL_ERROR = 70
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EIO}
REPORT_BUG = "this is a bug in fa-images, not in your input: please report it with the command line and the traceback"


def run_command(args: argparse.Namespace) -> int:
    """Runs a parsed command: the one boundary between fa-images and its user.

    A FatalError is one ``error:`` line and its exit code. An OSError, ValueError or
    RecursionError that no check turned into one is still a problem with the input (a path that
    is a directory, a file that cannot be read, a value no parser takes): one ``error:`` line,
    exit 2 (3 when the machine ran out of room). Anything else is a bug: its traceback, a
    request to report it, exit 70. Every line is escaped: messages quote untrusted text."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except FatalError as exc:
        _say(f"error: {_one_error(str(exc))}")
        return exc.exit_code
    except BrokenPipeError:  # our reader went away (`| head`): end quietly, as Unix tools do
        for stream in (sys.stdout, sys.stderr):
            silence(stream)
        return 128 + signal.SIGPIPE
    except RecursionError:
        _say("error: the input nests too deeply to be read")
        return UsageError.exit_code
    except OSError as exc:
        _say(f"error: {_one_error(_os_error(exc))}")
        return EnvironmentProblem.exit_code if exc.errno in _NO_SPACE else UsageError.exit_code
    except ValueError as exc:
        _say(f"error: {_one_error(str(exc) or type(exc).__name__)}")
        return UsageError.exit_code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception:
        _say(traceback.format_exc().rstrip())
        _say(f"internal error: {REPORT_BUG}")
        return INTERNAL_ERROR


def exit_code_of(exc: BaseException) -> int:
    """The exit code ``run_command`` ends with for ``exc``: for a record (``build --report``)
    written before the exception reaches it."""
    if isinstance(exc, FatalError):
        return exc.exit_code
    if isinstance(exc, SystemExit):  # SIGTERM (_terminate) and sys.exit
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, BrokenPipeError):
        return 128 + signal.SIGPIPE
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return EnvironmentProblem.exit_code
    if isinstance(exc, INPUT_ERRORS):
        return UsageError.exit_code
    return INTERNAL_ERROR


def _one_error(message: str) -> str:
    """The error line and the indented lines fa-images puts under it (a hint, a list, a tail); any
    other newline came from input (a path, a value) and is shown escaped, so it cannot fake a line."""
    return re.sub(r"\n(?!  )", r"\\n", message)


def _os_error(exc: OSError) -> str:
    """'cannot use PATH: Is a directory', from an OSError that names its file."""
    if exc.filename is not None and exc.strerror:
        return f"cannot use {exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def silence(stream: object) -> None:
    """Points a closed pipe's descriptor at /dev/null, so later writes and the exit flush are quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())  # type: ignore[attr-defined]
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _say(line: str) -> None:
    try:
        print(shown(line, keep_newlines=True), file=sys.stderr, flush=True)
    except BrokenPipeError:
        silence(sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fa_images.builder", description=__doc__)
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))
