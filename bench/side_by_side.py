"""The stock flash-attn build beside fa-images' builder, in one run on one machine.

    python bench/side_by_side.py SDIST --archs 90 --out OUTDIR

Three builds of the same sdist, one after the other, with the Python that runs this script:

- ``stock``: ``setup.py bdist_wheel`` in the unpacked sdist, with flash-attn's own defaults
  (its MAX_JOBS rule, its nvcc threads) except the arch (``FLASH_ATTN_CUDA_ARCHS``) and
  ``FLASH_ATTENTION_FORCE_BUILD=TRUE``, as the field reports do it;
- ``fa-images``: ``python -m fa_images.builder wheel`` with its default sizing and an empty
  compiler cache (P1);
- ``fa-images, cache warm``: the same again through the cache the first left. The kernels are
  keyed without Python (no ``.cu`` includes Python.h), so this is what each further Python of a
  compile group costs; the Python-specific part (``flash_api.cpp``, the link) is rebuilt (P2).

For each: wall time, ninja's steps, the bound max(longest step, sum of steps / CPUs), wall /
bound, the peak memory of the build's process tree, and the kernels taken from the cache.
Writes OUTDIR/results.json and OUTDIR/results.md. Needs a CUDA torch, nvcc, ninja and (for the
cache) sccache on PATH; no network when SDIST is a local file.
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
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ninja_costs import floor, read_steps  # noqa: E402  (beside this script)

from fa_images.builder.contract import parse_cache_stats  # noqa: E402


@dataclass(frozen=True)
class Run:
    name: str
    rc: int
    wall_s: float
    steps: int
    steps_sum_s: float
    longest_s: float
    bound_s: float  # max(longest step, sum of steps / CPUs): no schedule beats it
    wall_over_bound: float | None
    peak_rss_gib: float
    kernels: int | None
    kernels_from_cache: int | None
    log: str


def _children(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name is in parentheses and may hold spaces: split after the last one.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, grew = {root}, True
    while grew:
        grown = tree | {pid for pid, ppid in parents.items() if ppid in tree}
        grew, tree = len(grown) > len(tree), grown
    return tree


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _measure(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float, float]:
    """Runs ``cmd`` with its output in ``log``; returns (exit code, wall s, peak RSS GiB of its tree)."""
    peak = 0
    with log.open("w") as out:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(2):
                peak = max(peak, sum(_rss_kib(p) for p in _children(proc.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        wall = time.monotonic() - started
        done.set()
        sampler.join()
    return rc, wall, peak / (1 << 20)


def _ninja_steps(under: Path) -> list[float]:
    """Each step's seconds, from the newest .ninja_log under ``under``."""
    logs = sorted(under.rglob(".ninja_log"), key=lambda p: p.stat().st_mtime)
    return [end - start for start, end, _ in read_steps(logs[-1])] if logs else []


def _result(name: str, rc: int, wall: float, peak: float, steps: list[float], log: Path) -> Run:
    bound = floor(steps, os.cpu_count() or 1)
    cache = None
    for line in log.read_text(errors="replace").splitlines():
        cache = parse_cache_stats(line) or cache
    return Run(
        name=name,
        rc=rc,
        wall_s=round(wall, 1),
        steps=len(steps),
        steps_sum_s=round(sum(steps), 1),
        longest_s=round(max(steps, default=0.0), 1),
        bound_s=round(bound, 1),
        wall_over_bound=round(wall / bound, 2) if bound else None,
        peak_rss_gib=round(peak, 1),
        kernels=cache[1] if cache else None,
        kernels_from_cache=cache[0] if cache else None,
        log=str(log),
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
    rc, wall, peak = _measure([sys.executable, "setup.py", "bdist_wheel"], root, stock_env, log)
    return _result("stock", rc, wall, peak, _ninja_steps(root / "build"), log)


def fa_images(name: str, sdist: Path, archs: str, out: Path, env: dict[str, str]) -> Run:
    work, log = out / "work", out / f"{name}.log"
    cmd = [sys.executable, "-m", "fa_images.builder", "wheel", "--sdist", str(sdist), "--archs", archs]
    cmd += ["--out", str(out / name), "--work-dir", str(work), "--keep-work", "--compiler-cache", str(out / "cache")]
    rc, wall, peak = _measure(cmd, out, env, log)
    result = _result(name, rc, wall, peak, _ninja_steps(work), log)
    shutil.rmtree(work, ignore_errors=True)  # the next build finds the same (fixed) work dir free
    return result


def table(runs: list[Run]) -> str:
    columns = ["build", "rc", "wall s", "steps", "sum of steps s", "longest s", "bound s", "wall / bound"]
    columns += ["peak RSS GiB", "kernels from cache"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for r in runs:
        cached = f"{r.kernels_from_cache} of {r.kernels}" if r.kernels is not None else "-"
        lines.append(
            f"| {r.name} | {r.rc} | {r.wall_s:.0f} | {r.steps} | {r.steps_sum_s:.0f} | {r.longest_s:.0f} | "
            f"{r.bound_s:.0f} | {r.wall_over_bound if r.wall_over_bound is not None else '-'} | "
            f"{r.peak_rss_gib} | {cached} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=Path)
    parser.add_argument("--archs", required=True, help="as fa-images wheel takes them, e.g. 90 or 80,90")
    parser.add_argument("--out", type=Path, required=True, help="a directory that does not exist yet")
    args = parser.parse_args()
    args.out.mkdir(parents=True)
    sdist = args.sdist.resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    import torch  # the one the builds compile against

    machine = {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nvcc": subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
    }
    runs = []
    for step in (
        lambda: stock(sdist, args.archs, args.out, env),
        lambda: fa_images("fa-images", sdist, args.archs, args.out, env),
        lambda: fa_images("fa-images, cache warm", sdist, args.archs, args.out, env),
    ):
        runs.append(step())
        print(json.dumps(asdict(runs[-1])), flush=True)
    first, warm = runs[1], runs[2]
    summary = {
        "machine": machine,
        "sdist": sdist.name,
        "archs": args.archs,
        "runs": [asdict(r) for r in runs],
        "P1_wall_over_bound": first.wall_over_bound,
        "P2_two_pythons_over_one": round((first.wall_s + warm.wall_s) / first.wall_s, 2) if first.wall_s else None,
        "fa_images_over_stock": round(first.wall_s / runs[0].wall_s, 2) if runs[0].wall_s else None,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = [
        f"{sdist.name}, archs {args.archs}; {machine['cpus']} CPUs, {machine['memory_gib']} GiB, "
        f"{machine['gpu'] or 'no GPU'}; Python {machine['python']}, torch {machine['torch']}, {machine['nvcc']}",
        "",
        table(runs),
        "",
        f"P1 (fa-images wall / bound): {summary['P1_wall_over_bound']}; "
        f"P2 (two Pythons of a group / one entry): {summary['P2_two_pythons_over_one']}; "
        f"fa-images / stock wall: {summary['fa_images_over_stock']}",
    ]
    (args.out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
