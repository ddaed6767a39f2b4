#!/bin/bash
# Real flash-attn, trimmed to the kernels the GPU check calls, in containers on a GPU machine:
# one `fa-images build --gpus devices` of two entries (archs 90 and archs $OTHER, 80 unless set:
# one torch), each image checked on this GPU; `build --wheels` around the archs-90 wheel; then
# `fa-images check` on the images, as the node that pulls them would run it.
#
# Run from a copy of the repository, as root:  bash bench/gpu_container/real_check.sh WORK_DIR [EXTRA...]
# Needs what setup.sh needs, and .gpu-sdist/flash_attn-VERSION.tar.gz beside the repository
# (`python bench/trim_sdist.py SDIST --gpu-check --out .gpu-sdist`). The runtime image's numpy is
# the one installed here, re-packed, pinned by the compat override (no index to fetch another).
set -u
OTHER=${OTHER:-80}
NUMPY=$(python3 -c 'import numpy; print(numpy.__version__)')
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/rc}" "numpy==$NUMPY"

phase "project: the trimmed flash-attn sdist, a compat override, two matrices"
export PYTHONPATH=$REPO:${PYTHONPATH:-}
# The sdist, compat.yaml and one matrix per FILE=IMAGE:ARCH[:BUILDER] (an entry's id names no archs).
python3 "$REPO/bench/gpu_container/project.py" "$REPO" "$W/proj" "$PYVER" "${TORCH%%+*}" "$PORT" "$NUMPY" \
    matrix.yaml=gc.local/fa-images/flash-attn:90 "matrix-$OTHER.yaml=gc.local/fa-images/flash-attn-sm$OTHER:$OTHER" \
    matrix-wheels.yaml=gc.local/fa-images/from-wheel:90 || exit 1
cd "$W/proj" || exit 1
python3 -m fa_images plan --matrix matrix.yaml || exit 1
ID=$(python3 -m fa_images plan --matrix matrix.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
IMG90=gc.local/fa-images/flash-attn:$ID
IMG80=gc.local/fa-images/flash-attn-sm$OTHER:$ID
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)

for archs in 90 "$OTHER"; do
    if [ "$archs" = 90 ]; then m=matrix.yaml logs=logs; else m="matrix-$archs.yaml" logs="logs-$archs"; fi
    phase "fa-images build --gpus devices: archs $archs, on this $GPU"
    started=$(date +%s)
    python3 -m fa_images build --matrix "$m" --gpus devices --log-dir "$logs" --dist "dist-$archs" --report "report-$archs.json"
    echo "fa-images build exited $? after $(($(date +%s) - started)) s"
    grep -E "time by phase|GPU:|PASS|FAIL|WRONG|ARCH|cannot run|kernels" "$logs/$ID.log" | cut -c1-300 | tail -n 25
    ls -la "dist-$archs/"
done

phase "fa-images inspect: the archs-$OTHER wheel, on this GPU"
python3 -m fa_images inspect dist-"$OTHER"/*.whl
echo "fa-images inspect exited $?"

phase "build --wheels around the archs-90 wheel (no compile)"
started=$(date +%s)
python3 -m fa_images build --matrix matrix-wheels.yaml --wheels dist-90/ --gpus devices --log-dir logs-wheels --report report-wheels.json
echo "fa-images build --wheels exited $? after $(($(date +%s) - started)) s"

phase "fa-images check on the node that pulled the images"
python3 -m fa_images check "$IMG90" "$IMG80" --gpus devices
echo "fa-images check (both) exited $?"
python3 -m fa_images check "$IMG90" --gpus devices --json
echo "fa-images check --json (archs 90) exited $?"
python3 -m fa_images check "$IMG80" --gpus devices
echo "fa-images check (archs $OTHER) exited $?"
python3 -m fa_images check "$IMG90" --gpus none
echo "fa-images check --gpus none exited $?"

phase "import torch in the runtime image: what it prints"
docker run --rm "$IMG90" python -c "import torch; print(torch.__version__)"
echo "exit $?"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
df -h "$W" | sed 1d
phase "done"
