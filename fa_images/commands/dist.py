"""``fa-images dist merge`` and ``dist site``: dist/ folders into one, and the index a site serves."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..builder import safe_io
from ..builder.wording import counted
from ..config.grammar import PUBLIC_URL_RULE
from ..run.logger import say

EXAMPLES = """\
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


def cmd_dist_merge(args: argparse.Namespace) -> int:
    from ..builder import dist
    from ..builder.untrusted import shown

    placed = dist.merge(args.sources, args.dist, log=lambda line: print(shown(line), file=sys.stderr))
    for path in placed:
        say(f"merged {path}")
    wheels = counted(len(dist.read_manifest(args.dist).wheels), "wheel")
    say(f"{args.dist}: {wheels}; index {args.dist / dist.SIMPLE}/")
    return 0


def cmd_dist_site(args: argparse.Namespace) -> int:
    from ..builder import published
    from ..config import grammar
    from ..errors import UsageError

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
    from ..builder import variants
    from ..config import compat as compat_mod
    from ..config import pick
    from ..outputs import node_page

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


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    dist = sub.add_parser(
        "dist", help="manage dist/: merge wheels built elsewhere", epilog=EXAMPLES, formatter_class=fmt
    )
    dist_sub = dist.add_subparsers(dest="dist_command", required=True, metavar="COMMAND")
    _add_dist_merge(dist_sub)
    _add_dist_site(dist_sub)


def _add_dist_merge(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    merge = sub.add_parser(
        "merge",
        help="verify wheels with their manifests and merge them into dist/",
        epilog=EXAMPLES,
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
        epilog=EXAMPLES,
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
