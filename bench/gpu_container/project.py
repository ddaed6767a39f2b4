"""The project the GPU-machine benches build, in PROJECT_DIR: the trimmed flash-attn sdist and
the FlashAttention-3 source archive of ``REPO/.gpu-sdist/`` (either may be absent) in ``sdists/``,
compat.yaml for them (the sdist's sha256, this machine's torch and Python, numpy pinned to the one
re-packed into the wheelhouse; FA3's pin is the built-in table's), and one matrix per
``FILE=IMAGE:ARCH[:BUILDER]``, each an image of its own (an entry's id names no archs). ARCH
``fa3`` is a FlashAttention-3 entry for this GPU, trimmed to head dim 128, fp16 and bf16, forward
and backward (``FA3_TRIMMED``); ``fa4`` a FlashAttention-4 entry for it, on the default grid.

    python3 project.py REPO PROJECT_DIR PYTHON TORCH PORT NUMPY FILE=IMAGE:ARCH[:BUILDER]...
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from fa_images.builder.source import sha256_of

# What facts.md measured from outside (162 s on 16 cores): head dim 128, fp16 and bf16, forward and backward.
FA3_TRIMMED = {
    "head_dims": [128],
    "dtypes": ["bf16", "fp16"],
    "without": ["split", "paged_kv", "append_kv", "local", "softcap", "packgqa", "sm80", "hdim_diff"],
}


FA4_VERSION = "4.0.0b36"  # from the wheelhouse, at the built-in table's pins


def main() -> None:
    repo, project, py, torch, port, numpy, *matrices = sys.argv[1:]
    found = sorted((Path(repo) / ".gpu-sdist").glob("flash_attn-*.tar.gz"))
    fa3_found = sorted((Path(repo) / ".gpu-sdist").glob("flash_attn_3-*.tar.gz"))
    if not found and not fa3_found and not any(spec.endswith(":fa4") for spec in matrices):
        sys.exit("no .gpu-sdist/flash_attn-*.tar.gz (python bench/trim_sdist.py SDIST --gpu-check --out .gpu-sdist)")
    out = Path(project)
    (out / "sdists").mkdir(parents=True, exist_ok=True)
    compat: dict = {
        "torch": {torch: {"python": [py], "default_cuda": "13.0", "cuda": {"13.0": {"cxx11_abi": True}}}},
        "runtime_deps_python": {py: [f"numpy=={numpy}"]},
    }
    version = fa3_version = None
    if found:
        sdist = Path(shutil.copy2(found[0], out / "sdists"))
        version = sdist.name.removeprefix("flash_attn-").removesuffix(".tar.gz")
        compat["flash_attn"] = {version: {"sha256": sha256_of(sdist), "cuda_archs_env": True}}
    if fa3_found:
        archive = Path(shutil.copy2(fa3_found[0], out / "sdists"))
        fa3_version = archive.name.removeprefix("flash_attn_3-").removesuffix(".tar.gz")
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
        if arch == "fa4":
            matrix["entries"] = [
                {"python": py, "torch": torch, "cuda": "13.0", "flash_attn": FA4_VERSION, "target": ["H100"]}
            ]
        if arch == "fa3":
            matrix["fa3"] = FA3_TRIMMED
            matrix["entries"] = [
                {"python": py, "torch": torch, "cuda": "13.0", "flash_attn": fa3_version, "target": ["H100"]}
            ]
        (out / file).write_text(yaml.safe_dump(matrix, sort_keys=False))


if __name__ == "__main__":
    main()
