#!/usr/bin/env bash
# flash-attn's flash_api.cpp and one kernel compiled against a torch wheel's headers, twice:
# with the flags flash-attn's setup.py writes (-std=c++17) and with the flags fa-images'
# setup shim makes of them (the C++ standard that torch needs). Figures: bench/cxx_standard.md.
#
#   bench/cxx_standard.sh TORCH_WHEEL FLASH_ATTN_SDIST OUTDIR [KERNEL]
#
# TORCH_WHEEL: a torch wheel file (only torch/include and torch/utils/cpp_extension.py are
# unpacked from it; it is never installed). FLASH_ATTN_SDIST: flash-attn 2.8.x's sdist.
# KERNEL defaults to flash_fwd_hdim32_fp16_sm80.cu. Needs g++, nvcc ($CUDA_HOME or
# /usr/local/cuda), a Python with setuptools and packaging, no GPU and no network. The kernel
# compile runs minutes on a few cores; it is started under nice.
set -uo pipefail
wheel=$1 sdist=$2 out=$3 kernel=${4:-flash_fwd_hdim32_fp16_sm80.cu}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out/torch" "$out/src" "$out/obj"

unzip -q -o "$wheel" 'torch/include/*' torch/utils/cpp_extension.py torch/version.py -d "$out/torch"
tar -xzf "$sdist" -C "$out/src"
src=$(find "$out/src" -mindepth 1 -maxdepth 1 -type d | head -1)
torch_version=$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$out/torch/torch/version.py")

# The two flag sets, from setup.py's own lists: as written, and through the shim.
PYTHONPATH=$repo "$python" - "$src/setup.py" "$torch_version" "$out/torch/torch/utils/cpp_extension.py" \
  > "$out/flags.sh" <<'EOF'
import ast, shlex, sys
from pathlib import Path
from setuptools import Extension
from fa_images.builder.settings import BuildSettings
from fa_images.builder.setup_shim import correct_extension, torch_default_standard

setup_py, torch_version, cpp_extension = sys.argv[1], sys.argv[2], Path(sys.argv[3]).read_text()
lists = {}
for node in sorted(ast.walk(ast.parse(Path(setup_py).read_text())), key=lambda n: getattr(n, "lineno", 0)):
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and isinstance(node.targets[0], ast.Name):
        if node.targets[0].id in ("nvcc_flags", "compiler_c17_flag"):  # the first: later ones are Windows'
            lists.setdefault(node.targets[0].id, ast.literal_eval(node.value))
# What setup.py hands the extension for FLASH_ATTN_CUDA_ARCHS=80 and NVCC_THREADS=1.
cxx = lists["compiler_c17_flag"]
nvcc = lists["nvcc_flags"] + ["-gencode", "arch=compute_80,code=sm_80", "--threads", "1"]
ext = Extension("flash_attn_2_cuda", sources=[], extra_compile_args={"cxx": list(cxx), "nvcc": list(nvcc)})
settings = BuildSettings(
    flash_attn="2.8.3", python="3", torch=torch_version, cuda="13.0", cxx11_abi=True, archs=("80",), ptx=False,
    max_jobs=1, nvcc_threads=1, local_version=None, source_dir="", sdist="", sha256="", honours_cuda_archs_env=True,
)
line = correct_extension(ext, settings, torch_default_standard(cpp_extension))
print(f"# shim: {line}")
print(f"setup_cxx=({shlex.join(cxx)})")
print(f"setup_nvcc=({shlex.join(nvcc)})")
print(f"shim_cxx=({shlex.join(ext.extra_compile_args['cxx'])})")
print(f"shim_nvcc=({shlex.join(ext.extra_compile_args['nvcc'])})")
EOF
# shellcheck source=/dev/null
. "$out/flags.sh"
inc=(-I"$src/csrc/flash_attn" -I"$src/csrc/flash_attn/src" -I"$src/csrc/cutlass/include"
     -isystem "$out/torch/torch/include" -isystem "$out/torch/torch/include/torch/csrc/api/include"
     -isystem "$cuda/include" -isystem "$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')")
# What torch's BuildExtension puts around extra_compile_args in its ninja file.
ext_defs=(-DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=flash_attn_2_cuda)
nvcc_common=(-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
             -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr --compiler-options -fPIC)

run() {  # name, then the command; one line of results per compile
  local name=$1 start rc
  shift
  start=$(date +%s.%N)
  nice "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf '%s rc=%d seconds=%.1f first_error=%s\n' "$name" "$rc" "$(echo "$(date +%s.%N) - $start" | bc)" \
    "$(grep -m1 -E 'error' "$out/$name.log" | cut -c1-200)"
}

{
  echo "torch $torch_version (headers from $(basename "$wheel")), $(basename "$sdist"), kernel $kernel"
  echo "g++: $(g++ --version | head -1); nvcc: $("$cuda/bin/nvcc" --version | tail -1); $(nproc) CPUs"
  head -1 "$out/flags.sh"
  for set in setup shim; do
    cxx_var="${set}_cxx[@]" nvcc_var="${set}_nvcc[@]"
    echo "$set cxx flags: ${!cxx_var}"
    echo "$set nvcc flags: ${!nvcc_var}"
    run "$set-flash_api" g++ -fPIC "${inc[@]}" -c "$src/csrc/flash_attn/flash_api.cpp" -o "$out/obj/$set-flash_api.o" \
      "${!cxx_var}" "${ext_defs[@]}"
    run "$set-kernel" "$cuda/bin/nvcc" "${inc[@]}" -c "$src/csrc/flash_attn/src/$kernel" -o "$out/obj/$set-kernel.o" \
      "${nvcc_common[@]}" "${!nvcc_var}" "${ext_defs[@]}"
  done
} | tee "$out/results.txt"
