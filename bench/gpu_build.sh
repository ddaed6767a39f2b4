#!/usr/bin/env bash
# Native flash-attn build through fa-images' builder on a GPU machine, with the figures
# recorded in bench/gpu_build.md: wall time, peak memory, wheel size, inspect, GPU check.
#
#   bench/gpu_build.sh SDIST ARCHS OUTDIR [MORE WHEEL FLAGS, e.g. --max-jobs 16]
#
# Needs a CUDA torch, nvcc of the same major version, ninja and packaging; no network when
# SDIST is a local file. Runs for about 18 minutes per arch on 16 cores: start it detached
# (setsid nohup bench/gpu_build.sh ... &) and read OUTDIR/build.log.
set -uo pipefail
sdist=$1 archs=$2 out=$3
shift 3
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

{
  echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "abi", torch._C._GLIBCXX_USE_CXX11_ABI)'
  nvcc --version | tail -2
  start=$(date +%s)
  "$python" -m fa_images.builder wheel --sdist "$sdist" --archs "$archs" --out "$out/dist" --work-dir "$out/work" \
    --keep-work "$@"
  rc=$?
  echo "wheel rc=$rc wall_s=$(( $(date +%s) - start ))"
  # ninja's own record of every step's start and end (ms): the per-kernel compile times.
  find "$out/work" -name .ninja_log -exec cp {} "$out/ninja_log.txt" \;
  echo "peak_rss_gib=$(awk '{printf "%.1f", $1/1048576}' "$out/peak_rss_kb")"
  ls -l "$out"/dist/*.whl
  "$python" -m fa_images.builder inspect "$out"/dist/*.whl --archs "$archs"
  echo "inspect rc=$?"
  PYTHONPATH="$out/site" "$python" -m pip install --no-deps --no-index --target "$out/site" "$out"/dist/*.whl -q
  PYTHONPATH="$out/site" "$python" -m fa_images.builder check
  echo "check rc=$?"
} 2>&1 | tee "$out/build.log"
echo "done" > "$out/finished"
