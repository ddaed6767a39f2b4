"""Prepare and compile: from a flash-attn version (or sdist) to a verified wheel.

``prepare`` needs neither a GPU nor nvcc: it fetches and unpacks the source, reads the
installed torch, sizes the parallelism and writes the settings. ``compile_wheel`` runs
setup.py through the shim, then hands the wheel to the verifier before accepting it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from . import dist as dist_dir
from . import environment, generations, manylinux, source
from .compiler_cache import CacheStats, CompilerCache
from .contract import MILESTONE, SETTINGS_FILE, parse_phase_mark
from .errors import BuildFailed, SourceError, UsageError
from .generations import fa3
from .settings import BuildSettings, local_version_label
from .shards import Shard, check_shards_done, require_compiler_cache, write_record
from .timeline import Timeline
from .verify import accept_wheel

# gcc/nvcc diagnostics ("x.cu:1:2: error: ...", "fatal error: ..."), not setuptools' traceback.
COMPILER_ERROR = re.compile(r"(?:^|[:)] )(?:fatal )?error(?: [A-Z]+\d+)?: ")


def prepare(
    *,
    version: str | None,
    sdist: Path | None,
    work_dir: Path,
    archs: tuple[str, ...],
    ptx: bool = False,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    sha256: str | None = None,
    index_url: str = source.PYPI_SIMPLE,
    sources_dir: Path | None = None,
    allow_untested: bool = False,
    expect_cxx11_abi: bool | None = None,
    expect_cuda: str | None = None,
    python: str = sys.executable,
    torch: environment.TorchInfo | None = None,
    timeline: Timeline | None = None,
    fa3_build: fa3.Fa3Build | None = None,
    label_archs: bool = False,
) -> BuildSettings:
    """``torch``: what ``environment.probe_torch(python)`` said, if the caller asked already.
    ``fa3_build``: what a FlashAttention-3 build compiles (upstream's full build where None).
    ``label_archs``: the wheel's +label names its GPU class (a matrix of several classes)."""
    timeline = timeline or Timeline()
    gen = _generation(version, sdist)
    if gen is generations.FA4:
        raise UsageError(f"flash-attn {version} is FlashAttention-4: Python, with no wheel to compile")
    if gen is generations.FA2 and version is not None:
        source.check_supported(version, allow_untested=allow_untested)
    if torch is None:
        torch = environment.probe_torch(python)
        timeline.mark("torch probe")
    _check_torch(torch, expect_cxx11_abi=expect_cxx11_abi, expect_cuda=expect_cuda)
    local_version: str | None
    if gen is generations.FA3:
        build = fa3_build or fa3.Fa3Build()
        tree = _fa3_source(version=version, archive=sdist, work_dir=work_dir, sha256=sha256, sources_dir=sources_dir)
        _check_fa3(tree.version, torch)
        archs, local_version = build.archs, fa3.local_version_label(torch.cuda, build)
    else:
        sdist_path, sha = source.obtain_sdist(
            version=version,
            sdist=sdist,
            dest_dir=work_dir / "sdists",
            sha256=sha256,
            index_url=index_url,
            sources_dir=sources_dir,
        )
        tree = source.unpack(sdist_path, work_dir / "src", sha)
        if version is None:
            source.check_supported(tree.version, allow_untested=allow_untested)
        local_version = (
            local_version_label(
                cuda=torch.cuda, torch=torch.version, cxx11_abi=torch.cxx11_abi, archs=archs if label_archs else ()
            )
            if tree.honours_local_version
            else None
        )
    timeline.mark("sdist")
    warnings: list[str] = []
    if torch.cuda is None:
        warnings.append(
            f"torch {torch.version} is a CPU build: preparing works, but the build itself needs a CUDA build of torch"
        )
    if not tree.honours_local_version:
        warnings.append(f"flash-attn {tree.version} ignores FLASH_ATTN_LOCAL_VERSION; the wheel has no +label")
    par = environment.size_parallelism(targets=len(archs) + int(ptx), max_jobs=max_jobs, nvcc_threads=nvcc_threads)
    settings = BuildSettings(
        flash_attn=tree.version,
        python=torch.python,
        torch=torch.version,
        cuda=torch.cuda,
        cxx11_abi=torch.cxx11_abi,
        archs=archs,
        ptx=ptx and gen is generations.FA2,
        max_jobs=par.max_jobs,
        nvcc_threads=par.nvcc_threads,
        parallelism=par.reason,
        local_version=local_version,
        source_dir=str(tree.path),
        sdist=str(tree.sdist),
        sha256=tree.sha256,
        honours_cuda_archs_env=tree.honours_cuda_archs_env,
        fetches_toolchain=tree.fetches_toolchain,
        source_date_epoch=tree.source_date_epoch,
        warnings=tuple(warnings),
        generation=gen.number,
        fa3=dataclasses.asdict(build) if gen is generations.FA3 else None,
    )
    settings.write()
    return settings


def _generation(version: str | None, archive: Path | None) -> generations.Generation:
    """The generation a build names: its version's major (one no generation has is tried as
    flash-attn 2's sdist, as ``--allow-untested`` asks), or a local archive's name."""
    if version is not None:
        return generations.of_version(version, untested=True)
    if archive is not None and archive.name.startswith("flash_attn_3-"):
        return generations.FA3
    return generations.FA2


def _check_torch(torch: environment.TorchInfo, *, expect_cxx11_abi: bool | None, expect_cuda: str | None) -> None:
    if expect_cxx11_abi is not None and torch.cxx11_abi != expect_cxx11_abi:
        raise environment.EnvironmentProblem(
            f"torch {torch.version} uses cxx11_abi={torch.cxx11_abi}, but this build expects "
            f"{expect_cxx11_abi}; the wrong torch variant is installed"
        )
    if expect_cuda is not None and torch.cuda != expect_cuda:
        raise environment.EnvironmentProblem(
            f"torch {torch.version} is built for CUDA {torch.cuda or 'none (CPU)'}, but this build expects "
            f"CUDA {expect_cuda}; the wrong torch variant is installed"
        )


def _fa3_source(
    *, version: str | None, archive: Path | None, work_dir: Path, sha256: str | None, sources_dir: Path | None
) -> source.SourceTree:
    """FA3's pinned source archive: a local file, or its name in ``sources_dir``; never downloaded."""
    if archive is None:
        assert version is not None
        if sources_dir is None or not os.path.lexists(sources_dir / fa3.archive_name(version)):
            raise SourceError(
                f"no {fa3.archive_name(version)} in {sources_dir or 'a sources directory'}: FlashAttention-3 is not "
                "on PyPI, and its source archive is not downloaded while building",
                hint="make it with `fa-images source fa3` from clones of flash-attention and cutlass, "
                "and put it in packages.sdists",
            )
        if not sha256:  # a file found by its name is the pinned one only if its pin is checked
            raise UsageError(
                f"{fa3.archive_name(version)} is taken from {sources_dir} by its name: give --sha256, its pin "
                "(compat.yaml's flash_attn_3 sha256; `fa-images plan --json` shows it as sdist_sha256)",
                hint="or name the file itself with --sdist to build it unpinned",
            )
        archive = sources_dir / fa3.archive_name(version)
    elif not os.path.lexists(archive):
        raise UsageError(f"FA3 source archive {archive} does not exist")
    tree = fa3.unpack(archive, work_dir / "src", sha256)
    if version is not None and tree.version != version:
        raise SourceError(f"{archive.name} holds FlashAttention-3 {tree.version}, not {version}")
    return tree


def _check_fa3(version: str, torch: environment.TorchInfo) -> None:
    """FA3 is built on torch's stable ABI, for one CUDA major: refused where that cannot be."""
    if Version(torch.version.split("+")[0]) < fa3.STABLE_ABI_TORCH:
        raise environment.EnvironmentProblem(
            f"torch {torch.version}: fa-images builds FlashAttention-3 on torch's stable ABI, "
            f"from torch {fa3.STABLE_ABI_TORCH} on (one abi3 wheel for every later torch of a CUDA major)"
        )
    if torch.cuda is not None and (why := fa3.refuse_cuda(torch.cuda)):
        raise environment.EnvironmentProblem(why)


def build_environment(settings: BuildSettings, nvcc: environment.NvccInfo) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("FLASH_ATTENTION_FORCE_CXX11_ABI", "FLASH_ATTENTION_SKIP_CUDA_BUILD", "FLASH_ATTN_LOCAL_VERSION"):
        env.pop(var, None)  # each would silently change what gets built
    env.update(
        FLASH_ATTENTION_FORCE_BUILD="TRUE",  # never download a prebuilt wheel
        FLASH_ATTN_CUDA_ARCHS=";".join(settings.archs),
        TORCH_CUDA_ARCH_LIST=";".join(f"{a[:-1]}.{a[-1]}" for a in settings.archs),
        MAX_JOBS=str(settings.max_jobs),
        NVCC_THREADS=str(settings.nvcc_threads),
        CUDA_HOME=str(nvcc.cuda_home),
        PATH=f"{nvcc.path.parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    if settings.local_version:
        env["FLASH_ATTN_LOCAL_VERSION"] = settings.local_version
    if settings.source_date_epoch is not None:
        # A user's own SOURCE_DATE_EPOCH wins, as the reproducible-builds convention has it.
        env.setdefault("SOURCE_DATE_EPOCH", str(settings.source_date_epoch))
    return env


def compile_wheel(
    settings: BuildSettings,
    out_dir: Path,
    *,
    python: str = sys.executable,
    cache_dir: Path | None = None,
    shard: Shard | None = None,
    after_shards: Path | None = None,
    log=print,
    torch: environment.TorchInfo | None = None,
    timeline: Timeline | None = None,
) -> Path | None:
    """Compiles, verifies and moves the wheel into ``out_dir`` with a manifest beside it.

    With ``cache_dir``, nvcc runs through a compiler cache there (see compiler_cache). With
    ``shard``, only that shard's kernels are compiled into the cache, and ``out_dir`` gets the
    shard's record instead of a wheel (None is returned). With ``after_shards``, every shard
    recorded there must have finished from these inputs before anything is compiled (shards.py).
    ``torch``: the probe's answer where the caller has it (each probe imports torch, seconds).
    The log's last lines say how long each phase took (timeline.py), the compile and all else.
    """
    timeline = timeline or Timeline()
    settings, shard_count = _check_shards(settings, cache_dir=cache_dir, shard=shard, after_shards=after_shards)
    torch, nvcc = _probe_toolchain(python, torch, timeline)
    src = Path(settings.source_dir)
    dist = Path(tempfile.mkdtemp(prefix="fa-dist-", dir=src))
    cmd = _setup_command(python, src, dist, settings.generation)
    env = _setup_environment(settings, nvcc)
    log(
        f"{MILESTONE}compiling flash-attn {settings.flash_attn} for archs {','.join(settings.archs)} with nvcc "
        f"{nvcc.version}, MAX_JOBS={settings.max_jobs} NVCC_THREADS={settings.nvcc_threads}: {settings.parallelism}"
    )
    started = time.monotonic()
    cache = CompilerCache(cache_dir, basedirs=(torch.site_packages,)) if cache_dir else None
    output, stats = _run_setup(cmd, src, env, cache, nvcc, log=log, timeline=timeline)
    timeline.mark("compiler cache stats and stop")
    _log_cache_stats(stats, shard_count, log)
    if output.returncode != 0:
        raise BuildFailed(_diagnose(output))
    elapsed = time.monotonic() - started
    if shard is not None:
        _finish_shard(settings, out_dir, dist, shard, output.shard_lines, elapsed, log=log, timeline=timeline)
        return None
    return _finish_wheel(settings, out_dir, dist, elapsed, python=python, log=log, timeline=timeline)


def _check_shards(
    settings: BuildSettings, *, cache_dir: Path | None, shard: Shard | None, after_shards: Path | None
) -> tuple[BuildSettings, int | None]:
    """The settings a shard compiles with, and the number of shards a final run links (None: not one).

    Refused before any probe: a split without its cache, or a link before every shard finished."""
    require_compiler_cache(shard, after_shards, cache_dir)
    shard_count = check_shards_done(after_shards, settings) if after_shards else None
    if shard is not None:
        settings = dataclasses.replace(settings, shard=shard.index, shards=shard.count)
        settings.write()  # the shim reads the shard from the settings file
    return settings, shard_count


def _probe_toolchain(
    python: str, torch: environment.TorchInfo | None, timeline: Timeline
) -> tuple[environment.TorchInfo, environment.NvccInfo]:
    """The torch and nvcc this build compiles with, checked against each other."""
    torch = torch or environment.probe_torch(python)
    nvcc = environment.probe_nvcc()
    environment.check_toolchain(torch, nvcc)
    timeline.mark("toolchain probe")
    return torch, nvcc


def _setup_command(python: str, src: Path, dist: Path, gen: int) -> list[str]:
    """setup.py through the shim, which reads its settings file and puts the wheel into ``dist``;
    FA3's setup.py as it is: environment variables are all it reads (``fa3_environment``)."""
    if gen == generations.FA3.number:
        return [python, "setup.py", "bdist_wheel", "--dist-dir", str(dist)]
    return [
        python,
        "-m",
        "fa_images.builder.setup_shim",
        str(src / SETTINGS_FILE),
        "bdist_wheel",
        "--dist-dir",
        str(dist),
    ]


def fa3_environment(settings: BuildSettings, nvcc: environment.NvccInfo) -> dict[str, str]:
    """hopper/setup.py's environment: every knob it reads set here, none inherited."""
    build = settings.fa3_build or fa3.Fa3Build()
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


def _setup_environment(settings: BuildSettings, nvcc: environment.NvccInfo) -> dict[str, str]:
    if settings.generation == generations.FA3.number:
        if why := fa3.refuse_cuda(nvcc.version, fetches_toolchain=settings.fetches_toolchain):
            raise environment.EnvironmentProblem(f"nvcc {nvcc.version}: {why}")
        return fa3_environment(settings, nvcc)
    env = build_environment(settings, nvcc)
    # The shim is imported from this package wherever it lives (site-packages or a build context).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    return env


@dataclass
class _SetupOutput:
    """What the build keeps of setup.py's output, beyond echoing it: enough to say why it failed."""

    tail: list[str] = field(default_factory=list)  # the last 30 lines
    compiler_errors: list[str] = field(default_factory=list)  # the first 3 distinct gcc/nvcc errors
    shard_lines: list[str] = field(default_factory=list)  # the shim's shard milestones
    returncode: int = 0

    def add(self, line: str) -> None:
        self.tail = (self.tail + [line.rstrip()])[-30:]
        if line.startswith(f"{MILESTONE}shard "):
            self.shard_lines.append(line.rstrip())
        if len(self.compiler_errors) < 3 and COMPILER_ERROR.search(line) and line.strip() not in self.compiler_errors:
            self.compiler_errors.append(line.strip())


def _run_setup(
    cmd: list[str],
    src: Path,
    env: dict[str, str],
    cache: CompilerCache | None,
    nvcc: environment.NvccInfo,
    *,
    log: Callable[[str], None],
    timeline: Timeline,
) -> tuple[_SetupOutput, CacheStats | None]:
    """Runs setup.py (through the compiler cache, if any) and echoes its output; the cache's stats
    are read before the cache stops."""
    running: AbstractContextManager[dict[str, str]] = cache.running(nvcc.path, log=log) if cache else nullcontext({})
    with running as cache_env:
        env.update(cache_env)
        timeline.mark("compiler cache start")
        output = _stream_setup(cmd, src, env, timeline)
        timeline.mark("setup.py exit")
        stats = cache.stats(cache_env) if cache else None
    return output, stats


def _stream_setup(cmd: list[str], src: Path, env: dict[str, str], timeline: Timeline) -> _SetupOutput:
    output = _SetupOutput()
    with subprocess.Popen(
        cmd, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            phase = parse_phase_mark(line)
            if phase is not None:  # the shim's own timing, folded into this build's
                timeline.mark(*phase)
                continue
            sys.stdout.write(line)
            output.add(line)
    output.returncode = proc.returncode
    return output


def _log_cache_stats(stats: CacheStats | None, shard_count: int | None, log: Callable[[str], None]) -> None:
    if stats is None:
        return
    log(stats.line())
    if shard_count and stats.misses:
        log(
            f"{MILESTONE}warning: {stats.misses} kernels were not in the cache after {shard_count} shards: "
            "the shards ran with other paths or flags (same --work-dir and --compiler-cache?)"
        )


def _diagnose(output: _SetupOutput) -> str:
    """Why setup.py failed: the shim's own error line, else the compiler's first errors, else its last lines."""
    why = next((t for t in reversed(output.tail) if f"{MILESTONE}error" in t), None)
    if why is None and output.compiler_errors:
        why = "compilation failed: " + " | ".join(output.compiler_errors) + " (full log above)"
    if why:
        return why
    return f"setup.py bdist_wheel exited with {output.returncode}; last lines:\n  " + "\n  ".join(output.tail[-12:])


def _finish_shard(
    settings: BuildSettings,
    out_dir: Path,
    dist: Path,
    shard: Shard,
    shard_lines: list[str],
    elapsed: float,
    *,
    log: Callable[[str], None],
    timeline: Timeline,
) -> None:
    """A shard's ending: its record in ``out_dir``, and no wheel."""
    kernels = shard_kernels(shard_lines)
    done = write_record(out_dir, shard, kernels, settings)
    timeline.mark("dist")
    log(timeline.line())
    log(f"{MILESTONE}shard {shard}: {len(kernels)} kernels in the cache in {elapsed:.0f} s; no wheel ({done})")
    shutil.rmtree(dist, ignore_errors=True)


def _finish_wheel(
    settings: BuildSettings,
    out_dir: Path,
    dist: Path,
    elapsed: float,
    *,
    python: str,
    log: Callable[[str], None],
    timeline: Timeline,
) -> Path:
    """A wheel's ending: tagged, verified, and moved into ``out_dir`` with its record."""
    wheels = sorted(dist.glob("*.whl"))
    # Tagged before it is verified: the verifier checks the manylinux tag against the extension.
    wheels = [manylinux.tag_wheel(wheels[0], log)] if len(wheels) == 1 else wheels
    timeline.mark("platform tag")
    report = accept_wheel(
        wheels,
        expect_python=settings.python,
        expect_cxx11_abi=settings.cxx11_abi,
        expect_archs=settings.archs,
        log=log,
        python=python,
    )
    timeline.mark("verify")
    wheel = wheels[0]
    record = wheel_record(settings, wheel, report.sha256, elapsed)
    (final,) = dist_dir.add_wheels(out_dir, [dist_dir.Incoming(wheel, record, "this build")], move=True, log=log)
    shutil.rmtree(dist, ignore_errors=True)
    timeline.mark("dist")
    log(timeline.line())
    log(f"{MILESTONE}wheel {final} ({final.stat().st_size / 1e6:.1f} MB) built in {elapsed:.0f} s")
    return final


def shard_kernels(lines: list[str]) -> list[str]:
    """The kernels the shim says this shard compiled (its milestone line)."""
    for line in lines:
        if line.startswith(f"{MILESTONE}shard ") and " kernels:" in line:
            return line.split(" kernels:", 1)[1].split()
    return []


def wheel_record(settings: BuildSettings, wheel: Path, sha256: str, seconds: float) -> dist_dir.WheelRecord:
    """What the wheel is, what it was built against, and its sha256, for dist/manifest.json."""
    return dist_dir.WheelRecord.of(
        wheel, sha256, settings, sdist_sha256=settings.sha256, build_seconds=round(seconds, 1)
    )
