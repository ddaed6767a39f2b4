"""Entries -> Dockerfiles, through one jinja2 template.

Output is a pure function of the matrix and the template: no timestamps, sorted inputs,
so the committed ``dockerfiles/`` can be checked for staleness byte for byte. Two forms, one
template: BuildKit's (``RUN --mount``: the torch venv, the builder and the sdist mounted, the
compiler cache a cache mount) and the legacy builder's (the docker SDK: no BuildKit syntax, so
they are copied in). ``builder`` picks one; the rest of the file is the same.
"""

from __future__ import annotations

import functools
import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from ..builder import contract, safe_io, untrusted
from ..config import grammar, groups
from ..config.grammar import BuilderForm
from ..config.matrix import Entry, Matrix
from ..errors import UsageError
from . import os_packages, wheelhouse

# At the top of fa_images/, not in outputs/: the header of every rendered Dockerfile names fa_images/templates/.
TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
# The builder stage's build tools live here, outside the venv the runtime stage copies.
BUILD_TOOLS_DIR = "/opt/build-tools"
# Where the build context's sources are in the builder stage.
SOURCES_IN_IMAGE = "/opt/fa-images/inputs/sdists"
# A rendered Dockerfile is a few kB; --check reads no more than this of what is there.
MAX_DOCKERFILE = 1 << 20


def _no_control_characters(value: object) -> object:
    """Every ``{{ }}`` passes here: a newline in a value would be a new Dockerfile instruction."""
    if isinstance(value, str) and not grammar.printable(value):
        raise UsageError(f"refusing to render {value[:80]!r}: it holds a control character")
    return value


def _label(value: str) -> str:
    """A double-quoted LABEL value: Docker expands ``$`` there and ends it at ``"``."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


@functools.cache  # one per process: each template is compiled once, not for every entry
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_no_control_characters,
    )
    env.filters["sh"] = shlex.quote  # a RUN line is a shell command: every value is one word
    env.filters["label"] = _label
    return env


def pip_args(install: wheelhouse.Install) -> str:
    """``pip install``'s arguments for one install of the builder stage, shell-quoted."""
    return " ".join(shlex.quote(a) for a in install.source.flags() + list(install.requirements))


def venv_mounts(matrix: Matrix, entry: Entry, stage: str) -> list[str]:
    """BuildKit's mounts of ``stage``'s Python into the builder stage (none where the builder stage
    is the torch stage itself): the torch stage's, the bytes the wheel is compiled against, never a
    copy; the python stage's bare venv, whose pip installs the build tools without waiting for torch."""
    if entry.same_base:
        return []
    dirs = ["/opt/python", "/opt/venv"] if matrix.bases.python == "uv" else ["/opt/venv"]
    return [f"--mount=type=bind,from={stage},source={d},target={d}" for d in dirs]


def cache_mount_id(entry: Entry) -> str:
    """The BuildKit cache mount of the entry's compile group: the same id for every Python of it."""
    return "fa-images-compiler-cache-" + hashlib.sha256(entry.compile_group.encode()).hexdigest()[:16]


# The Dockerfile's parts, in order (templates/stages/): Dockerfile.j2 includes each one.
STAGES = ("header", "python", "torch", "wheel", "install", "runtime")


def render_entry(matrix: Matrix, entry: Entry, *, builder: BuilderForm, prebuilt: bool = False) -> str:
    """The entry's Dockerfile for ``builder``; ``prebuilt``: the runtime image around a wheel the
    context carries (``inputs/prebuilt/``), with no compile."""
    return _environment().get_template("Dockerfile.j2").render(_values(matrix, entry, builder, prebuilt))


def render_stage(matrix: Matrix, entry: Entry, stage: str, *, builder: BuilderForm, prebuilt: bool = False) -> str:
    """One part of the entry's Dockerfile (``STAGES``), as it is in the whole."""
    if stage not in STAGES:
        raise UsageError(f"{stage!r} is not a part of the Dockerfile: {', '.join(STAGES)}")
    return _environment().get_template(f"stages/{stage}.j2").render(_values(matrix, entry, builder, prebuilt))


def _values(matrix: Matrix, entry: Entry, builder: BuilderForm, prebuilt: bool) -> dict[str, Any]:
    """What the templates are filled with: every value checked against its grammar before, here."""
    abi = {True: "new C++11 ABI", False: "old C++ ABI", None: "C++ ABI read at build time"}[entry.cxx11_abi]
    installs = {i.name: i for i in wheelhouse.installs(matrix, entry)}
    private = wheelhouse.private_kinds(matrix, entry)
    runtime = wheelhouse.runtime_deps(matrix, entry)
    # The sdist is always in the context; the index is a fallback that must not carry a token.
    index = grammar.without_credentials(matrix.packages.flash_attn_index)
    command = groups.wheel_command(
        entry, index_url=index, sources_dir=SOURCES_IN_IMAGE, compiler_cache=contract.CACHE_DIR
    )
    return dict(
        e=entry,
        matrix_file=Path(matrix.file).name,
        abi_text=abi,
        abi_label="unknown" if entry.cxx11_abi is None else str(entry.cxx11_abi).lower(),
        python_from=matrix.bases.python,
        uv_install=pip_args(installs["uv"]),
        pip_os_install=os_packages.install_lines(os_packages.PIP),
        git_os_install=os_packages.install_lines(os_packages.GIT),
        torch_install=pip_args(installs["torch"]),
        library_installs=[pip_args(i) for i in wheelhouse.library_installs(matrix, entry)],
        tools_install=pip_args(installs["build tools"]),
        runtime_install=pip_args(installs["runtime deps"]),
        build_tools=BUILD_TOOLS_DIR,
        prebuilt=prebuilt,
        # The builder stage compiles a wheel, unless its generation makes none or the wheel exists.
        makes_wheel=entry.recipe.makes_wheel,
        compiles=not prebuilt and entry.recipe.makes_wheel,
        wheel_command=command,
        install=entry.recipe.install_stage(entry, runtime),
        generation_labels=entry.recipe.labels(entry, runtime),
        buildkit=builder == "buildkit",
        venv_mounts=venv_mounts(matrix, entry, contract.TORCH_STAGE) if builder == "buildkit" else [],
        python_mounts=venv_mounts(matrix, entry, contract.PYTHON_STAGE) if builder == "buildkit" else [],
        cache_mount_id=cache_mount_id(entry),
        # One base for both: the compile runs on the torch stage instead of a copy of its venv.
        same_base=entry.same_base,
        # Names the host and the builder share (builder/contract.py), and the image's own check.
        python_stage=contract.PYTHON_STAGE,
        torch_stage=contract.TORCH_STAGE,
        torch_committed_stage=contract.TORCH_COMMITTED_STAGE,
        torch_commit_stage=contract.TORCH_COMMIT_STAGE,
        builder_stage=contract.BUILDER_STAGE,
        wheel_stage=contract.WHEEL_STAGE,
        install_stage=contract.INSTALL_STAGE,
        runtime_stage=contract.RUNTIME_STAGE,
        layer_root=contract.LAYER_ROOT,
        wheels_dir=contract.WHEELS_DIR,
        cache_stage=contract.CACHE_STAGE,
        cache_in_stage=contract.CACHE_IN_STAGE,
        cache_out_stage=contract.CACHE_OUT_STAGE,
        cache_copy_dir=contract.CACHE_COPY_DIR,
        anew_arg=contract.ANEW_ARG,
        cache_context_dir=contract.CACHE_CONTEXT_DIR,
        cache_dir=contract.CACHE_DIR,
        cache_export_dir=contract.CACHE_EXPORT_DIR,
        import_check=contract.IMPORT_CHECK_COMMAND,
        python_mirror=matrix.bases.python_mirror,
        # Private installs, fetched on the host: torch apart, so its wheels reach no image.
        torch_wheelhouse=wheelhouse.dir_in_image("torch") if "torch" in private else None,
        tools_wheelhouse=wheelhouse.dir_in_image("tools") if "tools" in private else None,
    )


def dockerfile_name(entry: Entry) -> str:
    return f"{entry.id}.Dockerfile"


@dataclass(frozen=True)
class RenderResult:
    written: tuple[Path, ...]
    stale: tuple[Path, ...]  # differ from what would be rendered (with --check)
    extra: tuple[Path, ...]  # *.Dockerfile on disk that no entry renders


def render_all(
    matrix: Matrix, entries: tuple[Entry, ...], out_dir: Path, *, builder: BuilderForm, check: bool = False
) -> RenderResult:
    """Writes (or with ``check``, compares) one Dockerfile per entry in ``out_dir``, through
    safe_io: a symlink planted as ``<id>.Dockerfile`` (or as the folder) is refused, never
    followed; nothing is deleted. A file that is not a regular file counts as stale."""
    wanted = {dockerfile_name(e): render_entry(matrix, e, builder=builder) for e in entries}
    if check:
        stale = tuple(out_dir / n for n, text in wanted.items() if _current(out_dir / n) != text)
        return RenderResult(written=(), stale=stale, extra=_extra(out_dir, wanted))
    out = safe_io.OutputDir(out_dir, what="--out")
    stale = tuple(out_dir / n for n, text in wanted.items() if out.kind(n) != "file" or _current(out_dir / n) != text)
    for path in stale:
        out.write_text(path.name, wanted[path.name])
    return RenderResult(written=stale, stale=(), extra=_extra(out_dir, wanted))


def _current(path: Path) -> str | None:
    """What a rendered file holds now: None if it is missing, a link, or not a small regular file."""
    if path.is_symlink():
        return None
    try:
        return untrusted.read_file(path, limit=MAX_DOCKERFILE, what="Dockerfile").decode("utf-8")
    except (OSError, ValueError):
        return None


def _extra(out_dir: Path, wanted: dict[str, str]) -> tuple[Path, ...]:
    """*.Dockerfile in ``out_dir`` that no entry renders (reported, never deleted)."""
    if out_dir.is_symlink() or not out_dir.is_dir():
        return ()
    return tuple(sorted(p for p in out_dir.glob("*.Dockerfile") if p.name not in wanted))
