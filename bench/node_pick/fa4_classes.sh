#!/bin/bash
# FlashAttention-4's kernels compiled ahead with no GPU, for one GPU of every arch class its code
# runs on, into one cache: each target's run and time, and the GPUs the cache records.
# Run from a copy of the repository:  bash bench/node_pick/fa4_classes.sh PYTHON FA4_SITE WORK_DIR
# PYTHON: an interpreter with torch (a CUDA build: the fake tensors need its device guard);
# FA4_SITE: a site dir with flash-attn-4 and its pinned set (tests/toolchain.py's fa4_site).
set -u
PY=$1; SITE=$2; W=${3:-/tmp/fa4-classes}
rm -rf "$W" && mkdir -p "$W"
GRID=(--head-dims 128 --kv-heads 16 --causal true --modes "train,infer" --seqlen 1024)
boot="import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); runpy.run_module('fa_images.builder', run_name='__main__')"
for target in A100:8.0:108 L4:8.9:58 H100:9.0:132 B200:10.0:148 RTXPRO6000:12.0:188; do
  started=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES="" PYTHONPATH=$PWD "$PY" -c "$boot" "$SITE" fa4-cache --out "$W/cache" --target "$target" "${GRID[@]}" 2>&1 \
    | grep -E "kernels in the cache|left out|^  "
  echo "$target: $(echo "$(date +%s.%N) - $started" | bc | cut -c1-5) s (the process, its imports included)"
done
cat "$W/cache/fa-images-targets.json"
