#!/bin/bash
# One FlashAttention-3 wheel for two torches and two Pythons: built once by the builder, natively,
# next to this machine's torch (2.11, Python 3.12), and checked on this GPU there; then installed
# next to torch 2.12 on CPython 3.13 (neither of which it was built with) and checked again.
#
# Run from a copy of the repository:  bash bench/gpu_container/fa3_two_torches.sh WORK_DIR STAGE
# STAGE holds flash_attn_3-3.0.0.tar.gz (`fa-images source fa3`), torch 2.12.0's cp313 wheel and
# the NCCL it needs, nvidia-nccl-cu13 2.29.7 (in parts: torch.part.*, nccl.part.*), and
# cpython-3.13.tar.xz: a CPython 3.13 prefix made for /root/.cache/fa-images-tests/cpython-3.13
# (the tests' second Python, tests/toolchain.py). A second run reuses the wheel the first built.
set -u
W=${1:-/tmp/two}
STAGE=${2:-/tmp/stage}
phase() { echo; echo "=== $(date +%T) $*"; }
mkdir -p "$W"
REPO=$(pwd)
# shellcheck disable=SC2054  # the commas are the flags' lists
TRIM=(--fa3-head-dims 128 --fa3-dtypes bf16,fp16 --fa3-without split,paged_kv,append_kv,local,softcap,packgqa,sm80,hdim_diff)
PIN=$(python3 -c 'import sys; sys.path.insert(0, "."); from fa_images.config import compat; print(compat.load().releases["flash_attn_3"]["3.0.0"].sha256)')

phase "the FA3 wheel, built once next to this machine's torch"
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'
started=$(date +%s)
ls "$W"/dist/flash_attn_3-*.whl 2>/dev/null || PYTHONPATH=$REPO python3 -m fa_images.builder wheel --flash-attn 3.0.0 --sha256 "$PIN" --sources-dir "$STAGE" \
    "${TRIM[@]}" --out "$W/dist" --work-dir "$W/work" 2>&1 | grep -E "^\[fa-images\]|✓|✕|error" | cut -c1-250
echo "wheel exited ${PIPESTATUS[0]} after $(($(date +%s) - started)) s"
WHEEL=$(ls "$W"/dist/flash_attn_3-*.whl) || exit 1

phase "checked next to torch 2.11 on Python 3.12 (the torch it was built with)"
rm -rf "$W/site312" && python3 -m pip install -q --no-deps --target "$W/site312" "$WHEEL"
PYTHONPATH=$W/site312:$REPO python3 -m fa_images.builder check
echo "check (3.12, torch 2.11) exited $?"

phase "CPython 3.13 and torch 2.12, next to which it was not built"
mkdir -p /root/.cache/fa-images-tests && tar -C /root/.cache/fa-images-tests -xJf "$STAGE/cpython-3.13.tar.xz"
PY313=/root/.cache/fa-images-tests/cpython-3.13/bin/python3.13
cat "$STAGE"/torch.part.* > "$W/torch-2.12.0-cp313-cp313-manylinux_2_28_x86_64.whl"
cat "$STAGE"/nccl.part.* > "$W/nvidia_nccl_cu13-2.29.7-py3-none-manylinux_2_18_x86_64.whl"
rm -rf "$W/site313"
python3 -m pip install -q --no-deps --target "$W/site313" --python-version 3.13 --only-binary=:all: \
    "$W/torch-2.12.0-cp313-cp313-manylinux_2_28_x86_64.whl" "$W/nvidia_nccl_cu13-2.29.7-py3-none-manylinux_2_18_x86_64.whl" "$WHEEL"
# torch's pure-Python dependencies and NVIDIA's other CUDA 13 libraries (no Python ABI in either)
# from this machine's environment, at the versions here; NCCL is 2.12's own (2.11's lacks symbols).
SITE312=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for dep in typing_extensions.py sympy mpmath networkx jinja2 markupsafe fsspec filelock packaging; do
    [ -e "$SITE312/$dep" ] && ln -sfn "$SITE312/$dep" "$W/site313/$dep"
done
for lib in "$SITE312"/nvidia/*; do
    [ -e "$W/site313/nvidia/$(basename "$lib")" ] || ln -s "$lib" "$W/site313/nvidia/$(basename "$lib")"
done
"$PY313" -c 'import sys; print(sys.version)'
PYTHONPATH=$W/site313:$REPO "$PY313" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available())'
PYTHONPATH=$W/site313:$REPO "$PY313" -m fa_images.builder check
echo "check (3.13, torch 2.12) exited $?"
PYTHONPATH=$W/site313:$REPO "$PY313" -m fa_images.builder inspect "$WHEEL" --python "$PY313" 2>&1 | tail -14
phase "done"
