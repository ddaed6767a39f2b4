#!/bin/bash
# Real flash-attn, trimmed to the kernels the GPU check calls, in containers on a GPU machine:
# one `fa-images build --gpus devices` of two entries (archs 90 and archs 80, one torch), each
# image checked on this GPU; `build --wheels` around the archs-90 wheel; then `fa-images check`
# on the images, as the node that pulls them would run it.
#
# Run from a copy of the repository, as root:  bash bench/gpu_container/real_check.sh WORK_DIR [EXTRA...]
# Needs what setup.sh needs, and .gpu-sdist/flash_attn-VERSION.tar.gz beside the repository
# (`python bench/trim_sdist.py SDIST --gpu-check --out .gpu-sdist`). The runtime image's numpy is
# the one installed here, re-packed, pinned by the compat override (no index to fetch another).
set -u
NUMPY=$(python3 -c 'import numpy; print(numpy.__version__)')
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/rc}" "numpy==$NUMPY"

phase "project: the trimmed flash-attn sdist, a compat override, two matrices"
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
def matrix(image, archs):
    return {
        "image": image,
        "bases": {"devel": "gc.local/base:devel", "runtime": "gc.local/base:runtime", "python": "system"},
        "packages": {"index": None, "torch_index": None, "find_links": [f"http://127.0.0.1:{port}/"], "sdists": "sdists"},
        "build": {"network": "host"},
        "compat": "compat.yaml",
        "entries": [{"python": py, "torch": torch, "cuda": "13.0", "flash_attn": version, "archs": [a]} for a in archs],
    }
yaml.safe_dump(compat, open("compat.yaml", "w"), sort_keys=False)
# An entry's id names no archs, so each arch is an image of its own, in a matrix of its own.
yaml.safe_dump(matrix("gc.local/fa-images/flash-attn", ["90"]), open("matrix.yaml", "w"), sort_keys=False)
yaml.safe_dump(matrix("gc.local/fa-images/flash-attn-sm80", ["80"]), open("matrix-80.yaml", "w"), sort_keys=False)
yaml.safe_dump(matrix("gc.local/fa-images/from-wheel", ["90"]), open("matrix-wheels.yaml", "w"), sort_keys=False)
EOF
python3 -m fa_images plan --matrix matrix.yaml || exit 1
ID=$(python3 -m fa_images plan --matrix matrix.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
IMG90=gc.local/fa-images/flash-attn:$ID
IMG80=gc.local/fa-images/flash-attn-sm80:$ID
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)

for archs in 90 80; do
    if [ $archs = 90 ]; then m=matrix.yaml logs=logs; else m=matrix-$archs.yaml logs=logs-$archs; fi
    phase "fa-images build --gpus devices: archs $archs, on this $GPU"
    started=$(date +%s)
    python3 -m fa_images build --matrix $m --gpus devices --log-dir $logs --dist dist-$archs --report report-$archs.json
    echo "fa-images build exited $? after $(($(date +%s) - started)) s"
    grep -E "time by phase|GPU:|PASS|FAIL|WRONG|ARCH|cannot run|kernels" "$logs/$ID.log" | cut -c1-300 | tail -n 25
    ls -la dist-$archs/
done

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
echo "fa-images check (archs 80) exited $?"
python3 -m fa_images check "$IMG90" --gpus none
echo "fa-images check --gpus none exited $?"

phase "import torch in the runtime image: what it prints"
docker run --rm "$IMG90" python -c "import torch; print(torch.__version__)"
echo "exit $?"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}'
df -h "$W" | sed 1d
phase "done"
