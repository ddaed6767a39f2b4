"""``fa-images check``: an image's GPU check on this node, or the flash-attn installed here."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..builder.commands import check as builder_check
from ..run.gpus import resolve as resolve_gpus
from . import common

EXAMPLES = """\
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


def add(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check",
        help="run an image's GPU check on this node's GPU (pulls it first); no IMAGE: the check here",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("images", nargs="*", metavar="IMAGE", help="image references, e.g. ghcr.io/acme/flash-attn:TAG")
    common.pull_arg(check, default="missing", when="before the check", note="(default)", never="")
    common.gpus_arg(check, runtime="(default)", none="no GPU (the import only; the verdict is no GPU)")
    check.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")
    check.add_argument("--report", type=Path, metavar="FILE", help="also write that JSON object to FILE")
    check.add_argument("--import-only", action="store_true", help="without IMAGE: only the import check (no GPU)")
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    if not args.images:  # this machine's own check, as inside an image
        if args.json or args.report:
            raise UsageError("--json and --report go with IMAGE: the check here prints its lines")
        return builder_check.run(args)
    from ..run import connect, node_check
    from ..run.logger import Console

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
