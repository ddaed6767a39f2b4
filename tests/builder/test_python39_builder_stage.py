"""The builder stage of a Python 3.9 entry, carried out for real under CPython 3.9.

No test builds a Python 3.9 image, so here, for every flash-attn version of the compat table,
the builder stage of the Dockerfile rendered for Python 3.9 (with the newest torch that ships
cp39 wheels, 2.8.0, ``bases.python: system`` and one base for devel and runtime, so that the
builder stands on the torch stage) is carried out, with the python and torch stages under it,
instruction by instruction in a chroot of Debian bullseye, whose python3.9 is CPython 3.9: their
ENV, their RUNs as written (the venv and the image's user, torch by pip, the build tools at
their 3.9 pins by pip from PyPI into /opt/build-tools; git, which the base lacks, by its
apt-get, as the stage would with dnf on a RHEL-family base) and the builder's COPYs from the entry's real build context
(``fa_images.outputs.context.assemble``). The CUDA 12.4 toolkit of tests/toolchain.py stands in
for the CUDA devel base at /usr/local/cuda, as in the engine tests.

The compile RUN runs as rendered plus ``--prepare-only``; then flash-attn's setup.py runs through
the shim, in the environment ``compile_wheel`` gives it, with ``--version`` where the build says
``bdist_wheel``: every line of setup.py runs (torch, setuptools, git, nvcc), no kernel compiles.

Kept in the test cache: the cp39 wheels that the torch 2.9.1 wheelhouse lacks (1.4 GB) and the
bullseye rootfs (about 100 MB gzipped). The installed stage (6.4 GB, mostly torch's CUDA
libraries) lives in a scratch directory that is removed when the module ends; the CUDA libraries
it shares with the tests' torch venv are hard links to the venv's files, so it adds about 2.5
GB to the disk. Needs root (a mount namespace and chroot), debootstrap and PyPI.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import engine_env
import pytest
import toolchain
import yaml
from packaging.version import Version

from fa_images.builder.source import obtain_sdist
from fa_images.config import compat
from fa_images.config import matrix as matrix_mod
from fa_images.outputs import context

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a private mount namespace and chroot"),
]

PYTHON = "3.9"
SUITE = "bullseye"  # its python3 is CPython 3.9
# The base besides CUDA: python3.9 with its venv module (bases.python: system). No git: the
# builder stage installs it through the base's package manager (fa_images/outputs/os_packages.py).
PACKAGES = ("python3", "python3-venv", "ca-certificates")
VERSIONS = sorted(compat.load().flash_attn, key=Version)
# flash-attn versions whose setup.py runs `git submodule` whatever the environment.
GIT_CALLING = ("2.5.9.post1", "2.6.3")
# Where the rendered stage's pip finds torch (packages.find_links), inside the chroot.
WHEELS_CP39 = "/opt/wheels/cp39"
WHEELS_SHARED = "/opt/wheels/shared"
CUDA_HOME = "/usr/local/cuda"
# The CUDA devel base's environment, as the engine tests' stand-in sets it (engine_env).
BASE_ENV = {
    "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "CUDA_HOME": CUDA_HOME,
    "HOME": "/root",
}
# pip in the chroot trusts what the host trusts (a host behind a TLS-inspecting proxy adds its CA here).
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
COMPILE_COMMAND = "python -m fa_images.builder wheel"

# compile_wheel's own steps before the compile (probe torch and nvcc, check them, the build
# environment, the shim on PYTHONPATH), then the shim with the arguments given instead of bdist_wheel.
DRIVER = """\
import os, subprocess, sys
from pathlib import Path
from fa_images.builder import build, environment
from fa_images.builder.generations import fa2
from fa_images.builder.contract import SETTINGS_FILE
from fa_images.builder.settings import BuildSettings

settings = BuildSettings.read(Path(sys.argv[1]))
nvcc = environment.probe_nvcc()
environment.check_toolchain(environment.probe_torch(), nvcc)
env = fa2.build_environment(settings, nvcc)
package_root = str(Path(build.__file__).resolve().parents[2])
env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
src = Path(settings.source_dir)
shim = [sys.executable, "-m", "fa_images.builder.setup_shim", str(src / SETTINGS_FILE), *sys.argv[2:]]
sys.exit(subprocess.run(shim, cwd=src, env=env).returncode)
"""


def newest_torch_for(python: str) -> str:
    return max((t for t, release in compat.load().torch.items() if python in release.pythons), key=Version)


# --- a chroot whose mounts live and die with one command ----------------------------------


@dataclass(frozen=True)
class Chroot:
    root: Path
    binds: tuple[tuple[Path, str, bool], ...] = ()  # (host path, path inside, read-only)

    def run(self, command: str, env: Mapping[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """``sh -c command`` inside, with exactly ``env``.

        The mounts are made in a private mount namespace, and the command runs as pid 1 of its
        own pid namespace: when it ends or is killed, every mount and process goes with it.
        """
        q = shlex.quote
        steps = [
            f"mount -t proc proc {q(str(self.root / 'proc'))}",
            f"mount --rbind /dev {q(str(self.root / 'dev'))}",
            f"mount -t sysfs -o ro sysfs {q(str(self.root / 'sys'))}",
            f"mount --bind /etc/resolv.conf {q(str(self.root / 'etc/resolv.conf'))}",
        ]
        if HOST_CA_BUNDLE.is_file():
            steps.append(f"mount -o bind,ro {HOST_CA_BUNDLE} {q(str(self.root / str(HOST_CA_BUNDLE).lstrip('/')))}")
        for host, inside, read_only in self.binds:
            options = "-o bind,ro" if read_only else "--bind"
            steps.append(f"mount {options} {q(str(host))} {q(str(self.root / inside.lstrip('/')))}")
        inner = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "/bin/sh", "-c", command]
        steps.append(f"exec chroot {q(str(self.root))} {shlex.join(inner)}")
        unshare = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child"]
        return subprocess.run(
            [*unshare, "/bin/sh", "-c", " && ".join(steps)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=engine_env.child_env(False),
        )

    def check(self, command: str, env: Mapping[str, str], timeout: float = 900) -> str:
        proc = self.run(command, env, timeout)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout


def chroot_env() -> dict[str, str]:
    env = dict(BASE_ENV)
    if HOST_CA_BUNDLE.is_file():
        env["PIP_CERT"] = str(HOST_CA_BUNDLE)
    env.update({k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")})
    return env


def share_files_with(stage_site: Path, other_site: Path, min_size: int = 1 << 20) -> int:
    """Hard-link each file of at least ``min_size`` that the stage installed from a wheel which
    ``other_site`` holds too, where both RECORDs give the same path, sha256 and size, to the
    other's copy; return the bytes shared. torch 2.8.0 and the tests' torch 2.9.1 pin the same
    wheels of most CUDA libraries (13 of 14), 3.9 of the stage's 6.4 GB: the stage then holds them
    once on disk, beside the engine tier's 7 GB stages. Only the stage's names are replaced; the
    other's files are read by the stage, never written."""
    shared = 0
    for record in stage_site.glob("*.dist-info/RECORD"):
        twin = other_site / record.parent.name / "RECORD"
        if not twin.is_file():
            continue
        theirs = {tuple(row) for row in csv.reader(twin.read_text().splitlines()) if len(row) == 3}
        for row in csv.reader(record.read_text().splitlines()):
            if len(row) != 3 or tuple(row) not in theirs or not row[2].isdigit() or int(row[2]) < min_size:
                continue
            relative = Path(row[0])
            if relative.is_absolute() or ".." in relative.parts:
                continue
            ours, source = stage_site / relative, other_site / relative
            if ours.is_symlink() or source.is_symlink() or not source.is_file() or ours.samefile(source):
                continue  # (a rename onto another name of the same file does nothing: none is made)
            if ours.stat().st_size != int(row[2]) or source.stat().st_size != int(row[2]):
                continue
            link = ours.with_name(ours.name + ".fa-images-link")
            os.link(source, link)
            os.replace(link, ours)
            shared += int(row[2])
    return shared


def unpack_rootfs(tarball: Path, root: Path) -> None:
    root.mkdir()
    subprocess.run(["tar", "--numeric-owner", "-xzf", str(tarball), "-C", str(root)], check=True)
    (root / "etc" / "resolv.conf").touch()  # a mount point: the rootfs leaves the build host's out
    for inside in (CUDA_HOME, WHEELS_CP39, WHEELS_SHARED):
        (root / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)


def cp39_wheelhouse(root: Path, torch: str, shared: Path) -> Path:
    """The wheels of ``torch`` for cp39 that the shared (torch 2.9.1) wheelhouse lacks, cached.

    Resolved by pip on the chroot's own Python 3.9, not by this Python with --python-version:
    environment markers (triton needs importlib-metadata below 3.10) follow the interpreter.
    """
    dest = toolchain.cache_dir() / f"wheelhouse-torch{torch}-cp{PYTHON.replace('.', '')}"
    spec = {"torch": torch, "python": PYTHON, "suite": SUITE, "shared": shared.name}
    if toolchain._is_ready(dest, spec):
        return dest
    with toolchain._lock(dest):
        if toolchain._is_ready(dest, spec):
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        # pip download would copy the shared wheels it takes from --find-links into --dest:
        # linked there first, they are neither copied nor written again, only unlinked after.
        toolchain.link_pure_wheels(shared, dest)
        chroot = Chroot(root, ((dest, WHEELS_CP39, False), (shared, WHEELS_SHARED, True)))
        chroot.check(
            f"python3.9 -m venv /var/tmp/download && /var/tmp/download/bin/pip download --only-binary=:all: "
            f"--dest {WHEELS_CP39} --find-links {WHEELS_SHARED} torch=={torch}",
            {**chroot_env(), "PIP_NO_CACHE_DIR": "1"},
            timeout=3000,
        )
        # Keep only what the shared wheelhouse lacks.
        for wheel in dest.glob("*.whl"):
            if (shared / wheel.name).is_file():
                wheel.unlink()
        toolchain._mark(dest, spec)
    return dest


# --- the rendered stage, instruction by instruction --------------------------------------


# The stages the builder stands on, in the order they build: with one base for devel and
# runtime, FROM base AS python, FROM python AS torch, FROM torch AS builder.
CHAIN = ("python", "torch", "builder")


def builder_stage(dockerfile: str) -> str:
    """The builder stage with the stages under it, as one run of instructions."""
    parts = {}
    for stage in CHAIN:
        header = re.search(rf"^FROM (\S+) AS {stage}$", dockerfile, flags=re.M)
        assert header, stage
        parts[stage] = dockerfile[header.end() :].split("\nFROM ")[0]
    assert re.search(r"^FROM torch AS builder$", dockerfile, flags=re.M), "the builder stands on the torch stage"
    return "\n".join(parts[stage] for stage in CHAIN)


def instructions(stage: str) -> list[tuple[str, str]]:
    """(keyword, arguments) of each instruction; continuation lines joined as Docker joins them."""
    out: list[tuple[str, str]] = []
    logical = ""
    for line in stage.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # Docker drops comment lines, inside a continued instruction too
        if line.endswith("\\"):
            logical += line[:-1]
            continue
        keyword, _, args = (logical + line).strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        logical = ""
    return out


def apply_env(args: str, env: dict[str, str]) -> None:
    """ENV K=V ...: each value with $VAR and ${VAR} replaced by the values before the instruction."""
    before = dict(env)
    for pair in shlex.split(args):
        key, _, value = pair.partition("=")
        env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: before.get(m.group(1), ""), value)


@dataclass
class StageEntry:
    version: str
    context: Path  # the build context fa-images would send to the engine
    copies: list[tuple[str, str]]  # COPY source (in the context), destination
    compile_run: str
    env: dict[str, str]  # the stage's environment at the compile RUN


@dataclass
class Stage:
    chroot: Chroot
    torch: str
    entries: dict[str, StageEntry] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def enter(self, version: str) -> StageEntry:
        """The version's COPYs into the stage, as its build context holds them."""
        entry = self.entries[version]
        shutil.rmtree(self.chroot.root / "opt" / "fa-images", ignore_errors=True)
        for source, dest in entry.copies:
            shutil.copytree(entry.context / source, self.chroot.root / dest.lstrip("/"), dirs_exist_ok=True)
        return entry


def render_entries(project: Path, torch: str) -> tuple[matrix_mod.Matrix, list[matrix_mod.Entry]]:
    project.mkdir()
    (project / "matrix.yaml").write_text(
        yaml.safe_dump(
            {
                # One base for both: the builder is the torch stage's own chain, with nothing copied.
                "bases": {"python": "system", "runtime": "nvidia/cuda:{cuda_release}-devel-ubuntu22.04"},
                "packages": {"torch_index": None, "find_links": [WHEELS_CP39, WHEELS_SHARED]},
                "entries": [{"python": PYTHON, "torch": torch, "flash_attn": v, "archs": ["80"]} for v in VERSIONS],
            },
            sort_keys=False,
        )
    )
    m = matrix_mod.load(project / "matrix.yaml")
    return m, list(m.entries)


@pytest.fixture(scope="module")
def stage(sdist_cache: Path) -> Iterator[Stage]:
    seconds: dict[str, float] = {}
    started = time.monotonic()
    torch = newest_torch_for(PYTHON)
    shared = toolchain.torch_wheelhouse()
    cuda = toolchain.cuda_home()
    tarball = engine_env.debian_rootfs(SUITE, PACKAGES)
    seconds["caches"] = time.monotonic() - started
    # On disk, not tmpfs: the installed stage is 6.4 GB.
    scratch = Path(tempfile.mkdtemp(prefix="fa-images-py39-stage-"))
    try:
        root = scratch / "root"
        started = time.monotonic()
        unpack_rootfs(tarball, root)
        wheels = cp39_wheelhouse(root, torch, shared)
        seconds["rootfs and cp39 wheels"] = time.monotonic() - started
        chroot = Chroot(root, ((cuda, CUDA_HOME, True), (wheels, WHEELS_CP39, True), (shared, WHEELS_SHARED, True)))
        result = Stage(chroot, torch, seconds=seconds)

        m, entries = render_entries(scratch / "project", torch)
        setups: set[tuple[tuple[str, str], ...]] = set()
        for entry in entries:
            sdist, _ = obtain_sdist(
                version=entry.flash_attn,
                sdist=None,
                dest_dir=sdist_cache,
                sources_dir=sdist_cache,
                sha256=entry.sdist_sha256,
            )
            (scratch / "contexts" / entry.flash_attn).mkdir(parents=True)
            ctx = context.assemble(m, entry, sdist, scratch / "contexts" / entry.flash_attn, form="sdk")
            steps = instructions(builder_stage((ctx / "Dockerfile").read_text()))
            first_copy = next(i for i, (keyword, _) in enumerate(steps) if keyword == "COPY")
            compile_at = next(i for i, (_, args) in enumerate(steps) if COMPILE_COMMAND in args)
            setups.add(tuple(steps[:first_copy]))
            env = chroot_env()
            for keyword, args in steps[:compile_at]:
                if keyword == "ENV":
                    apply_env(args, env)
            copies = [tuple(args.split()) for keyword, args in steps[first_copy:compile_at] if keyword == "COPY"]
            assert all(len(c) == 2 for c in copies), copies  # no --from or --chown in this stage
            assert [k for k, _ in steps[first_copy:compile_at]] == ["COPY"] * len(copies)
            result.entries[entry.flash_attn] = StageEntry(
                entry.flash_attn, ctx, [(c[0], c[1]) for c in copies], steps[compile_at][1], env
            )
        # One environment serves every version: the stages differ from the first COPY on only.
        # The Python's venv, then torch's CUDA libraries a RUN each, torch, the build tools.
        (setup,) = setups
        libraries = ["RUN"] * len(entries[0].torch_libraries)
        assert libraries and [k for k, _ in setup] == ["ENV", "RUN", "ENV", *libraries, "RUN", "RUN"], setup

        started = time.monotonic()
        env = chroot_env()
        venv_site = next((toolchain.torch_venv() / "lib").glob("python3.*/site-packages"))
        stage_site = root / "opt" / "venv" / "lib" / f"python{PYTHON}" / "site-packages"
        linked = 0
        for keyword, args in setup:
            if keyword == "ENV":
                apply_env(args, env)
            else:
                chroot.check(args, env, timeout=1500)
                # After each RUN: the stage's disk is never more than one RUN above what it adds.
                linked += share_files_with(stage_site, venv_site)
        seconds["stage RUNs"] = time.monotonic() - started
        print(f"python 3.9 builder stage: {linked / 1e9:.1f} GB of its files shared with the torch venv")
        yield result
    finally:
        started = time.monotonic()
        engine_env._unmount_under(scratch, include_self=False)  # none outlive a command; make sure
        shutil.rmtree(scratch)
        print(
            f"python 3.9 builder stage: removed in {time.monotonic() - started:.0f} s; "
            + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
        )


_PREPARES = itertools.count()


def prepare(stage: Stage, version: str) -> dict:
    """The compile RUN as rendered, plus --prepare-only: fetch, check and unpack; settle the settings."""
    entry = stage.enter(version)
    assert entry.compile_run.rstrip().endswith("--out /wheels"), entry.compile_run
    # A work dir per call: with the compiler cache the builder's work dir has a fixed name, and
    # --keep-work leaves it behind, so a second prepare of the same version needs its own parent.
    work = f"/var/tmp/fa-work-{version}-{next(_PREPARES)}"
    out = stage.chroot.check(f"{entry.compile_run} --work-dir {work} --keep-work --prepare-only --json", entry.env)
    return json.loads(out)


def run_setup_py(stage: Stage, version: str, settings: dict, prefix: str) -> subprocess.CompletedProcess[str]:
    settings_file = f"{settings['source_dir']}/fa_images_build.json"
    command = f"{prefix} python -c {shlex.quote(DRIVER)} {shlex.quote(settings_file)} --version"
    return stage.chroot.run(command, stage.entries[version].env)


def compile_prefix(entry: StageEntry) -> str:
    """What the compile RUN sets before it calls the builder: the build tools on the paths."""
    prefix, _, _ = entry.compile_run.partition(COMPILE_COMMAND)
    assert prefix.strip() == "PYTHONPATH=/opt/build-tools:/opt/fa-images PATH=/opt/build-tools/bin:$PATH", prefix
    return prefix.strip()


# --- the tests ------------------------------------------------------------------------------


def test_the_stage_is_python_39_with_the_pinned_tools_and_torch(stage: Stage) -> None:
    entry = stage.entries[VERSIONS[-1]]
    tools = compat.load().tools_for(PYTHON)
    names = sorted(p.partition("==")[0] for p in tools)
    probe = (
        "import json, sys, importlib.metadata as md, torch; print(json.dumps({'python': sys.version, "
        "'torch': torch.__version__, 'cuda': torch.version.cuda, 'tools': {n: md.version(n) for n in "
        + repr(names)
        + "}}))"
    )
    out = stage.chroot.check(f"{compile_prefix(entry)} python -c {shlex.quote(probe)}", entry.env)
    found = json.loads(out.strip().splitlines()[-1])
    assert found["python"].startswith("3.9."), found
    assert found["torch"] == f"{stage.torch}+cu128" and found["cuda"] == "12.8", found
    assert {f"{n}=={v}" for n, v in found["tools"].items()} == set(tools)  # setuptools==82.0.1 among them
    assert "setuptools==82.0.1" in tools
    git = stage.chroot.check("git --version", entry.env)
    assert git.startswith("git version"), git


@pytest.mark.parametrize("version", VERSIONS)
def test_setup_py_runs_in_the_python_39_builder_stage(stage: Stage, version: str) -> None:
    started = time.monotonic()
    settings = prepare(stage, version)
    assert (settings["flash_attn"], settings["python"]) == (version, PYTHON), settings
    assert (settings["torch"], settings["cuda"], settings["cxx11_abi"]) == (f"{stage.torch}+cu128", "12.8", True)
    assert settings["archs"] == ["80"]

    proc = run_setup_py(stage, version, settings, compile_prefix(stage.entries[version]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    corrected = [line for line in lines if line.startswith("[fa-images] flash_attn_2_cuda: ")]
    assert len(corrected) == 1 and "-D_GLIBCXX_USE_CXX11_ABI=1, archs 80 (" in corrected[0], proc.stdout[-3000:]
    label = settings["local_version"]
    assert lines[-1] == (f"{version}+{label}" if label else version), proc.stdout[-3000:]
    print(f"flash-attn {version}: setup.py --version under Python 3.9 in {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize("version", GIT_CALLING)
def test_without_git_the_same_setup_py_fails(stage: Stage, version: str) -> None:
    """The check can fail: with git off the PATH, setup.py dies as the issue reported."""
    settings = prepare(stage, version)
    proc = run_setup_py(stage, version, settings, "PYTHONPATH=/opt/build-tools:/opt/fa-images PATH=/opt/venv/bin")
    assert proc.returncode != 0 and "No such file or directory: 'git'" in proc.stderr, proc.stderr[-3000:]


def test_python_39_refuses_the_default_setuptools_pin(stage: Stage) -> None:
    """Why 3.9 has its own pin: the default one needs Python 3.10, and this pip on PyPI knows it."""
    (default,) = [p for p in compat.load().build_tools if p.startswith("setuptools==")]
    entry = stage.entries[VERSIONS[-1]]
    proc = stage.chroot.run(
        f"pip install -v --target /var/tmp/refused --index-url https://pypi.org/simple {default}", entry.env
    )
    out = proc.stdout + proc.stderr
    refused = [line for line in out.splitlines() if "requires a different Python" in line]
    assert proc.returncode != 0 and any(default.partition("==")[2] in line for line in refused), out[-3000:]
