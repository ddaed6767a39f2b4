"""``fa-images pick``: the image tag and the pip and uv lines a node takes, by its GPU."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..builder.contract import EXIT_WRONG_ARCH
from ..builder.errors import EnvironmentProblem, FatalError, UsageError
from ..builder.wording import counted
from ..run.logger import say

if TYPE_CHECKING:
    from ..config.pick import Node, Offer
    from ..run.attested import Standing

EXAMPLES = """\
examples:
  fa-images pick g5                        what an AWS G5 node (A10G) takes from ./matrix.yaml's build
  fa-images pick L40S --dist dist          ... from the wheels a dist/ holds, each with its image
  fa-images pick g6 --published https://acme.github.io/fa/   ... from a published site (dist site's)
  fa-images pick p5 --index-url https://acme.github.io/fa/   with the URL dist/ is served at
  fa-images pick --here --python 3.12 --torch 2.9.1   this node's GPU (nvidia-smi), its Python and torch
  fa-images pick sm_89 --json              one JSON object: the node and every offer that runs there
  fa-images pick p5 --dist dist --verify keys/fa-images.pub
                                           offers with a signed, passing GPU verdict on the node's
                                           compute capability first (the wheel's bundle, the image's .att)

A node is named by its AWS instance family (g5, g6e, p5), its GPU (A10G, H100, RTX PRO 6000) or
its compute capability (sm_89, 8.9). It takes each entry whose kernels run on its GPU, and its
wheel from the index of its GPU class (dist/sm80/simple/ where dist/ holds several classes):
pip and uv rank local labels as text, so from dist/simple/ every node would take the newest
class's wheel. The lines pin the exact wheel, to install next to the torch the node has.

exit codes: 0 offers found, 2 bad input (an unknown GPU, a dist/ without wheels), 3 --here with
no GPU visible, 8 nothing runs on that GPU (the error names the GPUs that do).
"""


@dataclass(frozen=True, kw_only=True)
class PickArgs:
    """``pick``'s settings, typed; the parser's defaults are these."""

    nodes: tuple[str, ...]
    here: bool = False
    matrix: Path = Path("matrix.yaml")
    compat: Path | None = None
    dist: Path | None = None
    published: str | None = None
    index_url: str | None = None
    python: str | None = None
    torch: str | None = None
    json: bool = False
    verify: Path | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> PickArgs:
        return cls(
            nodes=tuple(args.nodes),
            here=args.here,
            matrix=args.matrix,
            compat=args.compat,
            dist=args.dist,
            published=args.published,
            index_url=args.index_url,
            python=args.python,
            torch=args.torch,
            json=args.json,
            verify=args.verify,
        )


def add(sub: argparse._SubParsersAction) -> None:
    pick = sub.add_parser(
        "pick",
        help="the image and wheel a node takes, by its GPU, AWS instance family or --here",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pick.add_argument("nodes", nargs="*", metavar="NODE", help="an instance family (g6e), a GPU (L40S) or sm_89")
    pick.add_argument("--here", action="store_true", help="this node's GPUs, as nvidia-smi lists them")
    source = pick.add_mutually_exclusive_group()
    source.add_argument(
        "--matrix",
        type=Path,
        default=PickArgs.matrix,
        metavar="FILE",
        help="the matrix a build makes (default: %(default)s)",
    )
    source.add_argument("--dist", type=Path, metavar="DIR", help="the wheels a dist/ holds, instead of a matrix")
    source.add_argument(
        "--published", metavar="URL", help="the wheels a published site serves (dist site's), instead of a matrix"
    )
    pick.add_argument(
        "--compat", type=Path, metavar="FILE", help="extra compatibility data merged over the built-in table"
    )
    pick.add_argument(
        "--index-url",
        metavar="URL",
        help="where dist/ is served, its top (default: --dist DIR, else ./dist, as a file:// URL); no login",
    )
    pick.add_argument("--python", metavar="X.Y", help="only the entries of this Python")
    pick.add_argument("--torch", metavar="X.Y.Z", help="only the entries of this torch")
    pick.add_argument("--json", action="store_true", help="print one JSON object")
    pick.add_argument(
        "--verify",
        type=Path,
        metavar="KEY.pub",
        help="with --dist: rank first the offers whose signed GPU verdicts passed on the node's compute capability",
    )
    pick.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    from ..builder import untrusted
    from ..builder.gpuarch import visible_gpus
    from ..builder.published import PublishedIndex
    from ..config import compat as compat_mod
    from ..config import grammar, matrix, pick

    args = PickArgs.of(namespace)
    if bool(args.nodes) == args.here:
        raise UsageError("name the node (g6e, L40S, sm_89) or give --here, one of the two")
    if args.index_url is not None and (problem := grammar.url_without_login(args.index_url, why="it is printed")):
        raise UsageError(f"--index-url {problem}")
    found = visible_gpus() if args.here else []
    if args.here and not found:
        raise EnvironmentProblem("--here: no NVIDIA GPU visible (nvidia-smi lists none, or there is no driver)")
    if args.dist is not None:
        table = compat_mod.load(*([args.compat] if args.compat else []))
        offers = pick.from_dist(args.dist)
    elif args.published is not None:
        if problem := grammar.public_url(args.published):
            raise UsageError(f"--published {problem}")
        table = compat_mod.load(*([args.compat] if args.compat else []))
        site, _notes = PublishedIndex.read(args.published)
        offers = pick.from_manifest(site.manifest, untrusted.shown_url(args.published))
    else:
        loaded = matrix.load(args.matrix, compat_override=args.compat)
        table, offers = loaded.compat, pick.from_entries(loaded.entries)
    base = args.index_url or args.published or (args.dist or Path("dist")).resolve().as_uri()
    names = list(args.nodes)
    if args.here:  # each GPU by the table's name its nvidia-smi name holds, else its capability
        names = list(dict.fromkeys(pick.named(table, name, f"{major}.{minor}") for name, (major, minor) in found))
    nodes = [pick.node(table, name) for name in dict.fromkeys(names)]
    picks = [(at, pick.pick(offers, at, python=args.python, torch=args.torch)) for at in nodes]
    standings = _standings(args, picks)
    picks = [(at, _ranked(chosen, at, standings)) for at, chosen in picks]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        **vars(at),
                        "families": list(at.families),
                        "offers": [_summary(o, at, base, standings) for o in chosen],
                    }
                    for at, chosen in picks
                ],
                indent=2,
            )
        )
    else:
        for at, chosen in picks:
            if chosen:
                say(f"{at.describe()}: {counted(len(chosen), 'offer')}")
            for offer in chosen:
                say(f"  {offer.entry}")
                if offer.entry in standings:
                    say(f"    {'verdict':<11} {standings[offer.entry].line(at.capability)}")
                for what, line in offer.lines(base).items():
                    say(f"    {what:<11} {line}")
    empty = [at for at, chosen in picks if not chosen]
    if empty:
        narrowed = " of Python " + args.python if args.python else ""
        narrowed += " and torch " + args.torch if args.torch else ""
        source = str(args.dist or args.published or args.matrix)
        raise NothingRuns(
            f"nothing in {source}{narrowed} runs on {', '.join(at.describe() for at in empty)}",
            hint=f"its entries run on {pick.nearest(offers, table)}",
        )
    return 0


def _standings(args: PickArgs, picks: list[tuple[Node, list[Offer]]]) -> dict[str, Standing]:
    """With --verify: what the signed verdicts say of each offer picked (entry id -> its standing)."""
    if args.verify is None:
        return {}
    if args.dist is None:
        raise UsageError("--verify goes with --dist: the wheels' bundles are read beside them")
    from ..outputs import signing
    from ..run import attested

    key = signing.load_public(args.verify)  # once: a bad key is one error, before any offer
    offers = {o.entry: o for _at, chosen in picks for o in chosen}
    return {e: attested.standing(args.dist, o.wheel, o.image, o.pushed, key) for e, o in offers.items()}


def _ranked(chosen: list[Offer], at: Node, standings: dict[str, Standing]) -> list[Offer]:
    """Offers with a signed passing verdict on the node's capability first, then signed ones, then the rest."""
    if not standings:
        return chosen

    def rank(offer: Offer) -> int:
        found = standings[offer.entry]
        return 2 if found.problem else 0 if found.passed_on(at.capability) else 1

    return sorted(chosen, key=rank)


def _summary(offer: Offer, at: Node, base: str, standings: dict[str, Standing]) -> dict:
    said = offer.summary(base)
    if offer.entry in standings:
        said["verdict"] = standings[offer.entry].line(at.capability)
    return said


class NothingRuns(FatalError):
    """No offer runs on the node's GPU: the code ``check`` gives an image of another arch."""

    exit_code = EXIT_WRONG_ARCH
