"""Entries -> Dockerfiles, through one jinja2 template.

Output is a pure function of the matrix and the template: no timestamps, sorted inputs,
so the committed ``dockerfiles/`` can be checked for staleness byte for byte. The files
use no BuildKit syntax, so the docker SDK's legacy builder can build them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from .matrix import Entry, Matrix

TEMPLATES = Path(__file__).with_name("templates")


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def pip_source(matrix: Matrix, index: str | None) -> str:
    """pip flags that pick where packages come from, ending in a space."""
    parts = [f"--index-url {index}"] if index else ["--no-index"]
    parts += [f"--find-links {link}" for link in matrix.packages.find_links]
    return " ".join(parts) + " "


def render_entry(matrix: Matrix, entry: Entry) -> str:
    torch_index = entry.torch_index or matrix.packages.index
    abi = {True: "new C++11 ABI", False: "old C++ ABI", None: "C++ ABI read at build time"}[entry.cxx11_abi]
    return (
        _environment()
        .get_template("Dockerfile.j2")
        .render(
            e=entry,
            matrix_file=Path(matrix.file).name,
            abi_text=abi,
            abi_label="unknown" if entry.cxx11_abi is None else str(entry.cxx11_abi).lower(),
            python_from=matrix.bases.python,
            uv_version=matrix.bases.uv_version,
            pip_index=pip_source(matrix, matrix.packages.index),
            torch_source=pip_source(matrix, torch_index),
            flash_attn_index=matrix.packages.flash_attn_index,
            build_tools=matrix.compat.build_tools,
        )
    )


def dockerfile_name(entry: Entry) -> str:
    return f"{entry.id}.Dockerfile"


@dataclass(frozen=True)
class RenderResult:
    written: tuple[Path, ...]
    stale: tuple[Path, ...]  # differ from what would be rendered (with --check)
    extra: tuple[Path, ...]  # *.Dockerfile on disk that no entry renders


def render_all(matrix: Matrix, entries: tuple[Entry, ...], out_dir: Path, *, check: bool = False) -> RenderResult:
    wanted = {out_dir / dockerfile_name(e): render_entry(matrix, e) for e in entries}
    stale = tuple(p for p, text in wanted.items() if not p.is_file() or p.read_text() != text)
    extra = tuple(sorted(p for p in out_dir.glob("*.Dockerfile") if p not in wanted)) if out_dir.is_dir() else ()
    if check:
        return RenderResult(written=(), stale=stale, extra=extra)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(wanted[path])
    return RenderResult(written=stale, stale=(), extra=extra)
