"""Prepare and compile: from a flash-attn version (or sdist) to a verified wheel.

``prepare`` needs neither a GPU nor nvcc: it fetches and unpacks the source, reads the
installed torch, sizes the parallelism and writes the settings. ``compile_wheel`` runs
setup.py through the shim, then hands the wheel to the verifier before accepting it.
"""

from __future__ import annotations

import dataclasses
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

from . import dist as dist_dir
from . import environment, generations, manylinux, source
from .compiler_cache import CacheStats, CompilerCache
from .contract import MILESTONE, SETTINGS_FILE, parse_phase_mark
from .errors import BuildFailed
from .generations.steps import SourceRequest
from .settings import BuildSettings
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
    knobs: dict | None = None,
    label_archs: bool = False,
) -> BuildSettings:
    """``torch``: what ``environment.probe_torch(python)`` said, if the caller asked already.
    ``knobs``: the generation's own settings (what its build compiles; its defaults
    where None). ``label_archs``: the wheel's +label names its GPU class (a matrix of several classes).
    The generation is the version's (or the archive's name's), and its module prepares the source."""
    timeline = timeline or Timeline()
    gen = (
        generations.of_version(version, untested=True)
        if version is not None
        else generations.of_archive(sdist.name if sdist else "")
    )
    steps = gen.steps()
    if torch is None:
        torch = environment.probe_torch(python)
        timeline.mark("torch probe")
    _check_torch(torch, expect_cxx11_abi=expect_cxx11_abi, expect_cuda=expect_cuda)
    request = SourceRequest(
        version=version,
        sdist=sdist,
        work_dir=work_dir,
        sha256=sha256,
        index_url=index_url,
        sources_dir=sources_dir,
        archs=archs,
        label_archs=label_archs,
        allow_untested=allow_untested,
        knobs=knobs,
    )
    prepared = steps.prepare_source(request, torch)
    tree, archs, local_version = prepared.tree, prepared.archs, prepared.local_version
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
        ptx=ptx and prepared.ptx,
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
        knobs=prepared.knobs,
    )
    settings.write()
    return settings


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
    steps = generations.of_number(settings.generation).steps()
    env = steps.setup_environment(settings, nvcc)
    cmd = steps.setup_command(python, src, dist, src / SETTINGS_FILE)
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
