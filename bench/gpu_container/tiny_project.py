"""The tiny flash-attn project the GPU-machine benches build in the current directory: its sdist in
``sdists/``, compat.yaml pinning it and this machine's torch and Python, and matrix.yaml with one
entry for archs 90, its image named IMAGE, its torch from the wheelhouse served on PORT.

    python3 tiny_project.py REPO PYTHON TORCH PORT IMAGE
"""

from __future__ import annotations

import sys

import yaml


def main() -> None:
    repo, py, torch, port, image = sys.argv[1:]
    sys.path.insert(0, f"{repo}/tests")
    from fixtures.tiny import make_tiny_sdist

    from fa_images.builder.source import sha256_of

    sha = sha256_of(make_tiny_sdist("sdists", version="2.8.3.dev0"))
    compat = {
        "torch": {torch: {"python": [py], "default_cuda": "13.0", "cuda": {"13.0": {"cxx11_abi": True}}}},
        "flash_attn": {"2.8.3.dev0": {"sha256": sha, "cuda_archs_env": True}},
    }
    matrix = {
        "image": image,
        "bases": {"devel": "gc.local/base:devel", "runtime": "gc.local/base:runtime", "python": "system"},
        "packages": {
            "index": None,
            "torch_index": None,
            "find_links": [f"http://127.0.0.1:{port}/"],
            "sdists": "sdists",
        },
        "build": {"network": "host"},
        "compat": "compat.yaml",
        "entries": [{"python": py, "torch": torch, "cuda": "13.0", "flash_attn": "2.8.3.dev0", "archs": ["90"]}],
    }
    with open("compat.yaml", "w") as f:
        yaml.safe_dump(compat, f, sort_keys=False)
    with open("matrix.yaml", "w") as f:
        yaml.safe_dump(matrix, f, sort_keys=False)


if __name__ == "__main__":
    main()
