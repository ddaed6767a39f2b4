#!/bin/bash
# What a BuildKit bind mount from another stage costs before its step can run: BuildKit hashes the
# mounted files' content for the step's cache key, and keeps the sum with the stage. Stages stand in
# for the torch venv: 3 GB in 30 files (twice, each a new stage), then 20,000 files of 20 kB; each
# line is one `docker build`'s wall time.
#
# Then the shape of an entry, where the image is made on the mounted stage (the runtime image on the
# torch stage), three builds of a new step each: with the stage made in the first of them (its sum,
# taken before anything committed the stage, is lost when the image's export does, and the second
# build hashes again); with the stage built first in a build of its own, exported as an image (the
# commit, and a pass over its files for the layer); and with the stage committed first by a step on
# it, in a build that yields one empty file, as `fa-images build` does (the commit alone).
#
#   DOCKER_HOST=unix:///PATH.sock [DOCKER=/usr/bin/docker] [ENTRY_ONLY=1] bash bench/buildkit_mount_hash.sh BASE_IMAGE [WORK_DIR]
#
# ENTRY_ONLY=1: the shape of an entry alone. MOUNT_OPTS=,rw: the mount read-write (BuildKit keys it
# on the content all the same: the Dockerfile gives a read-write bind mount no output).
#
# BASE_IMAGE: any local image with a shell (nothing is pulled). Needs a docker CLI with BuildKit
# (`DOCKER_BUILDKIT=1 docker build`, as Debian's 20.10) and 12 GB in the engine's storage.
set -eu
base=$1 work=${2:-$(mktemp -d)}
mkdir -p "$work" && cd "$work"
stages() {  # the command that fills the big stage's /opt/venv
    cat <<DOCKERFILE
FROM $base AS big
RUN mkdir -p /opt/venv && cd /opt/venv && $1
FROM $base AS use
ARG N
RUN --mount=type=bind,from=big,source=/opt/venv,target=/opt/venv${MOUNT_OPTS:-} echo \$N > /n && ls /opt/venv | wc -l
DOCKERFILE
}
timed() {  # label, docker build's arguments
    local label=$1 start
    shift
    start=$(date +%s%N)
    DOCKER_BUILDKIT=1 "${DOCKER:-docker}" build -q --network host "$@" . >/dev/null
    echo "$label: $((($(date +%s%N) - start) / 1000000)) ms"
}
# shellcheck disable=SC2016  # these run in the image's shell, not here
big_files='for i in $(seq 1 30); do head -c SIZE /dev/zero | tr "\\0" "$i" > f$i; done'
# shellcheck disable=SC2016
many_files='for d in $(seq 1 200); do mkdir d$d; for f in $(seq 1 100); do head -c 20000 /dev/urandom > d$d/f$f; done; done'
[ -n "${ENTRY_ONLY:-}" ] || for fill in "${big_files/SIZE/100M}" "${big_files/SIZE/101M}" "$many_files"; do
    stages "$fill" >Dockerfile
    timed "the big stage ($fill)" --target big
    timed "first build that mounts it" --target use --build-arg "N=$RANDOM"
    timed "a later build that mounts it" --target use --build-arg "N=$RANDOM"
done

entry() {  # the fill; an image made on the mounted stage, as the runtime image on torch
    stages "$1"
    cat <<DOCKERFILE
FROM big AS image
COPY --from=use /n /n
FROM big AS big-committed
RUN mkdir -p /opt/commit && : > /opt/commit/big
FROM scratch AS big-commit
COPY --from=big-committed /opt/commit/ /
DOCKERFILE
}
fill="${big_files/SIZE/100M}"
for first in "" big big-commit; do
    entry "echo $first$RANDOM && $fill" >Dockerfile  # a new stage each time
    case $first in
        "") what="made in entry 1" ;;
        big) what="built first" ;;
        *) what="committed first" ;;
    esac
    for n in 1 2 3; do
        if [ -n "$first" ]; then timed "  the stage $what, in a build of its own" --target "$first"; fi
        timed "entry $n, the stage $what" --target image --build-arg "N=$RANDOM"
    done
done
