"""``fa-images init``: a commented starter matrix.yaml (starter.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..run.logger import say

EXAMPLES = """\
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


def run(args: argparse.Namespace) -> int:
    from .. import starter

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


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    init = sub.add_parser(
        "init",
        help="write a commented starter matrix.yaml for this machine, or for a target",
        epilog=EXAMPLES,
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
    init.set_defaults(func=run)
