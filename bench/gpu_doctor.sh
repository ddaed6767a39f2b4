#!/usr/bin/env bash
# `fa-images doctor` on a GPU machine, next to a wheel the builder made there.
#
#   bench/gpu_doctor.sh SDIST SHA256 ARCH WHEELS OUT
#
# SDIST is built for ARCH by the builder (`python -m fa_images.builder wheel`), installed,
# and then `doctor` (text and --json) reads the machine and that installed flash-attn.
# WHEELS holds the host package's own dependencies (pyyaml, jinja2, docker, packaging) for a
# machine without an index; they go into a directory on PYTHONPATH of the Python that has torch.
set -euo pipefail
sdist=$1 sha=$2 arch=$3 wheels=$4 out=$5
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
py=$(command -v python || command -v python3)
"$py" -m pip install -q --no-index --find-links "$wheels" --target /tmp/doctor-deps pyyaml jinja2 docker packaging
export PYTHONPATH=$repo:/tmp/doctor-deps
{ time "$py" -m fa_images.builder wheel --sdist "$sdist" --sha256 "$sha" --archs "$arch" --out /tmp/doctor-dist; } \
  > "$out/wheel.log" 2>&1
"$py" -m pip install -q --no-deps --target /tmp/doctor-fa /tmp/doctor-dist/flash_attn-*.whl
export PYTHONPATH=$PYTHONPATH:/tmp/doctor-fa
status=0
"$py" -m fa_images doctor > "$out/doctor.txt" 2>&1 || status=$?
"$py" -m fa_images doctor --json > "$out/doctor.json" 2> "$out/doctor-json.err" || true
echo "doctor exit: $status" >> "$out/doctor.txt"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/nvidia-smi.csv" 2>&1 || true
