"""``fa-images check``: an image's GPU check on this node, or the flash-attn installed here."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..builder.commands import check as builder_check
from ..run.gpus import resolve as resolve_gpus
from . import common

if TYPE_CHECKING:
    from ..outputs.signing import Signer
    from ..run.logger import Console
    from ..run.node_check import ImageCheck

EXAMPLES = """\
examples:
  fa-images check ghcr.io/acme/flash-attn:fa2.8.3-py3.12-torch2.9.1-cu128
                                   pull it if the engine lacks it, run its GPU check on this node's GPU
  fa-images check IMAGE1 IMAGE2 --pull always --json      every image, as one JSON object
  fa-images check IMAGE --gpus devices --report check.json  no NVIDIA Container Toolkit needed
  fa-images check IMAGE --verify keys/fa-images.pub
                                   refuse it unless signed by that key for the digest its tag names;
                                   show the GPU verdicts it carries; then pull and check that digest
  fa-images check IMAGE --verify keys/fa-images.pub --attest --sign-key keys/fa-images.key
                                   and add this node's verdict beside it, signed
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
families that can); 11 an image cannot be pulled (nothing was checked), or its registry cannot be
asked; 12 not an fa-images image (no fa-images labels, so no check of its own); 2 bad input (an
IMAGE that is not an image reference, a flag); 7 no engine. With --verify, before anything is
pulled: 13 not signed (no signature beside it in its registry), 14 no signature by this key (or an
attestation changed after it was signed), 15 a signature or attestation for another digest.
With several images, the worst: fail, then not fa-images, then wrong arch, then no GPU.
--json prints its object on every exit, with "exit_code" and "error".

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
    check.add_argument(
        "--verify",
        type=Path,
        metavar="KEY.pub",
        help="first require each image's signature by this public key (cosign's tags), then check that digest",
    )
    check.add_argument(
        "--attest",
        action="store_true",
        help="sign this node's GPU verdict and add it beside the image (needs --sign-key)",
    )
    check.add_argument("--sign-key", type=Path, metavar="KEY", help="the private key --attest signs with")
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    if not args.images:  # this machine's own check, as inside an image
        if args.json or args.report:
            raise UsageError("--json and --report go with IMAGE: the check here prints its lines")
        return builder_check.run(args)
    from ..outputs import signing
    from ..run import connect, node_check, node_signatures
    from ..run.logger import Console

    console = Console()
    description = "no engine reached"
    results: list[node_check.ImageCheck] = []
    failure: BaseException | None = None
    try:
        if args.import_only:
            raise UsageError("--import-only goes without IMAGE; an image's import is checked by its own CMD")
        if args.attest != (args.sign_key is not None):
            raise UsageError("--attest and --sign-key go together: the node's verdict is signed with that key")
        refs = node_check.checked_refs(args.images)  # before any engine call
        signer = signing.load_signer(args.sign_key) if args.sign_key else None
        access = resolve_gpus(args.gpus)
        verified = node_signatures.verify(refs, args.verify) if args.verify else []
        for found in verified:
            for line in found.lines():
                console.line(line)
        refs = [v.pinned for v in verified] or refs  # what runs is the digest that was verified
        engine = connect.engine()
        description = engine.describe()
        results = node_check.run(engine, refs, pull=args.pull, access=access, console=console)
        for result, found in zip(results, verified):
            result.verdicts = found.verdicts()
        if signer is not None:
            _attest(results, signer, console)
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


def _attest(results: list[ImageCheck], signer: Signer, console: Console) -> None:
    """Each image whose comparisons ran here gets this node's verdict beside it, signed."""
    from ..run import node_signatures

    for result in results:
        if result.comparisons is None:
            console.line(f"not attested: {result.image}: no comparisons ran here ({result.verdict})")
            continue
        tags = node_signatures.attest(result.image, result.comparisons, signer)
        console.line(f"attested: {result.image}: this node's verdict ({result.comparisons.gpu}) in {', '.join(tags)}")
