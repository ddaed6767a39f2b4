"""``fa-images source fa3``: FlashAttention-3's source archive from clones of flash-attention and cutlass."""

from __future__ import annotations

import argparse
from pathlib import Path

GENERATION_NAME = "FlashAttention-3"

EXAMPLES = """\
examples:
  git clone https://github.com/Dao-AILab/flash-attention fa && git clone https://github.com/NVIDIA/cutlass
  fa-images source fa3 --flash-attention fa --cutlass cutlass --out sources/
  fa-images source fa3 --flash-attention fa --commit e2743ab5 --cutlass cutlass --out sources/

FlashAttention-3 is not on PyPI, and flash-attn's sdists hold none of its CUDA sources. This
writes its source archive, flash_attn_3-VERSION.tar.gz, from two local clones: flash-attention's
hopper/ and README.md at --commit, and cutlass's include/ at the commit that --commit records for
its csrc/cutlass submodule (so that commit must be in the cutlass clone). The same commits give
the same tar, byte for byte; it prints the tar's sha256, the pin compat.yaml's flash_attn_3
holds (the built-in table pins 3.0.0). Put the archive in the matrix's packages.sdists: builds
take it from there, check the pin, and download nothing.
"""


def run(args: argparse.Namespace) -> int:
    from packaging.version import Version

    from ...builder import safe_io
    from ...builder.generations import fa3
    from ...config import compat as compat_mod
    from ...config.generations import fa3 as fa3_host

    pins = fa3_host.releases(compat_mod.load())
    commit = args.commit or pins[max(pins, key=Version)].flash_attention
    path, sha = fa3.make_archive(
        flash_attention=args.flash_attention, commit=commit, cutlass=args.cutlass, out=safe_io.OutputDir(args.out)
    )
    version = path.name.removeprefix("flash_attn_3-").removesuffix(".tar.gz")
    pinned = pins.get(version)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    print(f"sha256 of the tar inside: {sha}")
    if pinned is None:
        print(f"FlashAttention-3 {version} is not in the built-in table: add it under flash_attn_3 (--compat FILE)")
    elif pinned.sha256 == sha:
        print(f"matches the built-in pin of FlashAttention-3 {version}")
    else:
        print(f"differs from the built-in pin of FlashAttention-3 {version} ({pinned.sha256}): another commit")
    return 0


def add(src_sub: argparse._SubParsersAction) -> None:
    fa3 = src_sub.add_parser(
        "fa3",
        help="FlashAttention-3's archive from clones of flash-attention and cutlass",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fa3.add_argument("--flash-attention", type=Path, required=True, metavar="DIR", help="a clone of flash-attention")
    fa3.add_argument(
        "--commit",
        metavar="REV",
        help="its commit (default: that of the newest FlashAttention-3 the built-in table pins)",
    )
    fa3.add_argument(
        "--cutlass", type=Path, required=True, metavar="DIR", help="a clone of cutlass holding the submodule's commit"
    )
    fa3.add_argument(
        "--out", type=Path, default=Path("sources"), metavar="DIR", help="where the archive goes (default: sources/)"
    )
    fa3.set_defaults(func=run)
