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
# PINNED=1 runs the two paths at once instead, each on a Docker Engine of its own pinned to half of
# the CPUs (the first path of BUILDERS on the engine setup.sh starts, the second on a second one),
# so that both fit one hold of the machine; their figures are then those of 8 of 16 cores.
#
# BUILDERS names the paths, two at most with PINNED=1: each `buildkit` or `sdk`, or LABEL=DIR, where
# the builder is LABEL up to its first "-" and DIR (in the repository) holds the fa_images package
# that path runs, such as an earlier commit's (`git archive COMMIT fa_images | tar -x -C DIR`):
# BUILDERS="buildkit-before=.gpu-before buildkit" compares that commit's BuildKit path with this one's.
#
# Run from a copy of the repository, as root:  [PINNED=1] bash bench/gpu_container/side_by_side.sh WORK_DIR
# Needs what real_check.sh needs.
set -u
NUMPY=$(python3 -c 'import numpy; print(numpy.__version__)')
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/sbs}" "numpy==$NUMPY"

phase "project: the trimmed flash-attn sdist, a compat override, one matrix per builder and arch"
export PYTHONPATH=$REPO:${PYTHONPATH:-}
# The sdist, compat.yaml and one matrix per FILE=IMAGE:ARCH[:BUILDER] (an entry's id names no archs).
PATHS=${BUILDERS:-buildkit sdk}
specs=()
for path in $PATHS; do
    label=${path%%=*}
    for arch in 90 80; do specs+=("$label-$arch.yaml=gc.local/fa-images/$label-sm$arch:$arch:${label%%-*}"); done
done
python3 "$REPO/bench/gpu_container/project.py" "$REPO" "$W/proj" "$PYVER" "${TORCH%%+*}" "$PORT" "$NUMPY" "${specs[@]}" || exit 1
cd "$W/proj" || exit 1
first_label=${PATHS%% *}
ID=$(python3 -m fa_images plan --matrix "${first_label%%=*}-90.yaml" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
DEVEL_SIZE=$(docker image inspect gc.local/base:devel --format '{{.Size}}')

# One path's two entries on the engine DOCKER_HOST names; PIN: a taskset prefix, or nothing.
run_path() {  # LABEL[=DIR]
    local label=${1%%=*} name arch start end nvcc_at builder_size
    [ "$1" != "$label" ] && export PYTHONPATH=$REPO/${1#*=}:$PYTHONPATH  # that path's fa_images
    export XDG_CACHE_HOME=$W/cache-$label  # an empty compiler cache per path
    for arch in 90 80; do
        name=$label-$arch
        phase "$name: fa-images build --gpus devices"
        docker system df
        start=$(date +%s.%N)
        $PIN python3 -u -m fa_images build --matrix "$name.yaml" --gpus devices --log-dir "logs-$name" \
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
# BuildKit's step times, as the log says them (its stages run at once): the torch install's among them.
steps = re.findall(r"^(\[[^\]]+\][^\n]*?) done in ([\d.]+) s$", open(log).read(), re.M)
print("RESULT step times:", ", ".join(f"{name} {seconds} s" for name, seconds in steps) or "none in the log")
EOF
        builder_size=$(docker image inspect "gc.local/fa-images/$label-sm$arch:$ID-builder" --format '{{.Size}}') || builder_size=0
        echo "RESULT builder image over its devel base: $(((builder_size - DEVEL_SIZE) / 1000000)) MB"
        docker system df
    done
}

if [ "${PINNED:-0}" = 1 ]; then
    # Both paths at once, each on an engine of its own pinned to half of the CPUs (its dockerd,
    # containerd and so every container they start, and fa-images), so that the pair fits one
    # hold of the machine and neither path's compile takes the other's cores.
    half=$(($(nproc) / 2))
    CPUS_A=0-$((half - 1)) CPUS_B=$half-$(($(nproc) - 1))
    for pid in $(pgrep -x dockerd) $(pgrep -x containerd); do taskset -a -p -c "$CPUS_A" "$pid" >/dev/null; done
    SOCK_B=unix:///run/gc/docker-b.sock
    phase "engine B on CPUs $CPUS_B (engine A on $CPUS_A), the bases loaded from A"
    LD_LIBRARY_PATH=$W/engine/lib setsid nohup taskset -c "$CPUS_B" dockerd --data-root "$W/docker-b" \
        --exec-root /run/gc/exec-b --pidfile /run/gc/docker-b.pid -H $SOCK_B --config-file /run/gc/daemon.json \
        --storage-driver overlay2 --bridge=none --iptables=false --ip-masq=false >"$W/dockerd-b.log" 2>&1 &
    for _ in $(seq 60); do DOCKER_HOST=$SOCK_B docker version >/dev/null 2>&1 && break; sleep 1; done
    docker save gc.local/base:runtime gc.local/base:devel | DOCKER_HOST=$SOCK_B docker load
    first=${PATHS%% *} second=${PATHS#* }
    (PIN="taskset -c $CPUS_A" run_path "$first" 2>&1 | sed -u "s/^/[${first%%=*}] /") &
    path_a=$!
    (export DOCKER_HOST=$SOCK_B; PIN="taskset -c $CPUS_B" run_path "$second" 2>&1 | sed -u "s/^/[${second%%=*}] /") &
    path_b=$!
    wait $path_a $path_b  # not a bare `wait`: the dockerds are children of this shell too
    DOCKER_HOST=$SOCK_B docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
else
    for path in $PATHS; do (PIN="" run_path "$path"); done  # each its own PYTHONPATH
fi
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
df -h "$W" | sed 1d
phase "done"
