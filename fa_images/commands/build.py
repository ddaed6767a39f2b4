"""``fa-images build``: the images and wheels of a matrix, checked, exported and pushed (run/session.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config.grammar import BUILDER_CHOICES
from ..run.build_args import BuildArgs
from ..run.logger import say
from . import common

EXAMPLES = """\
examples:
  fa-images build                             every entry of ./matrix.yaml; wheels in dist/
  fa-images build --only fa2.8.3-py3.12-torch2.9.1-cu128 --push
  fa-images build --dry-run                   print the plan, build nothing
  fa-images build --dry-run --json            the plan as JSON: steps, stages, the build, tags, checks, pushes
  fa-images build --report build.json --fail-fast
  fa-images build --sign-key keys/fa-images.key
                                              beside each wheel, dist/WHEEL.intoto.jsonl: its SBOM,
                                              provenance and GPU verdict, each signed (DSSE)
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

Signing (--sign-key, an ECDSA P-256 key as `fa-images keys create` and cosign make; encrypted
with $FA_IMAGES_SIGNING_PASSWORD where it is): after its checks, each entry's wheel gets three
in-toto statements about its sha256, each in a DSSE envelope, one a line in dist/WHEEL.intoto.jsonl:
a CycloneDX SBOM (its files and their hashes, the torch it was built against), SLSA provenance
(the entry, the sdist's and the bases' digests, the builder, fa-images, the times) and, where the
GPU check ran its comparisons, its verdict (GPU, arch, driver, each comparison and its bound).
`fa-images inspect WHEEL --verify KEY.pub` checks them on a node. With --statements DIR the same
statements are written unsigned (DIR/ENTRY/wheel/ and DIR/ENTRY/image/: sbom.json,
provenance.json, gpu-verdict.json, each a predicate as `cosign attest --predicate` takes it, and
`subject`, what they are about), for a signer of the CI's own: `export github --sign keyless`
signs them with the job's OIDC identity. Without either, nothing is signed, and the run says so.

protected: dist/ (wheels, manifest.json, simple/) and --report are written atomically, never
through a symlink; sources are fetched bounded and sha256-checked on the host.
"""


def run(args: argparse.Namespace) -> int:
    from ..run import session
    from ..run.logger import Console
    from ..run.plan import to_json

    if args.json and not args.dry_run:
        from ..errors import UsageError

        raise UsageError("--json goes with --dry-run")
    m = common.load(args)
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


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    # A flag not given stays out of the namespace: its default is BuildArgs's, the one place it lives.
    build = sub.add_parser(
        "build",
        help="build, check, export and push the images (needs a container engine)",
        epilog=EXAMPLES,
        formatter_class=fmt,
        argument_default=argparse.SUPPRESS,
    )
    common.matrix_args(build)
    build.add_argument("--only", nargs="+", metavar="ID", help="build just these entries (ids from `fa-images plan`)")
    build.add_argument("--dist", type=Path, metavar="DIR", help=f"where wheels go (default: {BuildArgs.dist}/)")
    build.add_argument(
        "--log-dir",
        type=Path,
        metavar="DIR",
        help=f"full build log of each entry (default: {BuildArgs.log_dir}/)",
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
    build.add_argument(
        "--sign-key",
        type=Path,
        metavar="KEY",
        help="sign each wheel's SBOM, provenance and GPU verdict with this private key (see Signing below)",
    )
    build.add_argument(
        "--statements",
        type=Path,
        metavar="DIR",
        help="also write the statements unsigned into DIR/ENTRY/{wheel,image}/, for cosign attest (keyless CI)",
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
    common.gpus_arg(
        build, runtime="(default; skipped without it)", none="skip the GPU check", default=argparse.SUPPRESS
    )
    common.pull_arg(
        build,
        default=argparse.SUPPRESS,
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
    build.add_argument("--dry-run", action="store_true", default=False, help="print the plan and build nothing")
    build.add_argument(
        "--json",
        action="store_true",
        default=False,
        help="with --dry-run: the plan as JSON (per entry: steps, stages, the build, what is taken from its "
        "stages, tags, check commands, push)",
    )
    build.set_defaults(func=run)
