"""The stock flash-attn build beside fa-images' builder, in one run on one machine.

    python bench/side_by_side.py SDIST --archs 90 --out OUTDIR [--kernels N] [--builds cold,warm,stock]

Three builds of the same sdist, one after the other, with the Python that runs this script:

- ``stock``: ``setup.py bdist_wheel`` in the unpacked sdist, with flash-attn's own defaults
  (its MAX_JOBS rule, its nvcc threads) except the arch (``FLASH_ATTN_CUDA_ARCHS``) and
  ``FLASH_ATTENTION_FORCE_BUILD=TRUE``, as the field reports do it;
- ``cold`` (fa-images): ``python -m fa_images.builder wheel`` with its default sizing and an
  empty compiler cache (P1);
- ``warm`` (fa-images, cache warm): the same again through the cache the cold build left. The
  kernels are keyed without Python (no ``.cu`` includes Python.h), so this is what each further
  Python of a compile group costs; the Python-specific part (``flash_api.cpp``, the link) is
  rebuilt (P2).

``--kernels N`` builds all three from a trimmed copy of the sdist that compiles N of its kernels
(bench/trim_sdist.py: the same N, chosen by the cost model, for the same sdist), so that the
three fit in one short hold of a machine; the copy and its kernels are recorded.

For each: wall time, ninja's span and the time outside it, ninja's steps, the bound max(longest
step, sum of steps / CPUs), wall / bound, the peak memory (bench/peak_memory.py: a cgroup of the
build's own where one can be made, else the process trees of the build and of the cache server;
the method is recorded), the kernels taken from the cache, and for fa-images the builder's own
time by phase. Writes OUTDIR/results.json after each build, and OUTDIR/results.md at the end.
Needs a CUDA torch, nvcc, ninja and (for the cache) sccache on PATH; no network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ninja_costs import floor, read_steps  # noqa: E402  (beside this script)
from peak_memory import Memory, Meter, make_cgroup  # noqa: E402
from trim_sdist import trim  # noqa: E402

from fa_images.builder.contract import COMPILE_PHASE, parse_cache_stats, parse_phases  # noqa: E402

BUILDS = ("stock", "cold", "warm")
TITLES = {"stock": "stock", "cold": "fa-images", "warm": "fa-images, cache warm"}


@dataclass(frozen=True)
class Run:
    name: str
    rc: int
    wall_s: float
    ninja_s: float  # ninja's own span, from its log
    outside_ninja_s: float  # wall - ninja: unpacking, setup.py, the link, the zip, verification...
    steps: int
    steps_sum_s: float
    longest_s: float
    bound_s: float  # max(longest step, sum of steps / CPUs): no schedule beats it
    wall_over_bound: float | None
    memory: Memory
    kernels: int | None
    kernels_from_cache: int | None
    phases: list[tuple[str, float]] | None  # the builder's own account (fa-images only)
    log: str


def _measure(
    cmd: list[str], cwd: Path, env: dict[str, str], log: Path, cache: Path | None
) -> tuple[int, float, Memory]:
    """Runs ``cmd`` with its output in ``log``; returns (exit code, wall s, its memory)."""
    group, why = make_cgroup(f"fa-bench-{os.getpid()}-{log.stem}")
    if group is None:
        print(f"memory: {why}; summing process trees instead", flush=True)
    meter = Meter(cache, group)
    with log.open("w") as out:
        started = time.monotonic()
        cmd = group.wrap(cmd) if group else cmd
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        meter.start(proc.pid)
        rc = proc.wait()
        wall = time.monotonic() - started
    memory = meter.stop()
    if group is not None:
        group.remove()
    return rc, wall, memory


def _ninja_log(under: Path, keep_as: Path) -> Path | None:
    """The newest .ninja_log under ``under``, copied to ``keep_as`` (the build dir is removed)."""
    logs = sorted(under.rglob(".ninja_log"), key=lambda p: p.stat().st_mtime)
    return Path(shutil.copy(logs[-1], keep_as)) if logs else None


def _result(name: str, rc: int, wall: float, memory: Memory, ninja_log: Path | None, log: Path) -> Run:
    steps = read_steps(ninja_log) if ninja_log else []
    durations = [end - start for start, end, _ in steps]
    span = max((end for _, end, _ in steps), default=0.0)  # ninja's times count from its own start
    bound = floor(durations, os.cpu_count() or 1)
    cache, phases = None, None
    for line in log.read_text(errors="replace").splitlines():
        cache = parse_cache_stats(line) or cache
        phases = parse_phases(line) or phases
    return Run(
        name=name,
        rc=rc,
        wall_s=round(wall, 1),
        ninja_s=round(span, 1),
        outside_ninja_s=round(wall - span, 1),
        steps=len(steps),
        steps_sum_s=round(sum(durations), 1),
        longest_s=round(max(durations, default=0.0), 1),
        bound_s=round(bound, 1),
        wall_over_bound=round(wall / bound, 2) if bound else None,
        memory=memory,
        kernels=cache[1] if cache else None,
        kernels_from_cache=cache[0] if cache else None,
        phases=phases,
        log=log.name,
    )


def stock(sdist: Path, archs: str, out: Path, env: dict[str, str]) -> Run:
    src = out / "stock"
    src.mkdir()
    with tarfile.open(sdist) as tar:
        tar.extractall(src, filter="data")
    (root,) = [p for p in src.iterdir() if (p / "setup.py").is_file()] or [src]
    stock_env = {**env, "FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": archs.replace(",", ";")}
    for var in ("MAX_JOBS", "NVCC_THREADS"):
        stock_env.pop(var, None)  # flash-attn's own defaults
    log = out / "stock.log"
    rc, wall, memory = _measure([sys.executable, "setup.py", "bdist_wheel"], root, stock_env, log, None)
    result = _result("stock", rc, wall, memory, _ninja_log(root / "build", out / "stock.ninja_log"), log)
    shutil.rmtree(src, ignore_errors=True)  # its objects: GBs on a full build
    return result


def fa_images(name: str, sdist: Path, archs: str, out: Path, env: dict[str, str]) -> Run:
    work, log, cache = out / "work", out / f"{name}.log", (out / "cache").resolve()
    cmd = [sys.executable, "-m", "fa_images.builder", "wheel", "--sdist", str(sdist), "--archs", archs]
    cmd += ["--out", str(out / name), "--work-dir", str(work), "--keep-work", "--compiler-cache", str(cache)]
    rc, wall, memory = _measure(cmd, out, env, log, cache)
    result = _result(name, rc, wall, memory, _ninja_log(work, out / f"{name}.ninja_log"), log)
    shutil.rmtree(work, ignore_errors=True)  # the next build finds the same (fixed) work dir free
    return result


def table(runs: list[Run]) -> str:
    columns = ["build", "rc", "wall s", "ninja s", "outside ninja s", "steps", "sum of steps s", "longest s"]
    columns += ["bound s", "wall / bound", "peak memory GiB", "kernels from cache"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for r in runs:
        cached = f"{r.kernels_from_cache} of {r.kernels}" if r.kernels is not None else "-"
        lines.append(
            f"| {TITLES[r.name]} | {r.rc} | {r.wall_s:.0f} | {r.ninja_s:.0f} | {r.outside_ninja_s:.0f} | {r.steps} | "
            f"{r.steps_sum_s:.0f} | {r.longest_s:.0f} | {r.bound_s:.0f} | "
            f"{r.wall_over_bound if r.wall_over_bound is not None else '-'} | {r.memory.peak_gib} | {cached} |"
        )
    return "\n".join(lines)


def memory_table(runs: list[Run]) -> str:
    columns = ["build", "method", "peak GiB", "kernel's peak, page cache too, GiB", "process trees GiB"]
    lines = ["| " + " | ".join([*columns, "cache server pids"]) + " |"]
    lines.append("|---|---|---|---|---|---|")
    for r in runs:
        m = r.memory
        kernel = "-" if m.kernel_peak_gib is None else m.kernel_peak_gib
        lines.append(
            f"| {TITLES[r.name]} | {m.method} | {m.peak_gib} | {kernel} | {m.tree_peak_gib} | {m.cache_server_pids} |"
        )
    return "\n".join(lines)


def phase_table(runs: list[Run]) -> str:
    """The builder's time by phase, one column per fa-images build."""
    timed = [r for r in runs if r.phases]
    if not timed:
        return ""
    names: list[str] = []
    for r in timed:
        names += [n for n, _ in r.phases or [] if n not in names]
    lines = ["| phase | " + " | ".join(f"{TITLES[r.name]} s" for r in timed) + " |", "|---" * (len(timed) + 1) + "|"]
    for name in [*names, "outside ninja"]:
        cells = []
        for r in timed:
            seconds = dict(r.phases or [])
            outside = sum(s for n, s in seconds.items() if n != COMPILE_PHASE)
            value = outside if name == "outside ninja" else seconds.get(name)
            cells.append("-" if value is None else f"{value:.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> dict:
    import torch  # the one the builds compile against

    cuda_home = os.environ.get("CUDA_HOME")  # the nvcc the builds use: CUDA_HOME's, else PATH's
    nvcc_path = str(Path(cuda_home, "bin", "nvcc")) if cuda_home else "nvcc"
    nvcc = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nvcc": nvcc[-1] if nvcc else None,
        "kernel": platform.release(),
    }


def summary(runs: list[Run], facts: dict) -> dict:
    by = {r.name: r for r in runs}
    cold, warm, stock_run = by.get("cold"), by.get("warm"), by.get("stock")
    return {
        **facts,
        "runs": [asdict(r) for r in runs],
        "P1_wall_over_bound": cold.wall_over_bound if cold else None,
        "P2_two_pythons_over_one": round((cold.wall_s + warm.wall_s) / cold.wall_s, 2) if cold and warm else None,
        "fa_images_over_stock": round(cold.wall_s / stock_run.wall_s, 2) if cold and stock_run else None,
    }


def report(runs: list[Run], result: dict) -> str:
    m = result["machine"]
    trimmed = result.get("trimmed")
    what = f"{result['sdist']}, archs {result['archs']}"
    if trimmed:
        what += f", trimmed to {len(trimmed['kept'])} of {trimmed['kernels']} kernels ({trimmed['rule']})"
    lines = [
        f"{what}; {m['cpus']} CPUs, {m['memory_gib']} GiB, {m['gpu'] or 'no GPU'}; Python {m['python']}, "
        f"torch {m['torch']}, {m['nvcc']}; builds in this order: {', '.join(result['order'])}",
        "",
        table(runs),
        "",
        memory_table(runs),
        "",
        phase_table(runs),
        "",
        f"P1 (fa-images wall / bound): {result['P1_wall_over_bound']}; "
        f"P2 (two Pythons of a group / one entry): {result['P2_two_pythons_over_one']}; "
        f"fa-images / stock wall: {result['fa_images_over_stock']}",
    ]
    return "\n".join(lines) + "\n"


def _builds(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or set(names) - set(BUILDS) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a comma list of {', '.join(BUILDS)}, each once")
    if "warm" in names and ("cold" not in names or names.index("warm") < names.index("cold")):
        raise argparse.ArgumentTypeError("warm builds through the cache cold leaves: cold must come first")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=Path)
    parser.add_argument("--archs", required=True, help="as fa-images wheel takes them, e.g. 90 or 80,90")
    parser.add_argument("--out", type=Path, required=True, help="a directory that does not exist yet")
    parser.add_argument("--kernels", type=int, metavar="N", help="build a trimmed copy that compiles N kernels")
    parser.add_argument("--builds", type=_builds, default=list(BUILDS), help="which builds, in which order")
    args = parser.parse_args()
    args.out.mkdir(parents=True)
    out = args.out.resolve()
    sdist = args.sdist.resolve()
    facts: dict = {"machine": machine(), "sdist": sdist.name, "archs": args.archs, "order": args.builds}
    if args.kernels is not None:
        trimmed = trim(sdist, args.kernels, out / "sdist")
        sdist = Path(trimmed.sdist)
        facts["trimmed"] = {**asdict(trimmed), "sdist": str(sdist.relative_to(out))}  # OUTDIR/sdist/...
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    steps: dict[str, Callable[[], Run]] = {
        "stock": lambda: stock(sdist, args.archs, out, env),
        "cold": lambda: fa_images("cold", sdist, args.archs, out, env),
        "warm": lambda: fa_images("warm", sdist, args.archs, out, env),
    }
    runs: list[Run] = []
    for name in args.builds:
        print(f"{time.strftime('%H:%M:%S')} {TITLES[name]} ...", flush=True)
        runs.append(steps[name]())
        print(json.dumps(asdict(runs[-1])), flush=True)
        result = summary(runs, facts)
        (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")  # after each: a cut-off run keeps some
    (out / "results.md").write_text(report(runs, result))
    print(report(runs, result))
    return 0 if all(r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
