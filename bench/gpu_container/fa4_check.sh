#!/bin/bash
# FlashAttention-4 in a container on a GPU machine: one `fa-images build --gpus devices` of an FA4
# entry for this GPU (its kernels compiled into the image with no GPU, for the default grid), its
# image's check on this GPU (the grid's first calls: 0 compiles), then `fa-images check` on it as a
# node would run it. The cold first calls of the same grid: fa4_native.sh.
#
# Run from a copy of the repository, as root:  bash bench/gpu_container/fa4_check.sh WORK_DIR FA4_WHEELS
# Needs what setup.sh needs, and FA4_WHEELS: flash-attn-4's pinned set (compat.yaml's
# flash_attn_4) as wheels for this machine's Python, served with the rest of the wheelhouse.
set -u
NUMPY=$(python3 -c 'import numpy; print(numpy.__version__)')
FA4_WHEELS=${2:?the folder of the FA4 wheels}
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/rc}" "numpy==$NUMPY"
cp "$FA4_WHEELS"/*.whl "$W/wheelhouse/"

phase "project: a compat override, one matrix"
export PYTHONPATH=$REPO:${PYTHONPATH:-}
python3 "$REPO/bench/gpu_container/project.py" "$REPO" "$W/proj" "$PYVER" "${TORCH%%+*}" "$PORT" "$NUMPY" \
    matrix-fa4.yaml=gc.local/fa-images/flash-attn-4:fa4 || exit 1
cd "$W/proj" || exit 1
python3 -m fa_images plan --matrix matrix-fa4.yaml || exit 1
ID=$(python3 -m fa_images plan --matrix matrix-fa4.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
IMG=gc.local/fa-images/flash-attn-4:$ID
python3 -m fa_images build --matrix matrix-fa4.yaml --gpus devices --dry-run

phase "fa-images build --gpus devices: FlashAttention-4, its kernels compiled into the image"
started=$(date +%s)
python3 -m fa_images build --matrix matrix-fa4.yaml --gpus devices --log-dir logs --dist dist --report report.json
echo "fa-images build exited $? after $(($(date +%s) - started)) s"
grep -E "kernels compiled|hdim|first calls|GPU:|PASS|FAIL|WRONG" "logs/$ID.log" | cut -c1-300 | tail -n 60

phase "fa-images check on the node that pulled the image"
python3 -m fa_images check "$IMG" --gpus devices
echo "fa-images check exited $?"

docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
phase "done"
