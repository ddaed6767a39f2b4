#!/bin/bash
# FlashAttention-4's kernels compiled ahead of time with no GPU, then run on this GPU with none
# compiled at the first call; and the same grid cold, for the first calls' time without a cache.
# Natively, next to this machine's torch (installed into its environment, which is the machine's
# own: FA4's DSL adds its packages through a .pth file, so PYTHONPATH cannot carry it): the
# builder's own `fa4-cache` and `check`.
#
# Run from a copy of the repository:  bash bench/gpu_container/fa4_native.sh WORK_DIR WHEELS_DIR
# WHEELS_DIR: flash-attn-4 and its pinned set, built for this machine's Python (the project's
# README for FA4 names them), nothing of torch's.
set -u
W=${1:-/tmp/fa4}
WHEELS=${2:-$W/wheels}
phase() { echo; echo "=== $(date +%T) $*"; }
mkdir -p "$W"
PYTHONPATH=$(pwd)
export PYTHONPATH

phase "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_properties(0).multi_processor_count, "SMs")'

phase "FA4's pinned set from $WHEELS, next to this machine's torch"
python3 -m pip install -q --no-deps --no-index "$WHEELS"/*.whl || exit 1
python3 -m pip list 2>/dev/null | grep -iE "flash|cutlass|quack|tvm|dlpack|torch |triton"
PY=python3

phase "compile the grid ahead, with no GPU visible: fake tensors, target H100 (sm_90a, 132 SMs)"
rm -rf "$W/cache"
started=$(date +%s)
CUDA_VISIBLE_DEVICES="" $PY -m fa_images.builder fa4-cache --out "$W/cache" --target H100:9.0:132 2>&1 | grep -vE "Warning|exe_args|return super|data_ptr"
echo "fa4-cache exited ${PIPESTATUS[0]} after $(($(date +%s) - started)) s"
find "$W/cache" -type f | wc -l; du -sh "$W/cache"

phase "a new process on this GPU, the cache of the grid: the check's first calls"
FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$W/cache $PY -m fa_images.builder check 2>&1 | grep -vE "Warning|exe_args|return super"
echo "check (warm) exited ${PIPESTATUS[0]}"

phase "the same grid cold: an empty cache that declares it (every first call compiles: expected to FAIL on that count)"
rm -rf "$W/cold" && mkdir -p "$W/cold" && cp "$W/cache/fa-images-grid.json" "$W/cold/"
FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$W/cold $PY -m fa_images.builder check 2>&1 | grep -vE "Warning|exe_args|return super"
echo "check (cold) exited ${PIPESTATUS[0]}"

phase "the warm cache again, a second new process"
FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$W/cache $PY -m fa_images.builder check 2>&1 | grep -E "first calls|PASS|FAIL"
phase "done"
