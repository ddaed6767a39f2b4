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

# Exit codes of the builder's own commands that the host tells apart.
EXIT_NO_GPU = 3  # `check`: no GPU visible here, so nothing was checked
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
