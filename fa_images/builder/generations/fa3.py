"""FlashAttention-3: its source archive, its build knobs, and the environment its setup.py runs in.

FA3 is not on PyPI, and flash-attn's sdists carry none of its CUDA sources. Its source is
flash-attention's ``hopper/`` (and the README its setup.py opens) at a commit, plus cutlass's
``include/`` at the commit of that commit's submodule: ``make_archive`` puts the two into one
archive, laid out as the repository (``hopper/``, ``csrc/cutlass/include/``). Its pin is the
sha256 of the tar inside, so a mirror may compress it again without breaking the pin.

hopper/setup.py is steered by environment variables only: ``FLASH_ATTENTION_DISABLE_*`` shape
what is compiled, and ``Fa3Build.environment`` sets every one of them, so nothing a caller's
environment holds changes the build. It would download nvcc 12.6 and ptxas 12.8 for CUDA 12.3 to
12.9 except 12.8 (``DOWNLOADS_TOOLCHAIN``; the builder reads whether the archive's setup.py does),
try a GitHub wheel unless forced to build, and run ``git submodule update``; fa-images refuses the
first, forces the build, and keeps git inside the unpacked tree.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import gzip
import hashlib
import itertools
import os
import re
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import safe_io, scratch, source, untrusted, wheelfile
from ..errors import EnvironmentProblem, SourceError, UsageError
from ..source import ZIP_EPOCH, SourceTree, check_sha256, extract
from .steps import PreparedSource, SourceRequest

if TYPE_CHECKING:
    from ..environment import NvccInfo, TorchInfo
    from ..settings import BuildSettings
    from ..wheelfile import Wheel

SOURCE_SUBDIR = "hopper"  # where setup.py lies in the archive's root
# The CUDA versions for which hopper/setup.py downloads its own nvcc and ptxas.
DOWNLOADS_TOOLCHAIN = SpecifierSet(">=12.3,<13.0,!=12.8")
MIN_CUDA = Version("12.3")
# Where that toolchain comes from: a setup.py that never names it downloads nothing.
TOOLCHAIN_SERVER = "developer.download.nvidia.com"
# FA3's source (hopper/ and cutlass's include/) is about 30 MB as a tar: a bound, not a size.
MAX_SOURCE = 512 << 20
GIT_TIMEOUT = 600.0
# FA3 builds on torch's stable ABI from this torch on: one abi3 wheel for every later torch of a CUDA major.
STABLE_ABI_TORCH = Version("2.9")

HEAD_DIMS = (64, 96, 128, 192, 256)
# The compile of one of its kernels for its one arch, on one core: the longest of a trimmed build's
# (bench/results/fa3-container-h100/build.log: 6 units, 16 jobs x 1 nvcc thread, 149 s in all).
KERNEL_SECONDS = 149
DTYPES = ("bf16", "fp16", "fp8")  # bf16 is always built
# Feature -> the FLASH_ATTENTION_DISABLE_* suffixes that leave it out.
FEATURES: dict[str, tuple[str, ...]] = {
    "backward": ("BACKWARD",),
    "split": ("SPLIT",),
    "paged_kv": ("PAGEDKV",),
    "append_kv": ("APPENDKV",),
    "local": ("LOCAL",),
    "softcap": ("SOFTCAP",),
    "packgqa": ("PACKGQA",),
    "sm80": ("SM80",),
    "hdim_diff": ("HDIMDIFF64", "HDIMDIFF192"),
    "varlen": ("VARLEN",),
    "cluster": ("CLUSTER",),
}
# The key flash_attn_config.py (the wheel's record of its build) uses for each setup.py variable.
_CONFIG_KEY = {
    "SM80": "FLASHATTENTION_DISABLE_SM8x",
    "HDIMDIFF64": "FLASH_ATTENTION_DISABLE_HDIMDIFF64",
    "HDIMDIFF192": "FLASH_ATTENTION_DISABLE_HDIMDIFF192",
}


def archive_name(version: str) -> str:
    return f"flash_attn_3-{version}.tar.gz"


def _disable_vars() -> list[str]:
    hdims = [f"HDIM{d}" for d in HEAD_DIMS]
    return ["FP16", "FP8", *hdims, *(s for suffixes in FEATURES.values() for s in suffixes)]


@dataclass(frozen=True)
class Fa3Build:
    """What one FA3 build compiles: head dims, dtypes, and the features left out."""

    head_dims: tuple[int, ...] = HEAD_DIMS
    dtypes: tuple[str, ...] = DTYPES
    without: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        if not self.head_dims or set(self.head_dims) - set(HEAD_DIMS):
            problems.append(f"head dims {list(self.head_dims)}: choose from {list(HEAD_DIMS)}")
        if "bf16" not in self.dtypes or set(self.dtypes) - set(DTYPES):
            problems.append(f"dtypes {list(self.dtypes)}: bf16 is always built; add fp16 and fp8 or not")
        if set(self.without) - set(FEATURES):
            problems.append(f"features {sorted(set(self.without) - set(FEATURES))}: known are {sorted(FEATURES)}")
        if problems:
            raise UsageError("FA3 build: " + "; ".join(problems))
        object.__setattr__(self, "head_dims", tuple(sorted(set(self.head_dims))))
        object.__setattr__(self, "dtypes", tuple(d for d in DTYPES if d in self.dtypes))
        object.__setattr__(self, "without", tuple(f for f in FEATURES if f in self.without))

    @property
    def full(self) -> bool:
        return self == Fa3Build()

    def disabled(self) -> dict[str, bool]:
        """Every FLASH_ATTENTION_DISABLE_* suffix setup.py reads, and whether it is set."""
        off = {f"HDIM{d}" for d in HEAD_DIMS if d not in self.head_dims}
        off |= {d.upper() for d in DTYPES if d not in self.dtypes}
        off |= {s for feature in self.without for s in FEATURES[feature]}
        return {name: name in off for name in _disable_vars()}

    def sources(self) -> list[str]:
        """The units hopper/setup.py compiles for this build (at the pinned commit; upstream's full
        build is 293), each for its own arch: what the runner-fit estimate counts."""
        off = {name for name, is_off in self.disabled().items() if is_off}
        hdims = list(self.head_dims)
        fwd_dtypes = [d if d != "fp8" else "e4m3" for d in self.dtypes]
        half = [d for d in self.dtypes if d != "fp8"]
        split = [""] + ([] if "SPLIT" in off else ["_split"])
        paged = [""] + ([] if "PAGEDKV" in off else ["_paged"])
        softcap = [""] + ([] if "SOFTCAP" in off else ["_softcap"])
        softcap_all = [""] if "SOFTCAP" in off else ["_softcapall"]
        packgqa = [""] + ([] if "PACKGQA" in off else ["_packgqa"])

        def fwd90(dims: list, dtypes: list[str]) -> list[str]:
            return [
                f"fwd_hdim{h}_{t}{p}{s}{c}{g}_sm90"
                for h, t, s, p, c, g in itertools.product(dims, dtypes, split, paged, softcap, packgqa)
                if not (g and (p or s))
            ]

        units = fwd90(hdims, fwd_dtypes)
        units += fwd90([] if "HDIMDIFF64" in off else ["64_256", "64_512"], half)
        units += fwd90([] if "HDIMDIFF192" in off else ["192_128"], fwd_dtypes)
        backward = "BACKWARD" not in off
        if "SM80" not in off:
            units += [f"fwd_hdim{h}_{t}{p}{s}{c}_sm80" for h, t, s, p, c in
                      itertools.product(hdims, half, split, paged, softcap_all)]  # fmt: skip
            units += [f"bwd_hdim{h}_{t}{c}_sm80" for h, t, c in itertools.product(hdims, half, softcap) if backward]
        units += [f"bwd_hdim{h}_{t}{c}_sm90" for h, t, c in itertools.product(hdims, half, softcap_all) if backward]
        return ["flash_api", *units, *([] if "SPLIT" in off else ["fwd_combine"]), "prepare_scheduler"]

    def environment(self) -> dict[str, str]:
        return {f"FLASH_ATTENTION_DISABLE_{k}": "TRUE" if v else "FALSE" for k, v in self.disabled().items()}

    @property
    def archs(self) -> tuple[str, ...]:
        """The cubins it holds: sm_90a (Hopper only), and sm_80 (every 8.x GPU) unless left out."""
        return ("90a",) if "sm80" in self.without else ("80", "90a")

    def label(self) -> str:
        """'' for upstream's full build, else 'k' and 8 hex digits naming this one, for the wheel's +label."""
        if self.full:
            return ""
        return "k" + hashlib.sha256(self.describe().encode()).hexdigest()[:8]

    def describe(self) -> str:
        text = f"hdim {','.join(map(str, self.head_dims))}; {','.join(self.dtypes)}"
        return text + (f"; without {','.join(self.without)}" if self.without else "")

    def arguments(self) -> list[str]:
        """The builder's ``wheel`` flags that ask for this build."""
        args = ["--fa3-head-dims", ",".join(map(str, self.head_dims)), "--fa3-dtypes", ",".join(self.dtypes)]
        return args + (["--fa3-without", ",".join(self.without)] if self.without else [])

    @classmethod
    def parse(cls, head_dims: str | None, dtypes: str | None, without: str | None) -> Fa3Build:
        """From the builder's flags (comma-separated); a bad value is a UsageError."""

        def items(text: str | None) -> list[str]:
            return [t.strip() for t in (text or "").split(",") if t.strip()]

        try:
            dims = tuple(int(d) for d in items(head_dims)) if head_dims else HEAD_DIMS
        except ValueError:
            raise UsageError(f"--fa3-head-dims {head_dims!r}: comma-separated numbers of {list(HEAD_DIMS)}") from None
        return cls(
            head_dims=dims,
            dtypes=tuple(items(dtypes)) if dtypes else DTYPES,
            without=tuple(items(without)),
        )

    @classmethod
    def from_config(cls, config: dict) -> Fa3Build:
        """The build a wheel records in its ``flash_attn_config.CONFIG['build_flags']``."""
        flags = config.get("build_flags") if isinstance(config, dict) else None
        if not isinstance(flags, dict):
            raise ValueError("no build_flags")

        def off(suffix: str) -> bool:
            value = flags.get(_CONFIG_KEY.get(suffix, f"FLASHATTENTION_DISABLE_{suffix}"), False)
            if not isinstance(value, bool):
                raise ValueError(f"{suffix} is {value!r}, not a bool")
            return value

        return cls(
            head_dims=tuple(d for d in HEAD_DIMS if not off(f"HDIM{d}")),
            dtypes=tuple(d for d in DTYPES if d == "bf16" or not off(d.upper())),
            without=tuple(f for f, suffixes in FEATURES.items() if all(off(s) for s in suffixes)),
        )


def local_version_label(cuda: str | None, build: Fa3Build) -> str:
    """'cu13', or 'cu13.k1a2b3c4d' for a trimmed build: one abi3 wheel serves a whole CUDA major."""
    base = f"cu{cuda.split('.')[0]}" if cuda else "cpu"
    return base + (f".{build.label()}" if build.label() else "")


def refuse_cuda(cuda: str, *, fetches_toolchain: bool = True) -> str | None:
    """Why FA3 cannot be built with this CUDA here, or None. ``fetches_toolchain``: whether its
    setup.py downloads a toolchain for DOWNLOADS_TOOLCHAIN, as upstream's does (the plan, which has
    no archive to read, takes upstream's word; the builder reads the archive's setup.py)."""
    version = Version(cuda)
    if version < MIN_CUDA:
        return f"FlashAttention-3 needs CUDA >= {MIN_CUDA}, not {cuda}"
    if fetches_toolchain and version in DOWNLOADS_TOOLCHAIN:
        return (
            f"with CUDA {cuda}, FlashAttention-3's setup.py downloads nvcc 12.6 and ptxas 12.8 at build time; "
            "fa-images downloads nothing while it builds: use CUDA 12.8 or 13.x"
        )
    return None


# --- the source archive ---------------------------------------------------------------------


def unpack(archive: Path, dest_dir: Path, sha256: str | None) -> SourceTree:
    """The FA3 archive, checked against its pin (the tar's sha256) and unpacked into a fresh ``dest_dir``."""
    actual = source.tar_sha256(archive)
    if sha256:
        check_sha256(actual, sha256, shown_as=f"{archive.name} (the tar inside)")
    root, newest = extract(archive, dest_dir, marker=f"{SOURCE_SUBDIR}/setup.py", what="FA3 source archive")
    src = root / SOURCE_SUBDIR
    init = src / "__init__.py"
    match = init.is_file() and re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init.read_text(), re.MULTILINE)
    if not match:
        raise SourceError(f"cannot read __version__ from {SOURCE_SUBDIR}/__init__.py; is this FA3's source?")
    setup_py = src / "setup.py"
    if not setup_py.is_file() or setup_py.is_symlink():
        raise SourceError(f"{archive.name} has no {SOURCE_SUBDIR}/setup.py; is this FA3's source?")
    if not (root / "csrc" / "cutlass" / "include" / "cutlass").is_dir():
        raise SourceError(f"{archive.name} holds no csrc/cutlass/include/cutlass: cutlass is missing")
    return SourceTree(
        path=src,
        version=match.group(1),
        sdist=archive,
        sha256=actual,
        honours_cuda_archs_env=False,
        honours_local_version=True,
        fetches_toolchain=TOOLCHAIN_SERVER in setup_py.read_text(errors="replace"),
        source_date_epoch=newest,
    )


# Nothing a clone carries runs: its config (filter drivers, fsmonitor, hooks) is never read by the
# commands that read its objects, which run in a bare repository of fa-images' own that borrows the
# clone's object store (objects/info/alternates); git's system and user config are left out too.
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
_GIT_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=" + os.devnull, "-c", "protocol.allow=never")


def _git(repo: Path, *args: str, limit: int | None = None, into: BinaryIO | None = None) -> bytes:
    """git's output in ``repo``, read at most ``limit`` (MAX_SOURCE) bytes far and ``GIT_TIMEOUT``
    seconds long: a clone is the user's input, and its archive could be anything. With ``into``,
    the output is written there as it comes, never held whole (b"" is returned)."""
    limit = MAX_SOURCE if limit is None else limit
    deadline = time.monotonic() + GIT_TIMEOUT
    env = {**os.environ, **_GIT_ENV}
    with tempfile.TemporaryFile() as err:
        try:
            command = ["git", *_GIT_SAFE, "-C", str(repo), *args]
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env)
        except OSError as exc:
            raise SourceError(f"git {args[0]} in {repo}: {exc.strerror}") from None
        chunks, total = [], 0
        with proc:
            assert proc.stdout is not None
            while chunk := proc.stdout.read(1 << 20):
                total += len(chunk)
                if total > limit or time.monotonic() > deadline:
                    proc.kill()
                    why = f"more than {limit >> 20} MiB" if total > limit else f"more than {GIT_TIMEOUT:.0f} s"
                    raise SourceError(f"git {args[0]} in {repo} took {why}; refusing")
                if into is not None:
                    into.write(chunk)
                else:
                    chunks.append(chunk)
        err.seek(0)
        said = err.read(4096).decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        why = untrusted.shown(said[-1]) if said else f"exit {proc.returncode}"
        raise SourceError(f"git {' '.join(args[:2])} in {repo} failed: {why}")
    return b"".join(chunks)


def _borrowing(clone: Path, home: Path) -> Path:
    """A bare repository of fa-images' own at ``home`` whose objects are the clone's: what reads the
    clone's commits and trees runs there, with none of the clone's config, attributes or hooks."""
    objects = _git(clone, "rev-parse", "--path-format=absolute", "--git-path", "objects", limit=1 << 16)
    where = objects.decode(errors="replace").strip()
    if not where.startswith("/") or not Path(where).is_dir():
        raise SourceError(f"{clone} is not a git clone with an object store (found {untrusted.shown(where[:200])!r})")
    _git(home.parent, "init", "-q", "--bare", str(home), limit=1 << 16)
    (home / "objects" / "info" / "alternates").write_text(where + "\n")
    return home


def make_archive(*, flash_attention: Path, commit: str, cutlass: Path, out: safe_io.OutputDir) -> tuple[Path, str]:
    """FA3's source archive from local clones of flash-attention and cutlass: (its path, the tar's sha256).

    The cutlass commit is the one ``commit`` records for its submodule. The same commits give the
    same tar, byte for byte: members sorted, owners and modes normalised, every time that of ``commit``
    (git archive of a tree, cutlass's ``include``, stamps the time it runs). The commit is found in the
    clone; everything else is read through repositories of fa-images' own (``_borrowing``), and every
    stage goes through files, bounded, never held in memory whole.
    """
    with scratch.scratch_dir("fa3-archive") as tmp:
        try:
            found = _git(flash_attention, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{commit}}")
        except SourceError as exc:
            shown = untrusted.shown(repr(commit[:80]))
            raise SourceError(f"--commit {shown} is not a commit of {flash_attention} ({exc})") from None
        full = found.decode().strip()
        fa = _borrowing(flash_attention, tmp / "flash-attention.git")
        cut = _borrowing(cutlass, tmp / "cutlass.git")
        when = int(_git(fa, "show", "-s", "--format=%ct", full).decode().strip())
        sub = _git(fa, "rev-parse", "--verify", f"{full}:csrc/cutlass").decode().strip()
        _git(cut, "cat-file", "-e", f"{sub}^{{commit}}")
        init = _git(fa, "show", f"{full}:{SOURCE_SUBDIR}/__init__.py", limit=1 << 20).decode()
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init, re.MULTILINE)
        if not match:
            raise SourceError(f"{commit}: {SOURCE_SUBDIR}/__init__.py has no __version__; is this flash-attention?")
        version = match.group(1)
        top = f"flash_attn_3-{version}"
        parts = [tmp / "hopper.tar", tmp / "cutlass.tar"]
        with parts[0].open("wb") as into:
            _git(fa, "archive", "--format=tar", f"--prefix={top}/", full, SOURCE_SUBDIR, "README.md", into=into)
        with parts[1].open("wb") as into:
            _git(cut, "archive", "--format=tar", f"--prefix={top}/csrc/cutlass/include/", f"{sub}:include", into=into)
        tar_path = tmp / "flash_attn_3.tar"
        _normalised_tar(parts, tar_path, mtime=max(when, ZIP_EPOCH))
        digest = hashlib.sha256()
        packed = tmp / archive_name(version)
        with contextlib.ExitStack() as files:  # the builder's Python may be 3.9: no parenthesised with
            tar_file = files.enter_context(tar_path.open("rb"))
            raw = files.enter_context(packed.open("wb"))
            gz = files.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9))
            while chunk := tar_file.read(1 << 20):
                digest.update(chunk)
                gz.write(chunk)
        path = out.link_in(archive_name(version), packed)
    return path, digest.hexdigest()


def _normalised_tar(parts: list[Path], out_path: Path, *, mtime: int) -> None:
    """One tar of ``parts``' members, sorted, owners, modes and times normalised, each body copied
    from its part as it is read."""
    with contextlib.ExitStack() as stack:
        members: dict[str, tuple[tarfile.TarFile, tarfile.TarInfo]] = {}
        for part in parts:
            tar = stack.enter_context(tarfile.open(part))
            for info in tar.getmembers():
                if not (info.isfile() or info.isdir()):
                    raise SourceError(f"{info.name}: git archive gave a link or device; FA3's source holds none")
                members[info.name.rstrip("/")] = (tar, info)
        with tarfile.open(out_path, mode="w", format=tarfile.PAX_FORMAT) as out:
            for name in sorted(members):
                tar, info = members[name]
                new = tarfile.TarInfo(name)
                new.type = info.type
                new.mtime = mtime
                new.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
                new.size = info.size if info.isfile() else 0
                out.addfile(new, tar.extractfile(info) if info.isfile() else None)


# --- its build steps (steps.Steps) -----------------------------------------------------------------

# Its +label: the CUDA major, and a trimmed build's name (local_version_label).
LABEL = re.compile(r"cu(?P<cuda>\d+)(?:\.k[0-9a-f]{8})?", re.IGNORECASE)
FLAGS = ("fa3_head_dims", "fa3_dtypes", "fa3_without")  # its own `wheel` flags' destinations


def label(local: str) -> re.Match[str] | None:
    return LABEL.fullmatch(local)


def add_wheel_flags(parser: argparse.ArgumentParser) -> None:
    knobs = parser.add_argument_group("FlashAttention-3 (a 3.x --flash-attn): what it compiles")
    knobs.add_argument("--fa3-head-dims", metavar="LIST", help=f"head dims to compile, of {list(HEAD_DIMS)}")
    knobs.add_argument("--fa3-dtypes", metavar="LIST", help=f"dtypes, of {list(DTYPES)} (bf16 always)")
    knobs.add_argument("--fa3-without", metavar="LIST", help=f"features left out, of {list(FEATURES)}")


def from_flags(args: argparse.Namespace) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """(its knobs, no archs: its own are sm_90a and sm_80), each flag it cannot take refused."""
    flags = (("--archs", args.archs), ("--ptx", args.ptx), ("--shard", args.shard), ("--label-archs", args.label_archs))
    for flag, given in flags:
        if given:
            raise UsageError(f"{flag} is not for FlashAttention-3: its archs are its own (sm_90a, sm_80), unsharded")
    if args.after_shards:
        raise UsageError("--after-shards is not for FlashAttention-3, which is built unsharded")
    build = Fa3Build.parse(args.fa3_head_dims, args.fa3_dtypes, args.fa3_without)
    return dataclasses.asdict(build), ()


def knobs_of(knobs: dict[str, Any] | None) -> Fa3Build:
    """The build a settings file records (upstream's full build where it records none)."""
    if knobs is None:
        return Fa3Build()
    return Fa3Build(head_dims=tuple(knobs["head_dims"]), dtypes=tuple(knobs["dtypes"]), without=tuple(knobs["without"]))


def prepare_source(request: SourceRequest, torch: TorchInfo) -> PreparedSource:
    """Its pinned archive (never downloaded), on a torch and CUDA it builds with."""
    build = knobs_of(request.knobs)
    tree = _archive_tree(request)
    if Version(torch.version.split("+")[0]) < STABLE_ABI_TORCH:
        raise EnvironmentProblem(
            f"torch {torch.version}: fa-images builds FlashAttention-3 on torch's stable ABI, "
            f"from torch {STABLE_ABI_TORCH} on (one abi3 wheel for every later torch of a CUDA major)"
        )
    if torch.cuda is not None and (why := refuse_cuda(torch.cuda)):
        raise EnvironmentProblem(why)
    knobs = dataclasses.asdict(build)
    return PreparedSource(tree, build.archs, local_version_label(torch.cuda, build), ptx=False, knobs=knobs)


def _archive_tree(request: SourceRequest) -> SourceTree:
    """Its pinned source archive: a local file, or its name in ``sources_dir``; never downloaded."""
    version, archive, sources_dir, sha256 = request.version, request.sdist, request.sources_dir, request.sha256
    if archive is None:
        assert version is not None
        if sources_dir is None or not os.path.lexists(sources_dir / archive_name(version)):
            raise SourceError(
                f"no {archive_name(version)} in {sources_dir or 'a sources directory'}: FlashAttention-3 is not "
                "on PyPI, and its source archive is not downloaded while building",
                hint="make it with `fa-images source fa3` from clones of flash-attention and cutlass, "
                "and put it in packages.sdists",
            )
        if not sha256:  # a file found by its name is the pinned one only if its pin is checked
            raise UsageError(
                f"{archive_name(version)} is taken from {sources_dir} by its name: give --sha256, its pin "
                "(compat.yaml's flash_attn_3 sha256; `fa-images plan --json` shows it as sdist_sha256)",
                hint="or name the file itself with --sdist to build it unpinned",
            )
        archive = sources_dir / archive_name(version)
    elif not os.path.lexists(archive):
        raise UsageError(f"FA3 source archive {archive} does not exist")
    tree = unpack(archive, request.work_dir / "src", sha256)
    if version is not None and tree.version != version:
        raise SourceError(f"{archive.name} holds FlashAttention-3 {tree.version}, not {version}")
    return tree


def setup_command(python: str, src: Path, dist: Path, settings_file: Path) -> list[str]:
    """hopper/setup.py as it is: environment variables are all it reads (``setup_environment``)."""
    return [python, "setup.py", "bdist_wheel", "--dist-dir", str(dist)]


def setup_environment(settings: BuildSettings, nvcc: NvccInfo) -> dict[str, str]:
    """hopper/setup.py's environment: every knob it reads set here, none inherited."""
    if why := refuse_cuda(nvcc.version, fetches_toolchain=settings.fetches_toolchain):
        raise EnvironmentProblem(f"nvcc {nvcc.version}: {why}")
    build = knobs_of(settings.knobs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASH_ATTENTION_", "FLASH_ATTN_"))}
    env.pop("TORCH_CUDA_ARCH_LIST", None)  # its gencode flags are its own (sm_90a, sm_80)
    env.update(build.environment())
    env.update(
        FLASH_ATTENTION_FORCE_BUILD="TRUE",  # never a wheel from GitHub
        FLASH_ATTENTION_OFFLINE_BUILD="TRUE",
        MAX_JOBS=str(settings.max_jobs),
        NVCC_THREADS=str(settings.nvcc_threads),
        CUDA_HOME=str(nvcc.cuda_home),
        PATH=f"{nvcc.path.parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        # setup.py runs `git submodule update`: it must find no repository above the unpacked tree.
        GIT_CEILING_DIRECTORIES=str(Path(settings.source_dir).parent),
    )
    if settings.local_version:
        env["FLASH_ATTN_LOCAL_VERSION"] = settings.local_version
    if settings.source_date_epoch is not None:
        env.setdefault("SOURCE_DATE_EPOCH", str(settings.source_date_epoch))
    return env


def check_wheel(report: Any, wheel: Wheel) -> None:
    """What the wheel was built with, from its flash_attn_config.py (a literal, never run); no torch
    pin, since it is built on torch's stable ABI."""
    _check_build(report, wheel)
    report.add("torch pin", "pass", f"none: built on torch's stable ABI, for torch >= {STABLE_ABI_TORCH}")


def _check_build(report: Any, wheel: Wheel) -> None:
    if "flash_attn_config.py" not in wheel.members:
        report.add("FA3 build", "fail", "no flash_attn_config.py: its build flags are unknown")
        return
    try:
        text = wheel.zf.read("flash_attn_config.py")[: 1 << 20].decode()
        match = re.search(r"^CONFIG = (\{.*\})$", text, re.MULTILINE)
        build = Fa3Build.from_config(ast.literal_eval(match.group(1)) if match else {})
    except (ValueError, SyntaxError, UsageError, MemoryError, RecursionError, *wheelfile.DAMAGED) as exc:
        report.add("FA3 build", "fail", f"flash_attn_config.py cannot be read: {exc}")
        return
    report.built_with = build.describe()
    report.add("FA3 build", "pass", build.describe() + (" (upstream's full build)" if build.full else ""))


def check_label(report: Any, label: re.Match[str] | None, torch_here: dict) -> None:
    """Its +cuNN against the torch it is next to: one CUDA major, torch >= 2.9."""
    if not torch_here:
        return
    if label is None:
        report.add("label", "skip", "no +cuNN label to compare with torch")
        return
    here, cuda = torch_here["torch"], torch_here.get("cuda")
    wrong = []
    if cuda is None:
        wrong.append(f"CUDA {label['cuda']}, but torch {here} is a CPU build")
    elif label["cuda"] != cuda.split(".")[0]:
        wrong.append(f"CUDA {label['cuda']}, not {cuda}")
    try:
        if Version(here.split("+")[0]) < STABLE_ABI_TORCH:
            wrong.append(f"torch >= {STABLE_ABI_TORCH}, not {here}")
    except InvalidVersion:
        wrong.append(f"a torch version, not {here!r}")
    if wrong:
        report.add("label", "fail", f"{label.group(0)} says {'; '.join(wrong)}")
    else:
        report.add("label", "pass", f"{label.group(0)} fits torch {here} (CUDA {cuda})")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """It adds no command of its own to the builder."""
