#!/bin/bash
# On a real GPU node: what uv's wheel variants, pip and `fa-images pick --here` give it from a dist/
# of two GPU classes (sm80, sm90), with nothing forced: uv's NVIDIA provider reads the node's own
# driver and GPU. Then FlashAttention-4's kernels compiled ahead with no GPU for this node's class
# and for another (RTX PRO 6000, sm_120a), and the check of each cache here.
#
# Run from a copy of the repository:  bash bench/node_pick/node_pick.sh WORK_DIR UV_WHEEL [FA4_WHEELS_DIR]
set -u
W=${1:-/tmp/pick}
UV_WHEEL=$2
FA4=${3:-}
phase() { echo; echo "=== $(date +%T) $*"; }
export PYTHONPATH=$PWD
mkdir -p "$W"

phase "node"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'

phase "a dist/ of two classes, made here (nvcc $(nvcc --version | tail -1))"
rm -rf "$W/dist" && python3 bench/node_pick/two_class_dist.py "$W/dist" || exit 1
find "$W/dist" -name '*.whl' | sort

python3 -m zipfile -e "$UV_WHEEL" "$W/uvw" && chmod +x "$W"/uvw/uv-*.data/scripts/uv
UV=$(ls "$W"/uvw/uv-*.data/scripts/uv)
"$UV" --version
(cd "$W/dist" && exec python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1) &
server=$!
sleep 1
unset UV_INDEX_URL UV_EXTRA_INDEX_URL NV_VARIANT_PROVIDER_FORCE_SM_ARCH NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION

phase "uv --preview-features wheel-variants from the one index, nothing forced"
rm -rf "$W/node" && python3 -m venv --without-pip "$W/node"
UV_CACHE_DIR=$W/uvcache "$UV" pip install --no-config --python "$W/node/bin/python" --no-deps \
  --preview-features wheel-variants --index-url http://127.0.0.1:8765/simple/ flash-attn -v 2>&1 \
  | grep -iE "variant|selecting|installed|error|warn" | cut -c1-300
echo "uv exited ${PIPESTATUS[0]}"
site=$(ls -d "$W"/node/lib/python3*/site-packages)
cat "$site"/flash_attn-*.dist-info/variant.json 2>/dev/null | python3 -c 'import json,sys; print("installed variant:", list(json.load(sys.stdin)["variants"]))'
cuobjdump --list-elf "$site"/flash_attn_2_cuda*.so 2>&1 | sed 's/^/  /'

phase "pip from the one index (it knows no variants: it must not take another class's wheel)"
rm -rf "$W/plain" && python3 -m venv --without-pip "$W/plain"
python3 -m pip --isolated --python "$W/plain/bin/python" install --no-deps --index-url http://127.0.0.1:8765/simple/ flash-attn 2>&1 | tail -2
echo "pip exited ${PIPESTATUS[0]}"

phase "fa-images pick --here --dist"
python3 -m fa_images pick --here --dist "$W/dist" --index-url http://127.0.0.1:8765/
echo "pick exited $?"
kill $server

if [ -n "$FA4" ]; then
  phase "FA4's set from $FA4, next to this machine's torch"
  python3 -m pip install -q --no-deps --no-index "$FA4"/*.whl || exit 1
  GRID=(--head-dims 128 --kv-heads "16,4" --causal "true,false" --modes "train,infer" --seqlen 1024)
  for target in H100:9.0:132 RTXPRO6000:12.0:188; do
    phase "fa4-cache --target $target, no GPU visible"
    rm -rf "$W/cache-${target%%:*}"
    started=$(date +%s)
    CUDA_VISIBLE_DEVICES="" python3 -m fa_images.builder fa4-cache --out "$W/cache-${target%%:*}" --target "$target" "${GRID[@]}" 2>&1 \
      | grep -vE "Warning|exe_args|return super|data_ptr"
    echo "fa4-cache exited ${PIPESTATUS[0]} after $(($(date +%s) - started)) s"
  done
  for name in H100 RTXPRO6000; do
    phase "check on this GPU with the $name cache"
    FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$W/cache-$name python3 -m fa_images.builder check 2>&1 \
      | grep -vE "Warning|exe_args|return super"
    echo "check exited ${PIPESTATUS[0]}"
  done
fi
phase "done"
