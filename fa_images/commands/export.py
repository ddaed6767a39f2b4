"""``fa-images export github|slurm|bake``: the plan in other build farms' formats."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..builder import argtypes, safe_io
from ..run.logger import say
from . import common

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


def cmd_export_github(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..outputs.exports import github, this_install

    m = common.load(args)
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
        "sign": args.sign,
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
    from ..builder import untrusted

    if path.is_symlink():
        return None
    try:
        return untrusted.read_file(path, limit=1 << 20).decode("utf-8")
    except (OSError, ValueError):
        return None


def cmd_export_bake(args: argparse.Namespace) -> int:
    from ..outputs.exports import bake

    m = common.load(args)
    opts = bake.BakeOptions(cache_from=tuple(args.cache_from or ()), cache_to=tuple(args.cache_to or ()))
    path = bake.export(m, m.select(args.only), args.out_dir, opts)
    say(f"wrote {path}; build with: cd {args.out_dir} && docker buildx bake")
    return 0


def cmd_export_slurm(args: argparse.Namespace) -> int:
    from ..outputs.exports import slurm

    m = common.load(args)
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


def add(sub: argparse._SubParsersAction) -> None:
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
    common.matrix_args(gh)
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
        "--sign",
        choices=["keyless"],
        default=None,
        help="sign in the workflow with the job's OIDC identity (cosign keyless): each pushed image, its SBOM, "
        "provenance and GPU verdict, and the merged wheels; the jobs get id-token: write",
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
    common.matrix_args(sl)
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
    common.matrix_args(bk)
    bk.add_argument("--only", nargs="+", metavar="ID", help="just these entries")
    bk.add_argument("--out-dir", type=Path, default=Path("bake"), metavar="DIR", help="default: bake/")
    bk.add_argument(
        "--cache-from", action="append", metavar="SPEC", help="e.g. type=registry,ref=REG/cache (repeatable)"
    )
    bk.add_argument("--cache-to", action="append", metavar="SPEC", help="e.g. type=registry,ref=REG/cache,mode=max")
    bk.set_defaults(func=cmd_export_bake)
