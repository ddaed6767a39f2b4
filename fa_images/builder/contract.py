"""Facts the host and the builder must agree on, written once.

The host renders Dockerfiles and drives the engine; the builder runs inside them. Both
import this module (stdlib only, like the rest of the builder package), so a stage name,
an exit code or a tag format cannot drift between the two sides.
"""

from __future__ import annotations

import re

# The stages of every rendered Dockerfile, in build order.
PYTHON_STAGE = "python"  # the runtime base, the exact Python, an empty venv and the image's user
TORCH_STAGE = "torch"  # that venv with the exact torch: shared by every entry of the same base, Python and torch
BUILDER_STAGE = "builder"  # compiles the wheel; tagged "<image>-builder" to keep its cache
WHEEL_STAGE = "wheel"  # FROM scratch: only the wheel and its manifest, for export
CACHE_STAGE = "compiler-cache"  # FROM scratch: the compiler cache after the compile, for the host
# BuildKit's form only: the host's compiler cache into the group's cache mount before the compile,
# and the mount's files into a layer after it, for CACHE_STAGE. Each is built anew, in a build of
# its own: a cache mount's content is no part of a step's cache key.
CACHE_IN_STAGE = "compiler-cache-in"
CACHE_OUT_STAGE = "compiler-cache-out"
# BuildKit's form with two bases: a step on the torch stage (TORCH_COMMITTED_STAGE), so that BuildKit
# commits that stage, and TORCH_COMMIT_STAGE (FROM scratch: one empty file), the target of a build of
# its own before the compile mounts the torch venv. BuildKit keys the compile on a sum of the mounted
# files and keeps it with the stage; taken before the stage is committed, the sum is lost when it is.
TORCH_COMMITTED_STAGE = "torch-committed"
TORCH_COMMIT_STAGE = "torch-commit"
# Declared by a stage that is built anew: the host passes a new value each time, which changes that
# step's cache key alone (BuildKit's --no-cache would also hand the step an empty cache mount).
ANEW_ARG = "FA_IMAGES_ANEW"
INSTALL_STAGE = "install"  # the wheel installed on the torch stage and checked, under LAYER_ROOT too
RUNTIME_STAGE = "runtime"  # the image users pull: the torch stage and one layer
# Where the install stage stages what it adds to the torch stage, laid out as in the image: the
# runtime stage copies this tree, so its one layer on top of torch is exactly what passed the checks.
LAYER_ROOT = "/opt/fa-layer"
WHEELS_DIR = "/wheels"  # where the builder stage leaves its output
# The build context's compiler cache (the host's copy for the entry's compile group) and where the
# builder stage keeps it: the next Python of the group takes its kernel objects from there.
CACHE_CONTEXT_DIR = "compiler-cache"
CACHE_DIR = "/opt/fa-images/compiler-cache"
CACHE_EXPORT_DIR = "/compiler-cache"  # in the FROM-scratch cache stage
CACHE_COPY_DIR = "/opt/fa-images/cache-copy"  # BuildKit's form: the cache's way in and out of its mount

# Exit codes of the builder's own commands that the host tells apart.
EXIT_NO_GPU = 3  # `check`: no GPU visible here, so nothing was checked
# `check`: the GPU cannot run the extension's code (sm_90 device, sm_80 cubins and no PTX that fits):
# not a broken wheel, the wrong place to check it; nothing was run. The host's `fa-images check`
# exits with it too.
EXIT_WRONG_ARCH = 8
WRONG_ARCH_PREFIX = "WRONG ARCH: "  # the check's line with the reason, which the host reports
# The check's last line where its comparisons ran: the verdict as one JSON object (builder/verdict.py),
# which the host signs as an attestation.
VERDICT_PREFIX = "VERDICT: "
INVENTORY_PREFIX = "INVENTORY: "  # `inventory`'s line: what an image holds, for its SBOM
INVENTORY_COMMAND = ("python", "-m", "fa_images.builder", "inventory")
EXIT_SHIM_REFUSED = 97  # the setup.py shim cannot correct this setup.py

# Written beside the prepared source; read by the setup.py shim and the verifier.
SETTINGS_FILE = "fa_images_build.json"

# The prefix of the builder's milestone lines (compiling, wheel built, the shim's corrections):
# the host shows these as they come, and sends the rest of a build's output to its log.
MILESTONE = "[fa-images] "

# The command that runs the GPU check inside an image.
GPU_CHECK_COMMAND = ("python", "-m", "fa_images.builder", "check")
# The runtime image's own check (its CMD, and a RUN at build time): the import, no GPU needed.
IMPORT_CHECK_COMMAND = (*GPU_CHECK_COMMAND, "--import-only")


def cuda_tag(cuda: str) -> str:
    """'12.8' -> 'cu128': torch's variant index suffix, and the image tags' CUDA part."""
    return "cu" + cuda.replace(".", "")


# The builder's milestone line with the compiler cache's counts; the host reads it into the report.
_CACHE_LINE = "compiler cache: {hits} of {total} kernel compiles taken from the cache"
_CACHE_PATTERN = re.compile(r"compiler cache: (\d+) of (\d+) kernel compiles taken from the cache")


def cache_stats_line(hits: int, total: int) -> str:
    return MILESTONE + _CACHE_LINE.format(hits=hits, total=total)


def parse_cache_stats(line: str) -> tuple[int, int] | None:
    """(kernels from the cache, kernels in all) from a builder's output line, or None."""
    match = _CACHE_PATTERN.search(line)
    return (int(match.group(1)), int(match.group(2))) if match else None


# Where a build's time goes (timeline.py). The shim, a child process, marks the end of each of its
# phases with one line, which the builder folds into its timeline instead of passing it on; the
# builder then logs one line with every phase, which the host and bench/side_by_side.py read.
COMPILE_PHASE = "ninja"  # the kernel compile; every other phase is time outside it
_PHASE_MARK = MILESTONE + "phase-end "
_PHASES_LINE = "time by phase: "
_PHASE_ITEM = re.compile(r"(\S(?:[^,]*\S)?) (\d+(?:\.\d+)?) s")


def phase_mark_line(name: str, at: float) -> str:
    """The shim's mark: phase ``name`` ended at ``at`` (time.time(), shared with the builder)."""
    return f"{_PHASE_MARK}{at:.3f} {name}"


def parse_phase_mark(line: str) -> tuple[str, float] | None:
    """(phase, end time) from a shim's mark line, or None for any other line."""
    if not line.startswith(_PHASE_MARK):
        return None
    at, _, name = line[len(_PHASE_MARK) :].strip().partition(" ")
    try:
        return (name, float(at)) if name else None
    except ValueError:
        return None


def phases_line(phases: list[tuple[str, float]]) -> str:
    """'[fa-images] time by phase: sdist 0.8 s, ..., ninja 1180.2 s, ...; outside ninja 46.0 s'."""
    outside = sum(s for name, s in phases if name != COMPILE_PHASE)
    items = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases)
    return f"{MILESTONE}{_PHASES_LINE}{items}; outside {COMPILE_PHASE} {outside:.1f} s"


def parse_phases(line: str) -> list[tuple[str, float]] | None:
    """The phases of a builder's ``phases_line``, in order, or None for any other line."""
    start = line.find(_PHASES_LINE)
    if start < 0:
        return None
    items = line[start + len(_PHASES_LINE) :].rsplit("; outside ", 1)[0]
    found = [_PHASE_ITEM.fullmatch(item.strip()) for item in items.split(", ")]
    return [(m.group(1), float(m.group(2))) for m in found if m]
