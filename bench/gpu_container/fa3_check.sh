#!/bin/bash
# FlashAttention-3 in a container on a GPU machine, from its pinned source archive: one
# `fa-images build --gpus devices` of an FA3 entry trimmed to head dim 128 (fp16, bf16, forward
# and backward), its image's GPU check on this GPU; `inspect` of the abi3 wheel next to this
# machine's torch; the wheel installed here, outside any image, and checked again; then
# `fa-images check` on the image, as the node that pulls it would run it.
#
# Run from a copy of the repository, as root:  bash bench/gpu_container/fa3_check.sh WORK_DIR
# Needs what setup.sh needs, and .gpu-sdist/flash_attn_3-VERSION.tar.gz beside the repository
# (`fa-images source fa3 ... --out .gpu-sdist`).
set -u
NUMPY=$(python3 -c 'import numpy; print(numpy.__version__)')
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/rc}" "numpy==$NUMPY"

phase "project: the FA3 source archive, a compat override, one matrix"
export PYTHONPATH=$REPO:${PYTHONPATH:-}
python3 "$REPO/bench/gpu_container/project.py" "$REPO" "$W/proj" "$PYVER" "${TORCH%%+*}" "$PORT" "$NUMPY" \
    matrix-fa3.yaml=gc.local/fa-images/flash-attn-3:fa3 || exit 1
cd "$W/proj" || exit 1
python3 -m fa_images plan --matrix matrix-fa3.yaml || exit 1
ID=$(python3 -m fa_images plan --matrix matrix-fa3.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
IMG=gc.local/fa-images/flash-attn-3:$ID
python3 -m fa_images build --matrix matrix-fa3.yaml --gpus devices --dry-run

phase "fa-images build --gpus devices: FlashAttention-3 from its pinned archive, on this $(nvidia-smi --query-gpu=name --format=csv,noheader)"
started=$(date +%s)
python3 -m fa_images build --matrix matrix-fa3.yaml --gpus devices --log-dir logs --dist dist --report report.json
echo "fa-images build exited $? after $(($(date +%s) - started)) s"
grep -E "time by phase|compiling|GPU:|GPU code|PASS|FAIL|WRONG|✓|✕|wheel " "logs/$ID.log" | cut -c1-300 | tail -n 45
ls -la dist/

phase "inspect: the abi3 wheel next to this machine's torch"
python3 -m fa_images inspect dist/*.whl
echo "inspect exited $?"

phase "the same wheel installed outside any image, next to this machine's torch, and checked here"
rm -rf "$W/site" && python3 -m pip install --no-deps --no-index --target "$W/site" dist/*.whl "$W"/wheelhouse/ninja-*.whl >/dev/null
PYTHONPATH=$W/site:$PYTHONPATH python3 -m fa_images check
echo "native check exited $?"

phase "fa-images check on the node that pulled the image"
python3 -m fa_images check "$IMG" --gpus devices
echo "fa-images check exited $?"
python3 -m fa_images check "$IMG" --gpus devices --json
echo "fa-images check --json exited $?"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
phase "done"
