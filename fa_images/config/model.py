"""The frozen, typed objects a matrix becomes: its settings sections, its entries, the matrix.

Code past the loader (``matrix.load``) sees only these, never raw YAML.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..builder import contract, dist, generations
from ..builder.source import PYPI_SIMPLE
from ..errors import ConfigError, Problem
from . import builder_decision, grammar
from .compat import Compat, did_you_mean
from .generations import Recipe

DEFAULT_IMAGE = "fa-images/flash-attn"


@dataclass(frozen=True, kw_only=True)
class Bases:
    """Base images; ``{cuda_release}`` etc. are filled per entry. Point them at a mirror offline."""

    devel: str = "nvidia/cuda:{cuda_release}-devel-ubuntu22.04"
    runtime: str = "nvidia/cuda:{cuda_release}-base-ubuntu22.04"
    python: str = "uv"  # "uv": install the exact Python; "system": the base has python3.X already
    uv_version: str = "0.9.5"
    # Where uv downloads CPython from (UV_PYTHON_INSTALL_MIRROR): a mirror of
    # python-build-standalone's releases, for sites that cannot reach GitHub.
    python_mirror: str | None = None


@dataclass(frozen=True, kw_only=True)
class Packages:
    index: str | None = "https://pypi.org/simple"  # None: no index at all (offline)
    torch_index: str | None = "https://download.pytorch.org/whl/{cuda_tag}"  # None: take torch from `index`
    find_links: tuple[str, ...] = ()
    flash_attn_index: str = PYPI_SIMPLE
    # A directory on the host searched first for flash_attn-VERSION.tar.gz: offline networks
    # and private sources. Relative to the matrix file.
    sdists: str | None = None


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    network: str | None = None  # docker build network mode; "host" reaches services on 127.0.0.1
    ptx: bool = False
    # The memory the compile may use (e.g. "16g"): a limit on the build's containers, which the
    # builder reads from its cgroup and sizes its parallel jobs by. None: the engine's whole memory.
    memory: str | None = None
    # When `build` pulls the base images: "missing" (those the engine lacks), "always", "never"
    # (refuse a missing one: an offline site's bases come from `docker load`). --pull overrides it.
    pull: grammar.PullPolicy = "missing"
    # Which builder makes the images: "auto", "buildkit" or "sdk" (grammar.BuilderChoice). --builder
    # overrides it.
    builder: grammar.BuilderChoice = "auto"

    @property
    def memory_bytes(self) -> int | None:
        return grammar.memory_bytes(self.memory) if self.memory else None

    def decide_builder(
        self, flag: grammar.BuilderChoice | None = None, *, host: builder_decision.Host | None
    ) -> builder_decision.BuilderDecision:
        """The builder of a run: ``--builder`` over ``build.builder``; ``host`` None gives the form
        the settings name (what ``render`` and the exports write), whatever this host has."""
        return builder_decision.decide(flag or self.builder, memory_limit=self.memory is not None, host=host)


@dataclass(frozen=True, kw_only=True)
class Entry:
    id: str
    python: str
    torch: str
    cuda: str
    cuda_release: str
    flash_attn: str
    archs: tuple[str, ...]
    ptx: bool
    gpus: tuple[str, ...]
    cxx11_abi: bool | None  # None: a torch the compat table does not know (allow_unknown)
    sdist_sha256: str | None
    image: str
    devel_image: str
    runtime_image: str
    torch_index: str | None
    # How its generation makes its wheel and image, with that generation's own settings: decided once,
    # when the entry was resolved (config/generations/).
    recipe: Recipe
    cuda_note: str | None = None  # why its CUDA is not its torch's default (Compat.cuda_for)
    # torch's CUDA libraries at its pins, as the torch stage installs them before torch, a layer
    # each (compat.CudaVariant.libraries); empty: the table does not know them, torch's install takes them
    torch_libraries: tuple[tuple[str, ...], ...] = ()
    # 'sm120': the GPU class its id, image tag and wheel label carry, where its matrix builds several
    # classes of one Python, torch and CUDA (settings.gpu_class); None where it builds one.
    gpu_class: str | None = None

    def wheel_label(self) -> str | None:
        """The +label of its wheel, as its generation names it; None where it makes none."""
        return self.recipe.wheel_label(self)

    @property
    def wheel_version(self) -> str | None:
        """Its wheel's version, +label included; None where it installs its generation's release
        from the package index (pure Python)."""
        label = self.wheel_label()
        return None if label is None else f"{self.flash_attn}+{label}"

    @property
    def requirement(self) -> str:
        """What pip and uv are asked for to install its wheel: 'flash-attn==2.8.3+cu128torch2.9cxx11abitrue.sm80'."""
        return f"{self.generation.project}=={self.wheel_version or self.flash_attn}"

    @property
    def wheel_index(self) -> str | None:
        """The folder of dist/ whose index serves its wheel: ``<class>/simple`` where its wheel names a
        GPU class (a node of that class takes that index), else ``simple``; None: the package index's."""
        if self.wheel_version is None:
            return None
        return dist.class_index(self.gpu_class)

    @property
    def wheel_file(self) -> str | None:
        """Its wheel's file name as a glob: the platform tag (manylinux_2_X) is the one the compiled
        extension's imports allow, known once it is built; abi3 serves every Python from its oldest."""
        if self.wheel_version is None:
            return None
        cp = "cp" + self.python.replace(".", "")
        tags = "*-abi3" if self.generation.abi3 else f"{cp}-{cp}"
        return f"{self.generation.project.replace('-', '_')}-{self.wheel_version}-{tags}-*.whl"

    @property
    def cuda_tag(self) -> str:
        return contract.cuda_tag(self.cuda)

    @property
    def generation(self) -> generations.Generation:
        return self.recipe.generation

    @property
    def compile_group(self) -> str:
        """The entries that share its kernels, and so one compile (and its cache): its generation's rule."""
        return self.recipe.compile_group(self)

    @property
    def same_base(self) -> bool:
        """One base for devel and runtime: the compile runs on the torch stage itself, which no
        other stage then mounts or copies."""
        return self.devel_image == self.runtime_image

    @property
    def builder_image(self) -> str:
        """The builder stage, tagged so `docker image prune` cannot drop the compile's cache."""
        return f"{self.image}-builder"

    def summary(self) -> dict[str, Any]:
        fields = asdict(replace(self, recipe=None))  # type: ignore[arg-type]  # its own summary, in its place
        data: dict[str, Any] = {}
        for key, value in fields.items():
            data.update(self.recipe.summary() if key == "recipe" else {key: value})
        data["archs"] = list(self.archs)
        data["group"] = self.compile_group
        if self.torch_index:
            data["torch_index"] = grammar.without_credentials(self.torch_index)
        data["gpus"] = list(self.gpus)
        data["generation"] = self.generation.number
        data["wheel"] = {"requirement": self.requirement, "file": self.wheel_file, "index": self.wheel_index}
        data["torch_libraries"] = [list(layer) for layer in self.torch_libraries]
        for optional in ("cuda_note", "gpu_class"):
            if data[optional] is None:
                data.pop(optional)
        return data


@dataclass(frozen=True, kw_only=True)
class ResolvedRule:
    """A matrix axis that named its versions by a rule, and what the compat table resolved it to."""

    axis: str
    versions: str | None  # the PEP 440 specifier, as written
    newest: int | None  # the newest N of the releases the specifier admits
    values: tuple[str, ...]  # in version order

    def __str__(self) -> str:
        spec = json.dumps(self.versions) if self.versions is not None else None
        if self.newest is None:
            return str(spec)
        return "{" + (f"versions: {spec}, " if spec else "") + f"newest: {self.newest}}}"


@dataclass(frozen=True, kw_only=True)
class LeftOut:
    """A combination a rule made that the compat table has no build for, and why."""

    combination: str  # as error lines name it: matrix[python=3.12, torch=2.10.0, cuda=13.0, ...]
    reason: str


@dataclass(frozen=True, kw_only=True)
class Matrix:
    file: str
    image: str
    entries: tuple[Entry, ...]
    bases: Bases
    packages: Packages
    build: BuildOptions
    compat: Compat = field(repr=False)
    rules: tuple[ResolvedRule, ...] = ()
    left_out: tuple[LeftOut, ...] = ()

    def archive_path(self, entry: Entry) -> Path | None:
        """Where an entry's pinned source archive must lie (one no index serves): in packages.sdists;
        None for an entry without one, or where packages.sdists is not set."""
        if entry.recipe.source != "archive" or not self.packages.sdists:
            return None
        return Path(self.packages.sdists) / entry.recipe.source_name(entry.flash_attn)

    def unfound_archives(self, entries: tuple[Entry, ...]) -> list[str]:
        """A line for each entry whose source archive is not where a build looks: `plan` and `render`
        warn of it, before a build or an export refuses it."""
        lines = []
        for entry in entries:
            path = self.archive_path(entry)
            if entry.recipe.source == "archive" and (path is None or not path.is_file()):
                where = f"in {path.parent}" if path is not None else "(packages.sdists is not set)"
                lines.append(f"{entry.id}: no {entry.recipe.source_name(entry.flash_attn)} {where}")
        return lines

    def select(self, ids: list[str] | None) -> tuple[Entry, ...]:
        if not ids:
            return self.entries
        known = {e.id for e in self.entries}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ConfigError(
                [
                    Problem(
                        f"--only {unknown[0]!r} is not an entry of this matrix",
                        file=self.file,
                        hint=did_you_mean(unknown[0], sorted(known)),
                    )
                ]
            )
        return tuple(e for e in self.entries if e.id in ids)
