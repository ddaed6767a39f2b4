#!/bin/bash
# `fa-images build --gpus devices` on a GPU machine that has no Docker, no registry and no
# package index: a private Docker Engine from Debian's packages, base images made from the
# machine's own root file system (its CUDA toolkit and Python), a wheelhouse re-packed
# from its installed torch, then the build, whose GPU check runs inside the runtime image.
#
# Run from a copy of the repository, as root:  bash bench/gpu_container/device.sh WORK_DIR
# Needs beside the repository: .gpu-engine/ (dockerd, containerd, runc, docker from Debian
# bookworm's docker.io, containerd and runc packages, unpacked with dpkg -x, plus
# libdevmapper), .gpu-wheelhouse/ (the build tools' wheels) and the docker SDK importable.
set -u
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/gc}"

phase "project: the tiny flash-attn sdist, a compat override, a matrix"
mkdir -p "$W/proj/sdists" && cd "$W/proj" || exit 1
export PYTHONPATH=$REPO:${PYTHONPATH:-}
python3 "$REPO/bench/gpu_container/tiny_project.py" "$REPO" "$PYVER" "${TORCH%%+*}" "$PORT" "gc.local/fa-images/flash-attn"
cat matrix.yaml

phase "fa-images build --gpus devices"
python3 -m fa_images plan --matrix matrix.yaml
started=$(date +%s)
python3 -m fa_images build --matrix matrix.yaml --gpus devices --report report.json
echo "fa-images build exited $? after $(($(date +%s) - started)) s"
ID=$(python3 -m fa_images plan --matrix matrix.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
grep -A40 "GPU passthrough\|GPU:" "logs/$ID.log" | head -40
IMAGE=gc.local/fa-images/flash-attn:$ID

phase "the runtime image holds no NVIDIA driver library of its own"
docker run --rm --entrypoint sh "$IMAGE" -c 'find / -xdev \( -name "libcuda.so*" -o -name "libnvidia-ml.so*" \) | grep . || echo "no libcuda or libnvidia-ml in the image"'
phase "the same image without the GPUs: the check must not pass"
docker run --rm "$IMAGE" python -m fa_images.builder check
echo "exit $?"
phase "the same image with --gpus all (device_requests): what the engine says without the NVIDIA toolkit"
docker run --rm --gpus all "$IMAGE" python -m fa_images.builder check
echo "exit $?"
phase "fa-images build --gpus runtime (the default) on this engine"
python3 -m fa_images build --matrix matrix.yaml --log-dir logs-runtime --report report-runtime.json
echo "fa-images build exited $?"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
df -h "$W" | sed 1d
phase "done"
