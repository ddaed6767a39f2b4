"""The ``fa-images`` command line.

Heavy modules (jinja2, yaml, the docker SDK) are imported inside the commands that need
them, so ``fa-images wheel`` also runs where only torch and packaging are installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .builder import cli as builder_cli

DESCRIPTION = """\
Build flash-attn wheels and images that are right for one exact Python, torch and CUDA.

  fa-images plan                     show what the matrix expands to
  fa-images render                   write dockerfiles/<id>.Dockerfile
  fa-images build                    build, check and export every entry (needs Docker)
  fa-images wheel --flash-attn 2.8.3 build a wheel natively, next to the installed torch
  fa-images inspect WHEEL            check a wheel: tags, extension, ABI, GPU archs, import
"""


PLAN_EXAMPLES = """\
examples:
  fa-images plan                         the entries of ./matrix.yaml, one line each
  fa-images plan --matrix ci.yaml --json a JSON array: id, python, torch, cuda, flash_attn, archs, image, ...
"""

RENDER_EXAMPLES = """\
examples:
  fa-images render                       write dockerfiles/<id>.Dockerfile for ./matrix.yaml
  fa-images render --out build/df       somewhere else
  fa-images render --check               exit 1 and name the files that are stale (for CI)
"""


def _matrix_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--matrix",
        type=Path,
        default=Path("matrix.yaml"),
        metavar="FILE",
        help="the build matrix (default: ./matrix.yaml)",
    )
    parser.add_argument(
        "--compat",
        type=Path,
        metavar="FILE",
        help="extra compatibility data merged over the built-in table (new torch releases, GPUs)",
    )


def _load(args: argparse.Namespace):
    from . import matrix

    return matrix.load(args.matrix, compat_override=args.compat)


def cmd_plan(args: argparse.Namespace) -> int:
    entries = _load(args).entries
    if args.json:
        print(json.dumps([e.summary() for e in entries], indent=2))
        return 0
    width = max(len(e.id) for e in entries)
    for e in entries:
        abi = {True: "new ABI", False: "old ABI", None: "ABI ?"}[e.cxx11_abi]
        print(f"{e.id:<{width}}  archs {','.join(e.archs):<7} {abi:<8} {e.image}")
    print(f"{len(entries)} entries")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from . import render

    m = _load(args)
    result = render.render_all(m, m.entries, args.out, check=args.check)
    if args.check:
        for path in result.stale:
            print(f"stale: {path}")
        for path in result.extra:
            print(f"not in the matrix: {path}")
        if result.stale or result.extra:
            print(f"{args.out} is out of date: run `fa-images render --matrix {args.matrix}`", file=sys.stderr)
            return 1
        print(f"{args.out}: {len(m.entries)} Dockerfiles up to date")
        return 0
    for path in result.written:
        print(f"wrote {path}")
    for path in result.extra:
        print(f"note: {path} is not rendered by this matrix; delete it if it is no longer wanted")
    print(f"{len(m.entries)} Dockerfiles in {args.out} ({len(result.written)} changed)")
    return 0


BUILD_EXAMPLES = """\
examples:
  fa-images build                             every entry of ./matrix.yaml; wheels in dist/
  fa-images build --only fa2.8.3-py3.12-torch2.9.1-cu128 --push
  fa-images build --dry-run                   print the plan, build nothing
  fa-images build --report build.json --fail-fast

For each entry: fetch and sha256-check the sdist on the host, build the image (the wheel
compiles in its builder stage), export and verify the wheel into --dist, run the import
check in a container (and the GPU check when the engine has a GPU runtime), push.
The engine is found as the docker SDK finds it (DOCKER_HOST, or /var/run/docker.sock).
Exit status: 0 when every selected entry succeeded, 1 when some failed, 2 bad input,
7 no engine, 130 interrupted. Re-run with --only to build just what is missing.
"""


def cmd_build(args: argparse.Namespace) -> int:
    from . import plan as plan_mod
    from .engine import DockerEngine
    from .errors import EntriesFailed, UsageError
    from .executor import Executor, Options
    from .logger import Console
    from .report import print_summary, write_report

    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run")
    m = _load(args)
    plans = plan_mod.make_plan(m.select(args.only), check=args.check, push=args.push)
    if args.dry_run:
        if args.json:
            print(plan_mod.to_json(plans))
        else:
            for p in plans:
                print(f"{p.entry.id}: {' -> '.join(p.steps)}")
        return 0
    console = Console()
    engine = DockerEngine.from_env()
    description = engine.describe()
    console.line(f"engine: {description}")
    options = Options(
        dist=args.dist, log_dir=args.log_dir, fail_fast=args.fail_fast, keep_container=args.keep_container
    )
    executor = Executor(engine, m, options, console)
    try:
        executor.run(plans)
    except KeyboardInterrupt:
        console.line("interrupted: finished wheels are in place; rerun with --only for the rest")
        raise
    finally:
        if executor.results:
            print_summary(console, executor.results)
            if args.report:
                write_report(args.report, executor.results, description)
    if any(r.status != "ok" for r in executor.results):
        raise EntriesFailed("some entries failed; see the summary above")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fa-images", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fa-images {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter
    plan = sub.add_parser(
        "plan", help="show the entries the matrix expands to", epilog=PLAN_EXAMPLES, formatter_class=fmt
    )
    _matrix_args(plan)
    plan.add_argument("--json", action="store_true", help="print a JSON array")
    plan.set_defaults(func=cmd_plan)

    render = sub.add_parser(
        "render", help="write one Dockerfile per entry", epilog=RENDER_EXAMPLES, formatter_class=fmt
    )
    _matrix_args(render)
    render.add_argument("--out", type=Path, default=Path("dockerfiles"), metavar="DIR", help="default: dockerfiles/")
    render.add_argument("--check", action="store_true", help="write nothing; exit 1 if DIR is stale")
    render.set_defaults(func=cmd_render)

    build = sub.add_parser(
        "build",
        help="build, check, export and push the images (needs a container engine)",
        epilog=BUILD_EXAMPLES,
        formatter_class=fmt,
    )
    _matrix_args(build)
    build.add_argument("--only", nargs="+", metavar="ID", help="build just these entries (ids from `fa-images plan`)")
    build.add_argument(
        "--dist", type=Path, default=Path("dist"), metavar="DIR", help="where wheels go (default: dist/)"
    )
    build.add_argument(
        "--log-dir",
        type=Path,
        default=Path("logs"),
        metavar="DIR",
        help="full build log of each entry (default: logs/)",
    )
    build.add_argument("--push", action="store_true", help="push each image after its checks pass")
    build.add_argument("--no-check", dest="check", action="store_false", help="skip the container checks")
    build.add_argument("--fail-fast", action="store_true", help="stop at the first failed entry")
    build.add_argument("--report", type=Path, metavar="FILE", help="write the results as JSON")
    build.add_argument("--keep-container", action="store_true", help="keep a failed check's container for debugging")
    build.add_argument("--dry-run", action="store_true", help="print the plan and build nothing")
    build.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    build.set_defaults(func=cmd_build)

    builder_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return builder_cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
