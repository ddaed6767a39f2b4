"""The published site's front page: for each AWS instance family and each GPU, what a node of it
takes (its image tag, its index, the pip and uv lines), as ``fa-images pick`` says it."""

from __future__ import annotations

import html

from ..config import pick
from ..config.compat import Compat, gpu_key

_STYLE = (
    "body{font-family:sans-serif;margin:2em}td,th{border-bottom:1px solid #ccc;padding:.3em .6em;vertical-align:top}"
)


def render(compat: Compat, offers: list[pick.Offer], base: str) -> str:
    """The page, every value escaped; ``base``: the site's URL (or a relative one)."""
    families = [name for name, i in sorted(compat.instances.items()) if i.cpu == "x86_64"]
    with_family = {gpu_key(compat.instances[f].gpu) for f in families}
    nodes = [pick.node(compat, f) for f in families]
    nodes += [pick.node(compat, gpu) for gpu in sorted(compat.gpus) if gpu not in with_family]
    rows = []
    for at in nodes:
        chosen = pick.pick(offers, at)
        if not chosen:
            rows.append(_row(at.asked, at.describe(), [("-", "nothing here runs on it")]))
            continue
        cells = [
            (o.entry, "<br>".join(f"<code>{html.escape(line)}</code>" for line in o.lines(base).values()))
            for o in chosen
        ]
        rows.append(_row(at.asked, at.describe(), cells))
    body = "\n".join(rows)
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>flash-attn: what each node takes</title>\n'
        f"<style>{_STYLE}</style>\n</head>\n<body>\n<h1>flash-attn: what each node takes</h1>\n"
        f"<p>The one index: <code>{html.escape(base.rstrip('/'))}/simple/</code>; a GPU class's own: "
        "<code>&lt;class&gt;/simple/</code>. On a node, <code>fa-images pick --here</code> says the same.</p>\n"
        "<table>\n<tr><th>node</th><th>GPU</th><th>entry</th><th>image, pip and uv</th></tr>\n"
        f"{body}\n</table>\n</body>\n</html>\n"
    )


def _row(name: str, gpu: str, cells: list[tuple[str, str]]) -> str:
    """One node's rows: its name and GPU once, then each entry and its lines (HTML already)."""
    span = len(cells)
    first, *rest = cells
    head = (
        f'<tr><td rowspan="{span}">{html.escape(name)}</td><td rowspan="{span}">{html.escape(gpu)}</td>'
        f"<td>{html.escape(first[0])}</td><td>{first[1]}</td></tr>"
    )
    return "\n".join([head, *(f"<tr><td>{html.escape(e)}</td><td>{lines}</td></tr>" for e, lines in rest)])
