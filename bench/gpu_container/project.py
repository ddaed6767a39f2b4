"""The project the GPU-machine benches build, in PROJECT_DIR: the trimmed flash-attn sdist of
``REPO/.gpu-sdist/`` in ``sdists/``, compat.yaml for it (its sha256, this machine's torch and
Python, numpy pinned to the one re-packed into the wheelhouse), and one matrix per
``FILE=IMAGE:ARCH[:BUILDER]``, each an image of its own (an entry's id names no archs).

    python3 project.py REPO PROJECT_DIR PYTHON TORCH PORT NUMPY FILE=IMAGE:ARCH[:BUILDER]...
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from fa_images.builder.source import sha256_of


def main() -> None:
    repo, project, py, torch, port, numpy, *matrices = sys.argv[1:]
    found = sorted((Path(repo) / ".gpu-sdist").glob("flash_attn-*.tar.gz"))
    if not found:
        sys.exit("no .gpu-sdist/flash_attn-*.tar.gz (python bench/trim_sdist.py SDIST --gpu-check --out .gpu-sdist)")
    out = Path(project)
    (out / "sdists").mkdir(parents=True, exist_ok=True)
    sdist = Path(shutil.copy2(found[0], out / "sdists"))
    version = sdist.name.removeprefix("flash_attn-").removesuffix(".tar.gz")
    compat = {
        "torch": {torch: {"python": [py], "default_cuda": "13.0", "cuda": {"13.0": {"cxx11_abi": True}}}},
        "flash_attn": {version: {"sha256": sha256_of(sdist), "cuda_archs_env": True}},
        "runtime_deps_python": {py: [f"numpy=={numpy}"]},
    }
    (out / "compat.yaml").write_text(yaml.safe_dump(compat, sort_keys=False))
    for spec in matrices:
        file, _, rest = spec.partition("=")
        image, arch, *builder = rest.split(":")
        index = {"index": None, "torch_index": None, "find_links": [f"http://127.0.0.1:{port}/"], "sdists": "sdists"}
        matrix = {
            "image": image,
            "bases": {"devel": "gc.local/base:devel", "runtime": "gc.local/base:runtime", "python": "system"},
            "packages": index,
            "build": {"network": "host", **({"builder": builder[0]} if builder else {})},
            "compat": "compat.yaml",
            "entries": [{"python": py, "torch": torch, "cuda": "13.0", "flash_attn": version, "archs": [arch]}],
        }
        (out / file).write_text(yaml.safe_dump(matrix, sort_keys=False))


if __name__ == "__main__":
    main()
