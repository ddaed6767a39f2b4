#!/bin/bash
# What a BuildKit bind mount from another stage costs before its step can run: BuildKit hashes the
# mounted files' content for the step's cache key, once per stage it mounts from. A stage of 3 GB of
# files (30 x 100 MB) stands in for the torch venv; each line is one `docker build`'s wall time.
#
#   DOCKER_HOST=unix:///PATH.sock [DOCKER=/usr/bin/docker] bash bench/buildkit_mount_hash.sh BASE_IMAGE [WORK_DIR]
#
# BASE_IMAGE: any local image with a shell (nothing is pulled). Needs a docker CLI with BuildKit
# (`DOCKER_BUILDKIT=1 docker build`, as Debian's 20.10) and 3 GB in the engine's storage.
set -eu
base=$1 work=${2:-$(mktemp -d)}
mkdir -p "$work" && cd "$work"
stages() {  # the big stage's file size in MB, which makes a new stage of it
    cat <<DOCKERFILE
FROM $base AS big
RUN mkdir -p /opt/venv && for i in \$(seq 1 30); do head -c $1M /dev/zero | tr '\\0' "\$i" > /opt/venv/f\$i; done
FROM $base AS use
ARG N
RUN --mount=type=bind,from=big,source=/opt/venv,target=/opt/venv echo \$N && ls /opt/venv | wc -l
DOCKERFILE
}
timed() {  # label, docker build's arguments
    local label=$1 start
    shift
    start=$(date +%s%N)
    DOCKER_BUILDKIT=1 "${DOCKER:-docker}" build -q --network host "$@" . >/dev/null
    echo "$label: $((($(date +%s%N) - start) / 1000000)) ms"
}
for size in 100 101; do
    stages "$size" >Dockerfile
    timed "the big stage ($size MB files)" --target big
    timed "first build that mounts it" --target use --build-arg "N=$RANDOM"
    timed "a later build that mounts it" --target use --build-arg "N=$RANDOM"
done
