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
from .builder import argtypes, safe_io
from .builder import cli as builder_cli
from .builder.wording import counted
from .commands import pick as pick_command
from .commands import schema as schema_command
from .commands import source as source_command
from .config.grammar import BUILDER_CHOICES, PUBLIC_URL_RULE, PULL_POLICIES
from .run.gpus import MODES as GPU_MODES
from .run.gpus import resolve as resolve_gpus
from .run.logger import say

DESCRIPTION = """\
Build flash-attn wheels and images that are right for one exact Python, torch and CUDA.

  fa-images init                     write a commented starter matrix.yaml for this machine
  fa-images plan                     show what the matrix expands to
  fa-images render                   write dockerfiles/<id>.Dockerfile
  fa-images build                    build, check and export every entry (needs Docker)
  fa-images wheel --flash-attn 2.8.3 build a wheel natively, next to the installed torch
  fa-images inspect WHEEL            check a wheel: tags, extension, ABI, GPU archs, import
  fa-images doctor                   explain this machine: what is broken, what to build
  fa-images check IMAGE              pull an image and run its GPU check on this node's GPU
  fa-images pick g5                  the image and wheel a node takes, by its GPU or instance family
  fa-images schema                   the JSON schema of matrix.yaml, for editors
"""


PLAN_EXAMPLES = """\
examples:
  fa-images plan                         the entries of ./matrix.yaml, one line each
  fa-images plan --matrix ci.yaml --json a JSON array: id, python, torch, cuda, flash_attn, archs, image, ...

protected: the matrix and compat files are read as regular files, bounded (1 MiB, 64 levels,
100,000 values, UTF-8), and every value is checked against its grammar; nothing is written.
"""

RENDER_EXAMPLES = """\
examples:
  fa-images render                       write dockerfiles/<id>.Dockerfile for ./matrix.yaml
  fa-images render --out build/df       somewhere else
  fa-images render --check               exit 1 and name the files that are stale (for CI)

protected: every value is checked against its grammar before a file is written; DIR and each
<id>.Dockerfile are written atomically and never through a symlink (a planted link is an
error, not followed); nothing is ever deleted.
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


def _pull_arg(parser: argparse.ArgumentParser, *, default: str | None, when: str, note: str, never: str) -> None:
    """``--pull``, as ``build`` and ``check`` take it: when the images they start from are pulled."""
    parser.add_argument(
        "--pull",
        choices=PULL_POLICIES,
        default=default,
        help=f"when to pull the images, {when}: missing = those the engine lacks {note}, always = every one "
        f"(refreshes a moving tag), never = refuse a missing one (exit 3{'; ' + never if never else ''})",
    )


def _gpus_arg(parser: argparse.ArgumentParser, *, runtime: str, none: str) -> None:
    """``--gpus``, as ``build`` and ``check`` take it: how the GPU check's container gets the GPUs."""
    parser.add_argument(
        "--gpus",
        choices=GPU_MODES,
        default="runtime",
        help=f"how the GPU check's container gets the GPUs: runtime = the engine's NVIDIA Container Toolkit "
        f"{runtime}, devices = pass /dev/nvidia* and the host's driver libraries explicitly (no toolkit "
        f"needed; exit 3 if the host has none), none = {none}",
    )


def _load(args: argparse.Namespace):
    from .config import matrix

    return matrix.load(args.matrix, compat_override=args.compat)


def cmd_plan(args: argparse.Namespace) -> int:
    m = _load(args)
    entries = m.entries
    # What each rule of the matrix resolved to, and what the table has no build of: on stderr
    # with --json, whose stdout is the entries alone.
    notes = [f"matrix.{r.axis} {r} resolves to {', '.join(r.values)}" for r in m.rules]
    left_out = list(dict.fromkeys(f"left out {lo.combination}: {lo.reason}" for lo in m.left_out))
    for note in notes + left_out:
        say(note, out=sys.stderr if args.json else None)
    _warn_unfound_archives(m, entries)
    if args.json:
        print(json.dumps([e.summary() for e in entries], indent=2))
        return 0
    width = max(len(e.id) for e in entries)
    for e in entries:
        abi = {True: "new ABI", False: "old ABI", None: "ABI ?"}[e.cxx11_abi]
        covers = f"  for {', '.join(e.gpus)}" if e.gpus else ""
        archs = ",".join(e.archs) + ("+PTX" if e.ptx else "")  # PTX of the newest arch, for newer GPUs
        say(f"{e.id:<{width}}  archs {archs:<7} {abi:<8} {e.image}{covers}")
        if e.cuda_note:
            say(f"{'':<{width}}  {e.cuda_note}")
    for note in dict.fromkeys(note for e in entries for note in e.recipe.notes(e)):  # a group's once
        say(note)
    groups = len({e.compile_group for e in entries})
    also = f"; {counted(len(left_out), 'combination')} left out" if left_out else ""
    say(f"{counted(len(entries), 'entry')} in {counted(groups, 'compile group')} (entries that share kernels){also}")
    return 0


def _warn_unfound_archives(m, entries) -> None:
    """Entries a build and every export would refuse for a missing source archive, said now."""
    unfound = m.unfound_archives(entries)
    if unfound:
        lines = "; ".join(unfound)
        fix = "`fa-images source --help` says how to make it; packages.sdists: DIR finds it"
        count = counted(len(unfound), "entry")
        say(f"warning: {count} without a source archive, which build and the exports refuse: {lines} ({fix})",
            out=sys.stderr)  # fmt: skip


def _add_plan(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    plan = sub.add_parser(
        "plan", help="show the entries the matrix expands to", epilog=PLAN_EXAMPLES, formatter_class=fmt
    )
    _matrix_args(plan)
    plan.add_argument("--json", action="store_true", help="print a JSON array")
    plan.set_defaults(func=cmd_plan)


GPUS_EXAMPLES = """\
examples:
  fa-images gpus                         every GPU and AWS instance family, and the arch it needs
  fa-images gpus --matrix matrix.yaml    ... and which entries run on each; the GPUs none runs on
  fa-images gpus --json                  one object per GPU

A GPU runs a flash-attn 2 wheel that holds kernels of its major arch (sm_80 serves every 8.x GPU:
A10G on g5, L4 on g6, L40S on g6e), or PTX of an older arch. An instance family is a `target`
name as its GPU is (`target: [g5, g6e, g7e]`); aarch64 (Grace) families are listed, not built.
"""


def cmd_gpus(args: argparse.Namespace) -> int:
    from .config import compat as compat_mod
    from .config import fleet

    if args.matrix is not None:
        m = _load(args)
        table, entries = m.compat, m.entries
    else:
        table, entries = compat_mod.load(*([args.compat] if args.compat else [])), None
    rows = fleet.rows(table, entries)
    if args.json:
        print(json.dumps([r.summary() for r in rows], indent=2))
        return 0
    columns = "{:<12} {:<8} {:<17} {:<32} {}"
    say(
        columns.format(
            "GPU", "compute", "flash-attn 2 arch", "AWS instance families", "entries" if entries else ""
        ).rstrip()
    )
    for r in rows:
        families = ", ".join(f"{f} (aarch64, not built)" if f in r.aarch64 else f for f in r.families)
        runs = "" if r.runs is None else str(len(r.runs)) if r.arch else "-"
        say(columns.format(r.gpu, r.capability, r.need, families or "-", runs).rstrip())
    for name, gpus in sorted(table.targets.items()):
        say(f"target {name}: {', '.join(gpus)}")
    if entries is not None:
        covered, missed = fleet.families(rows)
        say(f"{args.matrix} runs on {', '.join(covered) or 'no instance family'}")
        if missed:
            say(f"and not on {', '.join(missed)} (the entries column says which GPUs)")
    return 0


def _add_gpus(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    gpus = sub.add_parser(
        "gpus",
        help="list the GPUs and AWS instance families, the arch each needs, and what a matrix covers",
        epilog=GPUS_EXAMPLES,
        formatter_class=fmt,
    )
    gpus.add_argument("--matrix", type=Path, metavar="FILE", help="also say which of its entries run on each GPU")
    gpus.add_argument(
        "--compat", type=Path, metavar="FILE", help="extra compatibility data merged over the built-in table"
    )
    gpus.add_argument("--json", action="store_true", help="print a JSON array, one object per GPU")
    gpus.set_defaults(func=cmd_gpus)


def cmd_render(args: argparse.Namespace) -> int:
    from .builder.untrusted import shown
    from .outputs import render

    m = _load(args)
    _warn_unfound_archives(m, m.entries)
    form = m.build.decide_builder(args.builder, host=None).form  # the files never depend on this host
    result = render.render_all(m, m.entries, args.out, check=args.check, builder=form)
    if args.check:  # the files found in --out are named escaped, newlines too: any name can be there
        for path in result.stale:
            say(f"stale: {shown(str(path))}")
        for path in result.extra:
            say(f"not in the matrix: {shown(str(path))}")
        if result.stale or result.extra:
            again = f"fa-images render --matrix {args.matrix}" + (f" --builder {args.builder}" if args.builder else "")
            again += f" --out {args.out}" if args.out != Path("dockerfiles") else ""
            say(f"{args.out} is out of date: run `{again}`", out=sys.stderr)
            return 1
        say(f"{args.out}: {counted(len(m.entries), 'Dockerfile')} up to date")
        return 0
    for path in result.written:
        say(f"wrote {path}")
    for path in result.extra:
        say(f"note: {shown(str(path))} is not rendered by this matrix; delete it if it is no longer wanted")
    say(f"{counted(len(m.entries), 'Dockerfile')} in {args.out} ({len(result.written)} changed)")
    return 0


def _add_render(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    render = sub.add_parser(
        "render", help="write one Dockerfile per entry", epilog=RENDER_EXAMPLES, formatter_class=fmt
    )
    _matrix_args(render)
    render.add_argument("--out", type=Path, default=Path("dockerfiles"), metavar="DIR", help="default: dockerfiles/")
    render.add_argument("--check", action="store_true", help="write nothing; exit 1 if DIR is stale")
    render.add_argument(
        "--builder",
        choices=("buildkit", "sdk"),
        help="the form to write: buildkit (RUN --mount: the torch venv mounted, not copied; a cache mount for "
        "the compiler cache) or sdk (no BuildKit syntax; the legacy builder builds it). Default: the form of the "
        "matrix's build.builder: sdk for sdk (and for auto with build.memory, which needs it), else buildkit, "
        "which auto takes on any Docker Engine whose CLI has it; the files never depend on this host",
    )
    render.set_defaults(func=cmd_render)


BUILD_EXAMPLES = """\
examples:
  fa-images build                             every entry of ./matrix.yaml; wheels in dist/
  fa-images build --only fa2.8.3-py3.12-torch2.9.1-cu128 --push
  fa-images build --dry-run                   print the plan, build nothing
  fa-images build --dry-run --json            the plan as JSON: steps, stages, the build, tags, checks, pushes
  fa-images build --report build.json --fail-fast
  fa-images build --wheels dist/ --push       images around the wheels in dist/ (built natively,
                                              on Slurm, by another job): no compile
  fa-images build --push --published https://ORG.github.io/REPO/
                                              on an empty CI runner: builds only what the published
                                              index and the registry do not hold already

First the base images: those the engine lacks are pulled (--pull; a line per layer and per image,
with the time taken; logins as for pushes), then each is checked in a short container for what
the build needs (python3.X with bases.python: system, nvcc of the entry's CUDA major on the devel
base), so a wrong base fails in seconds, not at a compile step. Then, for each entry: fetch and
sha256-check the sdist on the host, build the image in one build
(the wheel compiles in its builder stage, against the torch stage's venv), export and verify
the wheel into --dist, run the import check in a container (and the GPU check when the engine
has a GPU runtime), push. The runtime image is the torch stage (base, Python, torch: shared by
every entry with the same three) plus one layer with flash-attn, so an update pulls that layer.
Entries that differ only in Python (one `group` in `fa-images plan --json`) share a
compiler cache: the first compiles the kernels, the others take them from the cache.
An entry built, checked and exported from the same inputs by an earlier run is up to date and
not built again (--force rebuilds): its wheel in --dist or in the --published index, its image in
the engine or, when it is pushed, in the registry at the digest recorded. A wheel the --published
index serves is final (never replaced under its name): an entry that has one but is not up to date
(a new fa-images, a base pulled anew) gets its image made around that wheel, fetched and
verified, with no compile.
The engine is found as the docker SDK finds it (DOCKER_HOST, or /var/run/docker.sock).
Exit status: 0 when every selected entry succeeded, 1 when some failed, 2 bad input (the
matrix, a flag, a path), 3 the base images cannot be provided (a pull failed, --pull never and
one is missing, a base lacks the Python or nvcc the build needs), 4 the --published index
cannot be read, 7 no engine, 70 a bug in fa-images (please report it), 130 interrupted.
Re-run with --only to build just what is missing.

protected: dist/ (wheels, manifest.json, simple/) and --report are written atomically, never
through a symlink; sources are fetched bounded and sha256-checked on the host.
"""


def cmd_build(args: argparse.Namespace) -> int:
    from .run import session
    from .run.logger import Console
    from .run.plan import to_json

    if args.json and not args.dry_run:
        from .errors import UsageError

        raise UsageError("--json goes with --dry-run")
    m = _load(args)
    typed = session.BuildArgs.of(vars(args))
    if not args.dry_run:
        session.build(typed, m, Console())
        return 0
    decision, plans = session.dry_run(typed, m)  # nothing run, nothing written
    if args.json:
        print(to_json(plans))
        return 0
    say(f"builder: {decision.form} ({decision.why})")
    for p in plans:
        say("\n".join(p.describe()))  # escaped: it quotes --wheels paths
    return 0


def _add_build(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
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
    build.add_argument(
        "--wheels",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="make each image around a wheel that exists instead of compiling: wheel files, or directories "
        "of them such as dist/; each entry takes the one wheel for its version, Python, torch, CUDA and ABI, "
        "verified as a compiled one would be (exit 2 when an entry has none)",
    )
    build.add_argument(
        "--published",
        metavar="URL|DIR",
        help="where earlier runs published their results: a dist/ served over http(s) (its manifest.json and "
        "simple/ index), or a dist/ directory. An entry recorded there with the same inputs, whose wheel the "
        "index serves with the recorded sha256 and whose image the registry holds at the recorded digest "
        "(asked without pulling it; with --push), is up to date: not built, pulled or pushed again (the base "
        "images are pulled first, as for any build: the inputs digest holds their ids). A wheel published "
        "there for an entry is final: an entry not up to date has its image made around it, no compile",
    )
    build.add_argument("--no-check", dest="check", action="store_false", help="skip the container checks")
    build.add_argument("--fail-fast", action="store_true", help="stop at the first failed entry")
    build.add_argument(
        "--force",
        action="store_true",
        help="rebuild entries that are up to date (image and wheel built and checked from the same inputs)",
    )
    build.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="write the results as JSON, on every exit: the entries, the exit code and the error that ended the run",
    )
    build.add_argument("--keep-container", action="store_true", help="keep a failed check's container for debugging")
    build.add_argument(
        "--keep-work", action="store_true", help="keep each entry's build context for debugging (its path is logged)"
    )
    cache = build.add_mutually_exclusive_group()
    cache.add_argument(
        "--compiler-cache",
        type=Path,
        metavar="DIR",
        help="keep each compile group's compiler cache under DIR: entries that differ only in Python "
        "compile their kernels once (default: ~/.cache/fa-images/compiler-cache, or under $XDG_CACHE_HOME)",
    )
    cache.add_argument(
        "--no-compiler-cache",
        action="store_true",
        help="keep no compiler cache between builds: every entry compiles all its kernels",
    )
    _gpus_arg(build, runtime="(default; skipped without it)", none="skip the GPU check")
    _pull_arg(
        build,
        default=None,
        when="before any build",
        note="(default, or build.pull in the matrix)",
        never="for bases from `docker load` or a local tag. Pulls log in as pushes do",
    )
    build.add_argument(
        "--builder",
        choices=BUILDER_CHOICES,
        help="which builder makes the images: buildkit = BuildKit through the docker CLI (`docker buildx build`, "
        "or `DOCKER_BUILDKIT=1 docker build` where the CLI has it built in): the torch venv mounted, not "
        "copied, and the compiler cache a cache mount; sdk = the docker SDK's legacy builder (Podman, and "
        "build.memory); auto = BuildKit where the CLI has it and the engine is Docker's, else sdk (default, "
        "or build.builder in the matrix). The CLI and the SDK use one daemon: DOCKER_HOST, else the active context",
    )
    build.add_argument("--dry-run", action="store_true", help="print the plan and build nothing")
    build.add_argument(
        "--json",
        action="store_true",
        help="with --dry-run: the plan as JSON (per entry: steps, stages, the build, what is taken from its "
        "stages, tags, check commands, push)",
    )
    build.set_defaults(func=cmd_build)


DIST_EXAMPLES = """\
examples:
  fa-images dist merge artifacts/ --dist dist    wheels and manifests of several CI jobs, into one dist/
  pip install --no-deps --index-url file://$PWD/dist/simple flash-attn
  uv pip install --no-deps --find-links dist/ flash-attn
  fa-images dist site --out site --published https://ORG.github.io/REPO/ --wheel-url URL
                                                 the published index plus dist/'s new wheels, linked
                                                 at URL (a release's downloads); prints the files to
                                                 upload there (the wheels, their .metadata)

Each wheel is verified without an import (tag, metadata, ABI, archs) against the record in the
manifest.json beside it, then all are added to dist/ atomically, or none. dist/simple/ is a
PEP 503 index of dist/. `dist site` writes an index whose wheels live elsewhere (a release's
assets, which take files of 2 GB; a Pages site takes 1 GB in all): manifest.json and simple/,
each link absolute, each wheel's .metadata announced (PEP 658), the published wheels kept.
Exit status: 2 bad input, 4 the --published index cannot be read, 6 a wheel fails verification
or its sha256 conflicts with the wheel dist/ (or the published index) records under that name.

protected: a wheel's file name must parse as a flash-attn wheel with a linux platform tag and
no shell or control characters, and agree with its METADATA (name, version) and its record (its
size, and each text field in the grammar of what fa-images writes there); manifests and wheels
are read as regular files only (no FIFO or device), bounded, and wrongly typed or too deep JSON
is one error. dist/, simple/ and simple/<project> are never followed
through a symlink, and a stale simple/<project> loses only the page fa-images wrote there.
"""

EXPORT_EXAMPLES = """\
examples:
  fa-images export github --out .github/workflows/fa-images.yml --runs-on self-hosted --runs-on docker
  fa-images export github --push --registry-username-secret GHCR_USER --registry-password-secret GHCR_TOKEN
  fa-images export github --shards 8 --out .github/workflows/fa-images.yml
  fa-images export bake --out-dir bake && cd bake && docker buildx bake

With --shards N, each compile group's kernels are compiled by a matrix of N jobs (wheel --shard
I/N) in the entry's CUDA devel base as the job's container, each uploading its compiler cache and
shard record as an artifact; a link job per entry downloads them all into one cache, links and
verifies the wheel (wheel --after-shards, which names a shard that did not finish); the entry's
image is then built around that wheel (build --wheels, no compile). Needs indexes the jobs can
reach without credentials (a private index, a file:// URL or a host directory is refused).

protected: every flag, path and matrix value that reaches the workflow or the bake file is
checked against its grammar first: no newline, no ${{ }} or ${ }, runner labels and secret
names, --python a version, --install a plain pip target, --release a git tag that cannot be
read as an option. The only expressions in the workflow are the ones fa-images writes
(secrets references, !cancelled()). Files are written atomically, never through a symlink;
bake replaces or removes only the contexts it made itself (named in .fa-images-contexts).
"""


def cmd_dist_merge(args: argparse.Namespace) -> int:
    from .builder import dist
    from .builder.untrusted import shown

    placed = dist.merge(args.sources, args.dist, log=lambda line: print(shown(line), file=sys.stderr))
    for path in placed:
        say(f"merged {path}")
    wheels = counted(len(dist.read_manifest(args.dist).wheels), "wheel")
    say(f"{args.dist}: {wheels}; index {args.dist / dist.SIMPLE}/")
    return 0


def cmd_dist_site(args: argparse.Namespace) -> int:
    from .builder import published
    from .config import grammar
    from .errors import UsageError

    for flag, value in (("--wheel-url", args.wheel_url), ("--published", args.published)):
        problem = grammar.public_url(value) if value is not None else None
        if problem:
            raise UsageError(f"{flag}: {problem}")
    index = None
    if args.published:
        index, notes = published.PublishedIndex.read(args.published)
        for note in notes:
            print(note, file=sys.stderr)
    wheel_url = args.wheel_url if args.wheel_url.endswith("/") else args.wheel_url + "/"
    result = published.site(args.dist, args.out, wheel_url=wheel_url, published=index)
    from .builder import variants
    from .config import compat as compat_mod
    from .config import pick
    from .outputs import node_page

    # The front page: what each instance family and GPU takes, its lines on the site's own URL.
    page = node_page.render(compat_mod.load(), pick.from_dist(args.out), args.published or ".")
    safe_io.OutputDir(args.out, what="site directory").write_text("index.html", page)
    new = counted(
        len([p for p in result.uploads if p.suffix == ".whl" and p.parent.name != variants.FOLDER]), "new wheel"
    )
    # Every line through `say`, escaped: --out is a name from outside, as `dist merge`'s names are.
    say(f"{args.out}: {counted(result.wheels, 'wheel')}, {new}; upload to {wheel_url}:", out=sys.stderr)
    for path in result.uploads:  # stdout: the files to upload, one per line, for a script
        say(str(path))
    return 0


def cmd_export_github(args: argparse.Namespace) -> int:
    from .errors import UsageError
    from .outputs.exports import github, this_install

    m = _load(args)
    # The flags given, over those the file records (--check), over GithubOptions' own defaults.
    given = {
        "runs_on": tuple(args.runs_on) if args.runs_on else None,
        "merge_runs_on": tuple(args.merge_runs_on) if args.merge_runs_on else None,
        "timeout_minutes": args.timeout_minutes,
        "runner_cpus": args.runner_cpus,
        "runner_memory_gib": args.runner_memory,
        "python": args.python,
        "install": args.install,
        "push": args.push,
        "registry_username_secret": args.registry_username_secret,
        "registry_password_secret": args.registry_password_secret,
        "release": args.release,
        "shards": args.shards,
        "schedule": args.schedule,
        "published": args.published,
        "table": args.table,
    }
    recorded: dict = {}
    only: list[str] | None = None
    if args.check and args.out is not None:
        recorded, only = github.recorded_options(_current_text(args.out), str(args.out))
    settings = {**recorded, **{k: v for k, v in given.items() if v is not None}}
    if "install" not in settings:
        settings["install"] = this_install.this_fa_images(Path.cwd())
    opts = github.GithubOptions(matrix_file=str(args.matrix), **settings)
    if opts.schedule is not None and args.only:
        raise UsageError("--schedule takes no --only: a scheduled run builds what its plan holds")
    if opts.schedule is None and args.table:
        raise UsageError("--table goes with --schedule (the table a scheduled run refreshes)")
    text = github.render(m, m.select(args.only or only), opts)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    if args.check:
        if _current_text(args.out) != text:
            say(f"{args.out} is out of date: run `fa-images export github` with the same flags", out=sys.stderr)
            return 1
        say(f"{args.out}: up to date")
        return 0
    safe_io.write_file(args.out, text, what="--out")
    say(f"wrote {args.out}")
    return 0


def _current_text(path: Path) -> str | None:
    """A generated file as it is now; None when missing, a link, or not a small regular UTF-8 file."""
    from .builder import untrusted

    if path.is_symlink():
        return None
    try:
        return untrusted.read_file(path, limit=1 << 20).decode("utf-8")
    except (OSError, ValueError):
        return None


def cmd_export_bake(args: argparse.Namespace) -> int:
    from .outputs.exports import bake

    m = _load(args)
    opts = bake.BakeOptions(cache_from=tuple(args.cache_from or ()), cache_to=tuple(args.cache_to or ()))
    path = bake.export(m, m.select(args.only), args.out_dir, opts)
    say(f"wrote {path}; build with: cd {args.out_dir} && docker buildx bake")
    return 0


def cmd_export_slurm(args: argparse.Namespace) -> int:
    from .outputs.exports import slurm

    m = _load(args)
    opts = slurm.SlurmOptions(
        shards=args.shards,
        cpus=args.cpus,
        setup=args.setup,
        partition=args.partition,
        account=args.account,
        time=args.time,
        cache_dir=args.cache_dir,
        work_dir=args.work_dir,
        sources_dir=args.sources_dir,
        python=args.python,
    )
    paths = slurm.export(m, m.select(args.only), args.out_dir, opts)
    for path in paths:
        say(f"wrote {path}")
    say(f"submit with: {args.out_dir / 'submit.sh'} (the directory must be on storage every node shares)")
    return 0


def _add_dist(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    dist = sub.add_parser(
        "dist", help="manage dist/: merge wheels built elsewhere", epilog=DIST_EXAMPLES, formatter_class=fmt
    )
    dist_sub = dist.add_subparsers(dest="dist_command", required=True, metavar="COMMAND")
    _add_dist_merge(dist_sub)
    _add_dist_site(dist_sub)


def _add_dist_merge(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    merge = sub.add_parser(
        "merge",
        help="verify wheels with their manifests and merge them into dist/",
        epilog=DIST_EXAMPLES,
        formatter_class=fmt,
    )
    merge.add_argument("sources", nargs="+", type=Path, metavar="DIR", help="folders holding wheels and manifest.json")
    merge.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR", help="the dist/ to merge into")
    merge.set_defaults(func=cmd_dist_merge)


def _add_dist_site(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    site = sub.add_parser(
        "site",
        help="the published index with dist/'s wheels added, its links pointing where the wheels are uploaded",
        epilog=DIST_EXAMPLES,
        formatter_class=fmt,
    )
    site.add_argument("--dist", type=Path, default=Path("dist"), metavar="DIR", help="the new wheels (default: dist/)")
    site.add_argument(
        "--wheel-url",
        required=True,
        metavar="URL",
        help=f"where the new wheels and their .metadata files are uploaded: {PUBLIC_URL_RULE}, e.g. a "
        "release's https://github.com/ORG/REPO/releases/download/TAG/",
    )
    site.add_argument(
        "--published",
        metavar="URL",
        help=f"the index published so far (its manifest.json and simple/), {PUBLIC_URL_RULE}: its "
        "wheels stay, with their links",
    )
    site.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the site is written")
    site.set_defaults(func=cmd_dist_site)


def _add_export(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    export = sub.add_parser(
        "export",
        help="write the plan for another build farm (GitHub Actions, Slurm, buildx bake)",
        epilog=EXPORT_EXAMPLES,
        formatter_class=fmt,
    )
    export_sub = export.add_subparsers(dest="export_command", required=True, metavar="FORMAT")
    for add in (_add_export_github, _add_export_slurm, _add_export_bake):
        add(export_sub)


def _add_export_github(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    gh = sub.add_parser(
        "github",
        help="a GitHub Actions workflow: one build job per entry (or, with --shards, shard, link and image "
        "jobs), then a merge job",
        epilog=EXPORT_EXAMPLES,
        formatter_class=fmt,
    )
    _matrix_args(gh)
    gh.add_argument("--only", nargs="+", metavar="ID", help="just these entries")
    gh.add_argument("--out", type=Path, metavar="FILE", help="write here (default: print it)")
    gh.add_argument(
        "--check",
        action="store_true",
        help="with --out: write nothing; exit 1 if FILE is stale, made again with the flags FILE records "
        "(each flag given here replaces its recorded one)",
    )
    gh.add_argument(
        "--runs-on",
        action="append",
        metavar="LABEL",
        help="build job runner label, repeatable (default: ubuntu-latest)",
    )
    gh.add_argument(
        "--merge-runs-on", action="append", metavar="LABEL", help="merge job runner label (default: ubuntu-latest)"
    )
    gh.add_argument("--timeout-minutes", type=argtypes.positive, metavar="N", help="per build job (default: 360)")
    gh.add_argument(
        "--runner-cpus",
        type=argtypes.positive,
        metavar="N",
        help="the build runner's CPUs (default: GitHub's ubuntu-latest runner's): each job's compile, from "
        "flash-attn's measured kernel costs x its archs, must fit --timeout-minutes there",
    )
    gh.add_argument(
        "--runner-memory",
        type=argtypes.positive,
        metavar="GIB",
        help="the build runner's memory in GiB (default: GitHub's ubuntu-latest runner's); 5 GiB per nvcc job",
    )
    gh.add_argument("--python", metavar="X.Y", help="Python that runs fa-images on the runner (default: 3.11)")
    gh.add_argument(
        "--install",
        metavar="SPEC",
        help="what the jobs' pip installs to get fa-images (default: the fa-images writing it, pinned: "
        "git+URL@COMMIT from its install record, or fa-images==VERSION; `.` in fa-images's own repository)",
    )
    gh.add_argument(
        "--push", action="store_true", default=None, help="push the images, logging in with the two secrets below"
    )
    gh.add_argument(
        "--registry-username-secret",
        metavar="NAME",
        help="secret holding the registry user (default: REGISTRY_USERNAME)",
    )
    gh.add_argument(
        "--registry-password-secret", metavar="NAME", help="secret holding the registry token (default: REGISTRY_TOKEN)"
    )
    gh.add_argument(
        "--release", metavar="TAG", help="upload the merged wheels to this GitHub release (never replacing one)"
    )
    gh.add_argument(
        "--shards",
        type=argtypes.positive,
        metavar="N",
        help="split each compile group's kernels over a matrix of N jobs (wheel --shard I/N, 1 to 256) whose "
        "compiler caches travel as artifacts to a link job per entry (wheel --after-shards); images are then "
        "built around the linked wheels (build --wheels). Default: 1, each entry compiles in its build job",
    )
    gh.add_argument(
        "--schedule",
        metavar="CRON",
        help="a workflow that follows torch releases on this schedule (e.g. '17 4 * * 1'), and by hand: refresh "
        "--table and plan the matrix on it, build with --published what is new there (one job per entry of "
        "that plan), upload the new wheels to --release (default: wheels), publish the index (dist site) "
        "to the gh-pages branch, and open a pull request with the refreshed table",
    )
    gh.add_argument(
        "--published",
        metavar="URL",
        help="with --schedule: the URL the gh-pages branch is served at (GitHub Pages), e.g. "
        "https://ORG.github.io/REPO/",
    )
    gh.add_argument(
        "--table",
        metavar="FILE",
        help="with --schedule: the repository's compat table that each run refreshes (default: compat.yaml; "
        "made from the built-in table the first time)",
    )
    gh.set_defaults(func=cmd_export_github)


def _add_export_slurm(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    sl = sub.add_parser(
        "slurm",
        help="Slurm batch scripts: an array job per entry or per shard, then a job that links and merges",
        epilog=SLURM_EXAMPLES,
        formatter_class=fmt,
    )
    _matrix_args(sl)
    sl.add_argument("--only", nargs="+", metavar="ID", help="just these entries")
    sl.add_argument(
        "--out-dir",
        type=Path,
        default=Path("slurm"),
        metavar="DIR",
        help="where the scripts go and the jobs run; on shared storage (default: slurm/)",
    )
    sl.add_argument(
        "--shards",
        type=argtypes.positive,
        default=1,
        metavar="N",
        help="split each compile group's kernels over N array tasks (wheel --shard I/N), then link each entry "
        "from the shared cache (default: 1, one task per entry)",
    )
    sl.add_argument(
        "--cpus",
        type=argtypes.positive,
        default=16,
        metavar="N",
        help="CPUs per task (default: 16); the memory asked for follows the builder's sizing (about 5 GiB "
        "per nvcc thread)",
    )
    sl.add_argument(
        "--setup",
        default="",
        metavar="SHELL",
        help="one line of shell run per entry, after its FA_IMAGES_ENTRY, FA_IMAGES_PYTHON, FA_IMAGES_TORCH and "
        "FA_IMAGES_CUDA are set, e.g. 'module load cuda/$FA_IMAGES_CUDA; "
        "source /nfs/envs/py$FA_IMAGES_PYTHON/bin/activate'; "
        "written shell-quoted and run with eval (in the link job, in a subshell per entry)",
    )
    sl.add_argument("--partition", metavar="NAME", help="sbatch --partition")
    sl.add_argument("--account", metavar="NAME", help="sbatch --account")
    sl.add_argument("--time", default="4:00:00", metavar="LIMIT", help="sbatch --time per job (default: 4:00:00)")
    sl.add_argument(
        "--cache-dir",
        metavar="ABS_DIR",
        help="the compiler cache on shared storage, one subdir per compile group (default: cache/ in --out-dir)",
    )
    sl.add_argument(
        "--work-dir",
        default="/tmp/fa-images-slurm",
        metavar="ABS_DIR",
        help="node-local scratch, the same path on every node: shards and link must compile under one path "
        "(default: /tmp/fa-images-slurm)",
    )
    sl.add_argument(
        "--sources-dir",
        metavar="ABS_DIR",
        help="sdists for nodes without the index (wheel --sources-dir; default: the matrix's packages.sdists); "
        "else the jobs fetch from packages.flash_attn_index",
    )
    sl.add_argument(
        "--python", default="python", metavar="EXE", help="the Python with fa-images, after --setup (default: python)"
    )
    sl.set_defaults(func=cmd_export_slurm)


def _add_export_bake(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    bk = sub.add_parser(
        "bake", help="a docker-bake.json with each entry's build context", epilog=EXPORT_EXAMPLES, formatter_class=fmt
    )
    _matrix_args(bk)
    bk.add_argument("--only", nargs="+", metavar="ID", help="just these entries")
    bk.add_argument("--out-dir", type=Path, default=Path("bake"), metavar="DIR", help="default: bake/")
    bk.add_argument(
        "--cache-from", action="append", metavar="SPEC", help="e.g. type=registry,ref=REG/cache (repeatable)"
    )
    bk.add_argument("--cache-to", action="append", metavar="SPEC", help="e.g. type=registry,ref=REG/cache,mode=max")
    bk.set_defaults(func=cmd_export_bake)


SLURM_EXAMPLES = """\
examples:
  fa-images export slurm --out-dir /nfs/fa-build --shards 4 --cpus 16 --partition cpu \\
      --setup 'module load cuda/$FA_IMAGES_CUDA; source /nfs/envs/py$FA_IMAGES_PYTHON/bin/activate'
  /nfs/fa-build/submit.sh

Each compile group's kernels are split over 4 array tasks (16 CPUs and the memory the builder's
sizing needs for them, no GPU); a job after them links every entry from the shared compiler cache,
verifies it and merges the wheels into /nfs/fa-build/dist. A shard that failed or was killed
fails the link job with its name, and no wheel of that entry is made.

protected: partition, account, time and paths are checked against their grammar and written
bare; --setup is free text: written shell-quoted and run with eval, so it cannot change the
script around it. The scripts are written atomically into --out-dir, never through a symlink.
"""

DOCTOR_EXAMPLES = """\
examples:
  fa-images doctor                       this machine: torch, CUDA, ABI, GPUs, an installed flash-attn
  fa-images doctor --python .venv/bin/python --json
exit codes: 0 all is well, 1 something is broken (each reason printed with its fix)

protected: every probe runs in a child process: a Python that is missing or lies about itself,
a torch whose import exits quietly or has no version, and nvidia-smi lines of another shape are
reported as findings, never a crash; what they print is escaped before it reaches the terminal.
"""

COMPAT_EXAMPLES = """\
examples:
  fa-images compat refresh                       the built-in table, refreshed from PyPI and torch, into ./compat.yaml
  fa-images compat refresh --matrix matrix.yaml  ... into the file the matrix's compat: names
  fa-images compat refresh --out new.yaml --pypi https://mirror.local/simple
  fa-images compat refresh --json                what changed as one JSON object, for CI

It prints what changed against --table: each torch release and flash-attn sdist added or
removed, each release whose CUDA variants, C++ ABI, Pythons or default CUDA changed, then a count.
Exit status: 0 written, no release changed; {changed} written, and some changed (not an
error: CI can rebuild or open a pull request); 2 bad input (an index page, a flag, a hash that
disagrees), nothing written.

protected: index pages are read with a size cap (64 MiB) and a time cap, as UTF-8; a link must
keep its page's scheme and host (an https link may go to another host, as PyPI's do; never
file://). The new table is checked in full, its values written by a serializer, and renamed
over --out only then: a refusal or a failure leaves --out as it was. --out is never a link.
"""


INIT_EXAMPLES = """\
examples:
  fa-images init                         ./matrix.yaml for this machine's Python, torch and GPUs (as doctor sees them)
  fa-images init --target aws            the same Python and torch, for AWS G5/G6 (A10G, L4: arch 80)
  fa-images init --target H100 --out h100.yaml
  fa-images init --target g5 --target g6e --target g7e    an entry per GPU class: sm80 (g5, g6e), sm120 (g7e)
  fa-images init --target g5 --target g7e --one-image     one image for both (archs 80 and 120)
  fa-images init --flash-attn 3.0.0 --target H100         FlashAttention-3 (its build knobs commented)
  fa-images init --flash-attn 4.0.0b36 --target g6e --target p5    FlashAttention-4, an image per class
then: fa-images plan, fa-images build

Exit status: 0 written, 2 bad input (an unknown target, a file already there without --force, a
--flash-attn the torch or the target cannot have),
3 no entry fits this machine (doctor says why).

protected: the file is validated as `plan` would load it before it is written; it is written
only where no file is (--force replaces one, atomically), never through a symlink.
"""


def cmd_init(args: argparse.Namespace) -> int:
    from . import starter

    written = starter.write(
        args.out,
        force=args.force,
        python=args.python,
        targets=args.target,
        one_image=args.one_image,
        flash_attn=args.flash_attn,
    )
    say(written.torch_why)  # what it chose, and why: plan's reading of the file it wrote
    for e in written.entries:
        cuda = e.cuda_note or f"CUDA {e.cuda}, torch {e.torch}'s default"
        gpus = f"for {', '.join(e.gpus)}" if e.gpus else f"({written.archs_why})"
        say(f"{e.id}: {cuda}; archs {','.join(e.archs)} {gpus}")
    path = written.path
    say(f"wrote {path}; next: fa-images plan --matrix {path}, then fa-images build --matrix {path}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    return doctor.main(python=args.python, as_json=args.json)


def cmd_compat_refresh(args: argparse.Namespace) -> int:
    from .config import compat, compatgen, grammar
    from .errors import EXIT_TABLE_CHANGED, UsageError

    for name in ("pypi", "torch_index"):
        problem = grammar.index_url(getattr(args, name))
        if problem:
            raise UsageError(f"--{name.replace('_', '-')} {problem}")
    table = args.table or compat.DEFAULT_FILE
    out = args.out or args.table or _refreshed_table_file(args.matrix)
    package = Path(compat.__file__).resolve().parents[1]
    if out.resolve().is_relative_to(package):  # an upgrade of fa-images would undo it, silently
        raise UsageError(
            f"--out {out} is inside fa-images's installed package ({package}); fa-images never writes there",
            hint="write ./compat.yaml (the default) and name it with the matrix's compat: or --compat",
        )
    # The output's folder is checked before any index is asked; the text is validated in full
    # (compatgen.refresh) before it replaces the file, by a rename: a refusal leaves it as it was.
    target = safe_io.OutputDir(out.parent, what="--out's folder")
    if target.kind(out.name) not in (None, "file"):
        kind = {"dir": "directory", "link": "symlink"}.get(target.kind(out.name) or "", "special file")
        raise UsageError(f"--out {out} must be a file, not a {kind} (fa-images does not write through links)")
    result = compatgen.refresh(table, pypi=args.pypi, torch_index=args.torch_index, min_torch=args.min_torch)
    target.write_text(out.name, result.text)

    status = EXIT_TABLE_CHANGED if result.diff.changed else 0
    if args.json:  # json.dumps escapes every control character the indexes could send
        print(json.dumps({**result.diff.as_json(), "notes": result.notes, "wrote": str(out)}, indent=2))
        return status
    for line in [*result.notes, *result.diff.lines()]:  # they quote what the indexes published
        say(line)
    say(f"wrote {out}")
    return status


def _refreshed_table_file(matrix_file: Path | None) -> Path:
    """Where `compat refresh` writes by default: the matrix's compat: file, or ./compat.yaml."""
    from .config import matrix

    named = matrix.compat_file_of(matrix_file) if matrix_file else None
    return named or Path("compat.yaml")


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    doctor = sub.add_parser(
        "doctor",
        help="explain this machine: what flash-attn needs here, what is broken, what to build",
        epilog=DOCTOR_EXAMPLES,
        formatter_class=fmt,
    )
    doctor.add_argument("--python", default=sys.executable, metavar="PATH", help="the Python to examine")
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    doctor.set_defaults(func=cmd_doctor)


def _add_init(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    init = sub.add_parser(
        "init",
        help="write a commented starter matrix.yaml for this machine, or for a target",
        epilog=INIT_EXAMPLES,
        formatter_class=fmt,
    )
    init.add_argument("--out", type=Path, default=Path("matrix.yaml"), metavar="FILE", help="default: ./matrix.yaml")
    init.add_argument(
        "--target",
        action="append",
        metavar="NAME",
        help="an AWS instance family (g6e), a target of the compat table (aws) or a GPU (L4, H100, sm_90), not "
        "this machine's; again for a fleet: an entry per GPU class",
    )
    init.add_argument(
        "--one-image", action="store_true", help="with several --target: one entry for them all, not one per class"
    )
    init.add_argument("--python", default=sys.executable, metavar="PATH", help="the Python whose torch to build for")
    init.add_argument(
        "--flash-attn",
        metavar="VERSION",
        help="the flash-attn to build, which names its generation: 2.8.3, 3.0.0 (FlashAttention-3), 4.0.0b36 "
        "(FlashAttention-4); default: the newest flash-attn 2 the compat table knows for the torch",
    )
    init.add_argument("--force", action="store_true", help="replace FILE if it exists")
    init.set_defaults(func=cmd_init)


def _add_compat(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    from .errors import EXIT_TABLE_CHANGED

    compat_examples = COMPAT_EXAMPLES.format(changed=EXIT_TABLE_CHANGED)
    comp = sub.add_parser("compat", help="the compatibility table", epilog=compat_examples, formatter_class=fmt)
    comp_sub = comp.add_subparsers(dest="compat_command", required=True, metavar="COMMAND")
    refresh = comp_sub.add_parser(
        "refresh",
        help="refresh torch releases and flash-attn sdists from the indexes",
        epilog=compat_examples,
        formatter_class=fmt,
    )
    refresh.add_argument("--table", type=Path, metavar="FILE", help="the table to refresh (default: the built-in)")
    refresh.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="where to write it (default: over --table; for the built-in, the --matrix's compat: file, "
        "else ./compat.yaml; never inside the installed package)",
    )
    refresh.add_argument("--matrix", type=Path, metavar="FILE", help="write to the compat: file this matrix names")
    refresh.add_argument(
        "--pypi", default="https://pypi.org/simple", metavar="URL", help="a simple index (PEP 691 JSON or PEP 503 HTML)"
    )
    refresh.add_argument(
        "--torch-index", default="https://download.pytorch.org/whl", metavar="URL", help="torch's variant index"
    )
    refresh.add_argument("--min-torch", default="2.4.0", metavar="VERSION", help="the oldest torch to list")
    refresh.add_argument(
        "--json", action="store_true", help="what changed, the notes and the file written, as one JSON object"
    )
    refresh.set_defaults(func=cmd_compat_refresh)


CHECK_EXAMPLES = """\
examples:
  fa-images check ghcr.io/acme/flash-attn:fa2.8.3-py3.12-torch2.9.1-cu128
                                   pull it if the engine lacks it, run its GPU check on this node's GPU
  fa-images check IMAGE1 IMAGE2 --pull always --json      every image, as one JSON object
  fa-images check IMAGE --gpus devices --report check.json  no NVIDIA Container Toolkit needed
  fa-images check                  no IMAGE: the check of the flash-attn installed here (as in an image)

Each IMAGE is provided first (--pull, as `build` pulls its bases; logins from the client config,
as pushes), then its own GPU check runs in a container with this node's GPUs (--gpus, as `build`):
flash-attn's forward and backward against torch's SDPA, after the GPU's compute capability is
compared with the GPU code the image's extension carries. One line per image: the verdict, the GPU
and its arch, the image's flash-attn, torch and CUDA (from its labels), and the check's last word.

Verdicts and exit status, one code each: 0 pass; 1 fail (the check failed or could not run, or
--gpus devices passed GPUs the image cannot see); 3 no GPU (none visible in the container: --gpus
none, no GPU runtime, a GPU-less host; the import was checked); 8 wrong arch (this GPU cannot run
the image's code, e.g. an archs-80 image on an H100: the line names the GPUs and AWS instance
families that can); 11 an image cannot be pulled (nothing was checked); 12 not an fa-images image
(no fa-images labels, so no check of its own); 2 bad input (an IMAGE that is not an image
reference, a flag); 7 no engine. With several images, the worst: fail, then not fa-images, then
wrong arch, then no GPU. --json prints its object on every exit, with "exit_code" and "error".

protected: every IMAGE is checked against Docker's reference grammar before the engine sees it;
labels and output come from the image and are bounded and escaped before they are printed;
--report is written atomically, never through a symlink.
"""


def _add_check(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check",
        help="run an image's GPU check on this node's GPU (pulls it first); no IMAGE: the check here",
        epilog=CHECK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("images", nargs="*", metavar="IMAGE", help="image references, e.g. ghcr.io/acme/flash-attn:TAG")
    _pull_arg(check, default="missing", when="before the check", note="(default)", never="")
    _gpus_arg(check, runtime="(default)", none="no GPU (the import only; the verdict is no GPU)")
    check.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")
    check.add_argument("--report", type=Path, metavar="FILE", help="also write that JSON object to FILE")
    check.add_argument("--import-only", action="store_true", help="without IMAGE: only the import check (no GPU)")
    check.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from .errors import UsageError

    if not args.images:  # this machine's own check, as inside an image
        if args.json or args.report:
            raise UsageError("--json and --report go with IMAGE: the check here prints its lines")
        return builder_cli.cmd_check(args)
    from .run import connect, node_check
    from .run.logger import Console

    console = Console()
    description = "no engine reached"
    results: list[node_check.ImageCheck] = []
    failure: BaseException | None = None
    try:
        if args.import_only:
            raise UsageError("--import-only goes without IMAGE; an image's import is checked by its own CMD")
        refs = node_check.checked_refs(args.images)  # before any engine call
        access = resolve_gpus(args.gpus)
        engine = connect.engine()
        description = engine.describe()
        results = node_check.run(engine, refs, pull=args.pull, access=access, console=console)
    except BaseException as exc:  # a bad reference, no engine, a pull that failed: --json and the report say so
        failure = exc
        if args.json:
            print(node_check.to_json(results, description, failure))
        raise
    finally:
        if args.report:
            node_check.write_report(args.report, results, description, failure)
    if args.json:
        print(node_check.to_json(results, description))
    else:
        for result in results:
            print(result.line())
    return node_check.worst(results)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fa-images", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fa-images {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_plan,
        _add_gpus,
        _add_render,
        _add_build,
        _add_dist,
        _add_export,
        _add_doctor,
        _add_init,
        _add_compat,
        source_command.add,
        pick_command.add,
        schema_command.add,
    ):
        add(sub)
    builder_cli.add_commands(sub, check=False)
    _add_check(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return builder_cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
