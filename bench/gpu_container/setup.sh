#!/bin/bash
# Sourced by device.sh and real_check.sh: on a GPU machine that has no Docker, no registry and
# no package index, a private Docker Engine from Debian's packages, base images made from the
# machine's own root file system (its CUDA toolkit and Python), and a wheelhouse re-packed from
# its installed torch, served on 127.0.0.1:$PORT.
#
#   source bench/gpu_container/setup.sh WORK_DIR [EXTRA_REQUIREMENT...]
#
# EXTRA_REQUIREMENT: installed distributions re-packed into the wheelhouse beside torch.
# Needs beside the repository: .gpu-engine/ (dockerd, containerd, runc, docker from Debian
# bookworm's docker.io, containerd and runc packages, unpacked with dpkg -x, as engine.tar.xz,
# plus libdevmapper), .gpu-wheelhouse/ (the build tools' wheels at compat.yaml's pins, and
# einops at its runtime_deps pin: the machine's own einops may be another version) and the
# docker SDK importable.
# Leaves W, REPO, SOCK, PORT, PYVER, TORCH and DOCKER_HOST set, and the function phase.
set -u
W=${1:-/tmp/gc}
EXTRA=("${@:2}")
# shellcheck disable=SC2034  # read by the scripts that source this one
REPO=$(pwd)
SOCK=unix:///run/gc/docker.sock
PORT=38917
mkdir -p "$W" /run/gc
phase() { echo; echo "=== $(date +%T) $*"; }
export DOCKER_HOST=$SOCK

phase "machine"
uname -r
nproc; free -g | head -2
df -h / /tmp | sed 1d
findmnt -no FSTYPE,SOURCE -T /tmp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ls -la /dev/nvidia* 2>&1
ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml\.so' || echo "libcuda: not in the loader cache"
PYBASE=$(python3 -c 'import sys; print(sys.base_prefix)')
PYVER=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2]); ')
TORCH=$(python3 -c 'import torch; print(torch.__version__)')
echo "python3 $(command -v python3) base_prefix=$PYBASE version=$PYVER torch=$TORCH"
"$PYBASE/bin/python$PYVER" -c 'import ensurepip, venv; print("ensurepip:", ensurepip.version())' 2>&1
readlink -f /usr/local/cuda; nvcc --version | tail -2
du -sh /usr /usr/local/cuda-* /opt 2>/dev/null
command -v useradd

phase "engine: dockerd from Debian bookworm's packages"
if [ ! -x "$W/engine/usr/sbin/dockerd" ]; then
    mkdir -p "$W/engine/lib" && tar -C "$W/engine" -xJf .gpu-engine/engine.tar.xz
    cp .gpu-engine/libdevmapper.so.1.02.1 "$W/engine/lib/"
fi
export PATH=$W/engine/usr/bin:$W/engine/usr/sbin:$PATH
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup || echo "cgroup2 mount refused"
findmnt -no FSTYPE /sys/fs/cgroup
start_dockerd() {  # driver data-root
    echo '{}' >/run/gc/daemon.json
    LD_LIBRARY_PATH=$W/engine/lib setsid nohup dockerd --data-root "$2" --exec-root /run/gc/exec \
        --pidfile /run/gc/docker.pid -H $SOCK --config-file /run/gc/daemon.json --storage-driver "$1" \
        --bridge=none --iptables=false --ip-masq=false >"$W/dockerd-$1.log" 2>&1 &
    local pid=$!
    for _ in $(seq 60); do
        docker version >/dev/null 2>&1 && return 0
        kill -0 $pid 2>/dev/null || break
        sleep 1
    done
    echo "dockerd ($1) did not come up; its log:"; tail -20 "$W/dockerd-$1.log"
    kill $pid 2>/dev/null; sleep 1
    return 1
}
if ! docker version >/dev/null 2>&1; then
    start_dockerd overlay2 "$W/docker" || { echo "ENGINE FAILED"; exit 1; }
fi
docker version --format 'Docker Engine {{.Server.Version}} (API {{.Server.APIVersion}}), containerd, runc up'
docker info --format 'storage {{.Driver}}, cgroup v{{.CgroupVersion}} ({{.CgroupDriver}}), runtimes {{json .Runtimes}}'

phase "base images from this machine's root file system (no registry here)"
mkdir -p "$W/skel"/{tmp,root,home,run,opt,proc,sys,dev} && chmod 1777 "$W/skel/tmp"
mapfile -t PARTS < <(cd / && ls -d etc usr var bin sbin lib lib64 2>/dev/null)
case "$PYBASE" in /usr | /usr/*) ;; *) PARTS+=("${PYBASE#/}") ;; esac
ENVPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The NVIDIA driver (libcuda, libnvidia-*) is left out on purpose: it must come from the host
# at run time, as on any GPU machine. So are caches, docs and the CUDA toolkit's big libraries
# that a torch extension does not link (their headers stay).
COMMON=(--exclude=usr/local/nvidia --exclude='libcuda.so*' --exclude='libcudadebugger*' --exclude='libnvidia-*'
    --exclude=var/cache --exclude=var/log --exclude=var/lib/docker --exclude=usr/share/doc --exclude=usr/share/man
    --exclude='__pycache__' --exclude=etc/hostname --exclude=etc/resolv.conf --exclude=etc/hosts)
make_runtime() {
    tar --numeric-owner -C "$W/skel" -c "${COMMON[@]}" --exclude='usr/local/cuda*' . -C / "${PARTS[@]}" 2>"$W/tar-runtime.err" |
        docker import --change "ENV PATH=$PYBASE/bin:$ENVPATH" - gc.local/base:runtime-rootfs
    # This root file system (Ubuntu 24.04) has a user with uid 1000, as ubuntu:24.04 has ('ubuntu');
    # the template's `useradd --uid 1000 flash` needs that uid free.
    printf 'FROM gc.local/base:runtime-rootfs\nRUN getent passwd 1000 | cut -d: -f1 | xargs -r userdel\n' |
        docker build -q -t gc.local/base:runtime -
}
make_devel() {
    tar --numeric-owner -C "$W/skel" -c "${COMMON[@]}" --exclude='usr/local/cuda*/nsight*' --exclude='lib*_static.a' \
        --exclude='libnpp*' --exclude='libnvjpeg*' --exclude='libcufft*' --exclude='libcusolver*' \
        --exclude='libcusparse*' --exclude='libcublas*' --exclude='libcurand*' . -C / "${PARTS[@]}" 2>"$W/tar-devel.err" |
        docker import --change "ENV PATH=/usr/local/cuda/bin:$PYBASE/bin:$ENVPATH" --change "ENV CUDA_HOME=/usr/local/cuda" - gc.local/base:devel
}
make_wheelhouse() {
    rm -rf "$W/wheelhouse" && mkdir -p "$W/wheelhouse" && cp .gpu-wheelhouse/*.whl "$W/wheelhouse/"
    python3 bench/gpu_container/repack_wheels.py "$W/wheelhouse" "torch==${TORCH%%+*}" "${EXTRA[@]}"
}
started=$(date +%s)
have() { docker image inspect "$1" >/dev/null 2>&1; }
have gc.local/base:runtime || make_runtime >"$W/import-runtime.log" 2>&1 &
a=$!
have gc.local/base:devel || make_devel >"$W/import-devel.log" 2>&1 &
b=$!
[ -f "$W/wheelhouse.done" ] || { make_wheelhouse >"$W/wheelhouse.log" 2>&1 && touch "$W/wheelhouse.done"; }
wait $a $b  # not a bare `wait`: dockerd is a child of this shell too
echo "bases and wheelhouse in $(($(date +%s) - started)) s"
cat "$W"/import-*.log "$W/wheelhouse.log" 2>/dev/null; tail -n 3 "$W"/tar-*.err
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep base
du -sh "$W/wheelhouse"
[ -f "$W/wheelhouse.done" ] || { echo "WHEELHOUSE FAILED"; exit 1; }
(cd "$W/wheelhouse" && setsid nohup python3 -m http.server $PORT --bind 127.0.0.1 >"$W/http.log" 2>&1 &)

