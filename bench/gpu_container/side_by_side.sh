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
export PYTHONPATH=$REPO:${PYTHONPATH:-}
# The sdist, compat.yaml and one matrix per FILE=IMAGE:ARCH[:BUILDER] (an entry's id names no archs).
python3 "$REPO/bench/gpu_container/project.py" "$REPO" "$W/proj" "$PYVER" "${TORCH%%+*}" "$PORT" "$NUMPY" \
    buildkit-90.yaml=gc.local/fa-images/buildkit-sm90:90:buildkit buildkit-80.yaml=gc.local/fa-images/buildkit-sm80:80:buildkit \
    sdk-90.yaml=gc.local/fa-images/sdk-sm90:90:sdk sdk-80.yaml=gc.local/fa-images/sdk-sm80:80:sdk || exit 1
cd "$W/proj" || exit 1
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
