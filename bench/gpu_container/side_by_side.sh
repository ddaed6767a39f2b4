#!/bin/bash
# The two builders side by side on a GPU machine: real flash-attn, trimmed to the kernels the GPU
# check calls, two entries on one torch (archs 90, then archs 80: two compiles of the same size),
# built first through BuildKit (Debian's 20.10 CLI, BuildKit built in), then through the docker
# SDK's legacy builder, each path with an empty compiler cache of its own and its own torch stage
# (BuildKit's cache and the legacy builder's image cache share nothing), each image GPU-checked.
#
# Per entry it prints: the build step (from `fa-images build`'s start to the image), the time before
# nvcc starts (to the builder's "compiling flash-attn" line), the builder's own phases, and the
# builder image's size over its devel base: the legacy builder copies the torch venv into it.
#
# Run from a copy of the repository, as root:  bash bench/gpu_container/side_by_side.sh WORK_DIR
# Needs what real_check.sh needs.
set -u
NUMPY=$(python3 -c 'import numpy; print(numpy.__version__)')
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/sbs}" "numpy==$NUMPY"

phase "project: the trimmed flash-attn sdist, a compat override, one matrix per builder and arch"
SDIST=$(find "$REPO/.gpu-sdist" -name 'flash_attn-*.tar.gz' | head -n 1)
[ -n "$SDIST" ] || { echo "no .gpu-sdist/flash_attn-*.tar.gz"; exit 1; }
mkdir -p "$W/proj/sdists" && cp "$SDIST" "$W/proj/sdists/" && cd "$W/proj" || exit 1
export PYTHONPATH=$REPO:${PYTHONPATH:-}
python3 - "$SDIST" "$PYVER" "${TORCH%%+*}" "$PORT" "$NUMPY" <<'EOF'
import sys, yaml
from pathlib import Path
from fa_images.builder.source import sha256_of
sdist, py, torch, port, numpy = sys.argv[1:]
version = Path(sdist).name.removeprefix("flash_attn-").removesuffix(".tar.gz")
compat = {
    "torch": {torch: {"python": [py], "default_cuda": "13.0", "cuda": {"13.0": {"cxx11_abi": True}}}},
    "flash_attn": {version: {"sha256": sha256_of(Path(sdist)), "cuda_archs_env": True}},
    "runtime_deps_python": {py: [f"numpy=={numpy}"]},
}
yaml.safe_dump(compat, open("compat.yaml", "w"), sort_keys=False)
for builder in ("buildkit", "sdk"):
    for arch in ("90", "80"):
        matrix = {
            "image": f"gc.local/fa-images/{builder}-sm{arch}",
            "bases": {"devel": "gc.local/base:devel", "runtime": "gc.local/base:runtime", "python": "system"},
            "packages": {"index": None, "torch_index": None, "find_links": [f"http://127.0.0.1:{port}/"], "sdists": "sdists"},
            "build": {"network": "host", "builder": builder},
            "compat": "compat.yaml",
            "entries": [{"python": py, "torch": torch, "cuda": "13.0", "flash_attn": version, "archs": [arch]}],
        }
        yaml.safe_dump(matrix, open(f"{builder}-{arch}.yaml", "w"), sort_keys=False)
EOF
ID=$(python3 -m fa_images plan --matrix buildkit-90.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
DEVEL_SIZE=$(docker image inspect gc.local/base:devel --format '{{.Size}}')

for builder in ${BUILDERS:-buildkit sdk}; do
    export XDG_CACHE_HOME=$W/cache-$builder  # an empty compiler cache per path
    for arch in 90 80; do
        name=$builder-$arch
        phase "$name: fa-images build --gpus devices"
        docker system df
        start=$(date +%s.%N)
        python3 -u -m fa_images build --matrix "$name.yaml" --gpus devices --log-dir "logs-$name" \
            --dist "dist-$name" --report "report-$name.json" 2>&1 |
            while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"out-$name.txt"
        end=$(date +%s.%N)
        grep -E "builder:|engine:|succeeded|error" "out-$name.txt" | cut -c1-250
        nvcc_at=$(grep -m1 "compiling flash-attn" "out-$name.txt" | cut -d' ' -f1)
        python3 - "$start" "$end" "${nvcc_at:-}" "report-$name.json" "logs-$name/$ID.log" <<'EOF'
import json, re, sys
start, end, nvcc, report, log = sys.argv[1:]
start, end = float(start), float(end)
entry = json.load(open(report))["entries"][0]
seconds = entry.get("seconds", {})
build_start = start + seconds.get("source", 0.0)  # the build step follows the sdist's step
phases = re.findall(r"time by phase: [^\n]*", open(log).read())
print(f"RESULT status={entry['status']} gpu_check={entry.get('gpu_check')} whole={end - start:.0f}s",
      f"steps={seconds}",
      f"before_nvcc={float(nvcc) - build_start:.0f}s" if nvcc else "before_nvcc=?",
      f"kernels={entry.get('kernels')} from_cache={entry.get('kernels_from_cache')}")
print("RESULT", phases[-1][:400] if phases else "no phases line")
EOF
        builder_size=$(docker image inspect "gc.local/fa-images/$builder-sm$arch:$ID-builder" --format '{{.Size}}' 2>/dev/null || echo 0)
        echo "RESULT builder image over its devel base: $(((builder_size - DEVEL_SIZE) / 1000000)) MB"
        docker system df
    done
done
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
df -h "$W" | sed 1d
phase "done"
