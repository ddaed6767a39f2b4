"""``fa-images keys create``: the key pair that signs what `build --sign-key` makes."""

from __future__ import annotations

import argparse
from pathlib import Path

EXAMPLES = """\
examples:
  fa-images keys create keys/                 keys/fa-images.key (0600) and keys/fa-images.pub
  FA_IMAGES_SIGNING_PASSWORD=... fa-images keys create keys/
                                              the private key encrypted with that password
  fa-images build --sign-key keys/fa-images.key
  fa-images inspect dist/WHEEL --verify keys/fa-images.pub

The keys are ECDSA P-256, the kind cosign makes: fa-images.pub is a PEM public key, which cosign
and containers/image (a sigstoreSigned policy's keyPath) read as they read cosign.pub. A key is
never replaced: create writes where none is. Keep fa-images.key out of images, logs and
repositories; give CI its bytes as a secret file.

Exit status: 0 written, 2 a key already there, or a directory that cannot be written.
"""


def add(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser(
        "keys",
        help="make the key pair that signs wheels' attestations (build --sign-key)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    action = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = action.add_parser(
        "create", help="write fa-images.key and fa-images.pub into DIR", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    create.add_argument("dir", type=Path, metavar="DIR")
    create.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..outputs import signing

    private, public = signing.create_keys(args.dir)
    encrypted = "encrypted with $" + signing.PASSWORD_ENV if signing.password_set() else "not encrypted"
    print(f"wrote {private} (private, 0600, {encrypted}) and {public} (public: give it to the nodes)")
    return 0
