#!/usr/bin/env bash
# One compile group, natively on a GPU machine: flash-attn built twice through the builder with
# one compiler cache, as two Pythons of a group are built. The first build is P1 (its wall time
# against the floor of its own ninja steps); the second is what each further Python of the group
# costs (P2). Figures and the command in bench/compile_groups.md.
#
#   bench/compile_group.sh SDIST ARCHS OUTDIR
#
# Needs a CUDA torch, nvcc of the same major version, ninja, packaging and sccache on PATH; no
# network when SDIST is a local file. Start it detached and read OUTDIR/build.log.
set -uo pipefail
sdist=$1 archs=$2 out=$3
mkdir -p "$out"
python=${PYTHON:-python3}

# Peak memory of the whole build: the sum of every process's RSS, sampled each 2 s.
( peak=0
  while sleep 2; do
    kb=$(awk '/^VmRSS/ {s += $2} END {print s + 0}' /proc/[0-9]*/status 2>/dev/null)
    [ "$kb" -gt "$peak" ] && peak=$kb && echo "$peak" > "$out/peak_rss_kb"
  done ) &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

build() {
  local name=$1 start rc
  start=$(date +%s)
  "$python" -m fa_images.builder wheel --sdist "$sdist" --archs "$archs" --out "$out/$name" \
    --work-dir "$out/work" --keep-work --compiler-cache "$out/cache"
  rc=$?
  echo "$name: wheel rc=$rc wall_s=$(( $(date +%s) - start ))"
  find "$out/work" -name .ninja_log -exec cp {} "$out/$name/ninja_log.txt" \;
  # The next build must find the same (fixed) work dir path free.
  rm -rf "$out/work"
}

{
  echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
  nvcc --version | tail -1
  sccache --version
  build first
  build second
  echo "peak_rss_gib=$(awk '{printf "%.1f", $1/1048576}' "$out/peak_rss_kb")"
  echo "cache: $(du -sh "$out/cache" | cut -f1)"
  echo "--- first build's steps against their floor"
  "$python" bench/ninja_costs.py "$out/first/ninja_log.txt" "$(nproc)"
  echo "--- second build's steps"
  "$python" bench/ninja_costs.py "$out/second/ninja_log.txt" "$(nproc)" | head -3
  # The wheel whose kernels all came from the cache: sound, and right on the GPU.
  "$python" -m fa_images.builder inspect "$out"/second/*.whl --archs "$archs"
  echo "inspect rc=$?"
  PYTHONPATH="$out/site" "$python" -m pip install --no-deps --no-index --target "$out/site" "$out"/second/*.whl -q
  PYTHONPATH="$out/site" "$python" -m fa_images.builder check
  echo "check rc=$?"
} 2>&1 | tee "$out/build.log"
echo "done" > "$out/finished"
